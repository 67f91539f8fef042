package tfrt_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/tfrt"
)

// machine is the device list TensorFlow reports for a process that sees
// cpus CPUs and gpus GPUs.
func machine(cpus, gpus int) []tfrt.Device {
	var out []tfrt.Device
	for i := range cpus {
		out = append(out, tfrt.Device{Name: fmt.Sprintf("/job:localhost/replica:0/task:0/device:CPU:%d", i), Type: "CPU"})
	}
	for i := range gpus {
		out = append(out, tfrt.Device{Name: fmt.Sprintf("/job:localhost/replica:0/task:0/device:GPU:%d", i), Type: "GPU", Memory: 80 << 30})
	}
	return out
}

func gpu(i int) string { return fmt.Sprintf("/job:localhost/replica:0/task:0/device:GPU:%d", i) }
func cpu(i int) string { return fmt.Sprintf("/job:localhost/replica:0/task:0/device:CPU:%d", i) }

// A strategy's replicas go on every GPU by default, on CPU:0 on a machine
// without one, on logical CPUs when asked (even where GPUs exist), and on
// the devices a user names, by any of TensorFlow's spellings.
func TestReplicaDevicesChoice(t *testing.T) {
	for _, c := range []struct {
		name      string
		available []tfrt.Device
		named     []string
		logical   int
		want      []string
	}{
		{"eight GPUs", machine(1, 8), nil, 0, []string{gpu(0), gpu(1), gpu(2), gpu(3), gpu(4), gpu(5), gpu(6), gpu(7)}},
		{"one GPU", machine(1, 1), nil, 0, []string{gpu(0)}},
		{"no GPU", machine(1, 0), nil, 0, []string{cpu(0)}},
		{"logical CPUs beside GPUs", machine(4, 2), nil, 4, []string{cpu(0), cpu(1), cpu(2), cpu(3)}},
		{"two of four logical CPUs", machine(4, 0), nil, 2, []string{cpu(0), cpu(1)}},
		{"named, short", machine(1, 4), []string{"/gpu:3", "/gpu:1"}, 0, []string{gpu(3), gpu(1)}},
		{"named, full and mixed", machine(2, 2), []string{gpu(1), "/device:CPU:1", "GPU:0"}, 0, []string{gpu(1), cpu(1), gpu(0)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := tfrt.ReplicaDevices(c.available, c.named, c.logical)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

// A device that does not exist, one named twice, a name without a type
// and more logical CPUs than the session has are errors that say what
// exists.
func TestReplicaDevicesRefusals(t *testing.T) {
	for _, c := range []struct {
		name    string
		named   []string
		logical int
		want    []string
	}{
		{"missing GPU", []string{"/gpu:0", "/gpu:2"}, 0, []string{"device 1", `"/gpu:2" does not exist`, gpu(1), cpu(0)}},
		{"twice", []string{"/gpu:1", gpu(1)}, 0, []string{"device 1", "appears twice", "device 0 is", "each replica needs its own device"}},
		{"no type", []string{"/job:localhost"}, 0, []string{`"/job:localhost"`, "expected a device type and index"}},
		{"unparsable", []string{"/gpu:x"}, 0, []string{`"/gpu:x"`, "expected a number"}},
		{"too many logical CPUs", nil, 3, []string{"3 logical CPUs asked for, the session has 1", cpu(0)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := tfrt.ReplicaDevices(machine(1, 2), c.named, c.logical)
			require.Error(t, err)
			for _, w := range c.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}
