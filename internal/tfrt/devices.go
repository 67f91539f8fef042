package tfrt

import (
	"fmt"
	"strconv"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
)

// Device is one device a session can place ops on.
type Device struct {
	Name   string // full name, e.g. /job:localhost/replica:0/task:0/device:CPU:1
	Type   string // CPU, GPU, …
	Memory int64  // bytes, as TensorFlow reports them
}

// ListDevices lists the devices of a session.
func ListDevices(s *tf.Session) ([]Device, error) {
	ds, err := s.ListDevices()
	if err != nil {
		return nil, Classify("list devices", err)
	}
	out := make([]Device, len(ds))
	for i, d := range ds {
		out[i] = Device{Name: d.Name, Type: d.Type, Memory: d.MemoryLimitBytes}
	}
	return out, nil
}

// LocalDevices opens a session on an empty graph with opts and lists its
// devices: the devices this process would place ops on.
func LocalDevices(opts ...ConfigOption) ([]Device, error) {
	so, err := SessionOptions("", opts...)
	if err != nil {
		return nil, err
	}
	s, err := tf.NewSession(tf.NewGraph(), so)
	if err != nil {
		return nil, Classify("open session", err)
	}
	defer s.Close()
	return ListDevices(s)
}

// DeviceSpec is a parsed TensorFlow device name.
type DeviceSpec struct {
	Job     string // "" when not given
	Replica int    // -1 when not given
	Task    int    // -1 when not given
	Type    string // CPU, GPU; "" when not given
	Index   int    // -1 when not given
}

// ParseDevice parses names such as "/job:worker/replica:0/task:1/device:GPU:0",
// "/device:CPU:1", "/cpu:0" and "GPU:1".
func ParseDevice(name string) (DeviceSpec, error) {
	d := DeviceSpec{Replica: -1, Task: -1, Index: -1}
	rest := strings.TrimPrefix(name, "/")
	if rest == "" {
		return d, fmt.Errorf("device %q: empty name", name)
	}
	for _, part := range strings.Split(rest, "/") {
		k, v, ok := strings.Cut(part, ":")
		if !ok {
			return d, fmt.Errorf("device %q: part %q, expected key:value", name, part)
		}
		var err error
		switch strings.ToLower(k) {
		case "job":
			d.Job = v
		case "replica":
			d.Replica, err = strconv.Atoi(v)
		case "task":
			d.Task, err = strconv.Atoi(v)
		case "device":
			t, i, ok := strings.Cut(v, ":")
			if !ok {
				return d, fmt.Errorf("device %q: %q, expected device:TYPE:INDEX", name, part)
			}
			d.Type = strings.ToUpper(t)
			d.Index, err = strconv.Atoi(i)
		case "cpu", "gpu", "tpu":
			d.Type = strings.ToUpper(k)
			d.Index, err = strconv.Atoi(v)
		default:
			return d, fmt.Errorf("device %q: unknown part %q", name, k)
		}
		if err != nil {
			return d, fmt.Errorf("device %q: part %q: expected a number", name, part)
		}
	}
	return d, nil
}

// String formats the spec canonically, leaving out what is not given.
func (d DeviceSpec) String() string {
	var b strings.Builder
	if d.Job != "" {
		fmt.Fprintf(&b, "/job:%s", d.Job)
	}
	if d.Replica >= 0 {
		fmt.Fprintf(&b, "/replica:%d", d.Replica)
	}
	if d.Task >= 0 {
		fmt.Fprintf(&b, "/task:%d", d.Task)
	}
	if d.Type != "" {
		fmt.Fprintf(&b, "/device:%s:%d", d.Type, max(d.Index, 0))
	}
	return b.String()
}

// Matches reports whether the device named full (as ListDevices gives it) is
// the one d names: every part d gives must agree.
func (d DeviceSpec) Matches(full string) bool {
	f, err := ParseDevice(full)
	if err != nil {
		return false
	}
	return (d.Job == "" || d.Job == f.Job) &&
		(d.Replica < 0 || d.Replica == f.Replica) &&
		(d.Task < 0 || d.Task == f.Task) &&
		(d.Type == "" || d.Type == f.Type) &&
		(d.Index < 0 || d.Index == f.Index)
}

// ReplicaDevices chooses the devices a strategy runs one replica on each
// of, among the devices a session has (available, as ListDevices gives
// them): the named ones ("/gpu:1", "/device:CPU:0", or full names), else
// the first logicalCPUs CPUs when logicalCPUs > 0, else every GPU, else
// the first CPU. It returns the devices' full names. A name that matches
// no device, or a device named twice, is an error that lists the devices
// that exist.
func ReplicaDevices(available []Device, named []string, logicalCPUs int) ([]string, error) {
	var out []string
	switch {
	case len(named) > 0:
		seen := map[string]int{}
		for i, n := range named {
			d, err := findDevice(available, n)
			if err != nil {
				return nil, fmt.Errorf("device %d: %w", i, err)
			}
			if j, ok := seen[d]; ok {
				return nil, fmt.Errorf("device %d: %q appears twice (device %d is %s too); each replica needs its own device", i, n, j, d)
			}
			seen[d] = i
			out = append(out, d)
		}
	case logicalCPUs > 0:
		out = devicesOfType(available, "CPU")
		if len(out) < logicalCPUs {
			return nil, fmt.Errorf("%d logical CPUs asked for, the session has %d: %s", logicalCPUs, len(out), deviceNames(available))
		}
		out = out[:logicalCPUs]
	default:
		out = devicesOfType(available, "GPU")
		if cpus := devicesOfType(available, "CPU"); len(out) == 0 && len(cpus) > 0 {
			out = cpus[:1]
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no GPU or CPU among the session's devices: %s", deviceNames(available))
	}
	return out, nil
}

// findDevice returns the full name of the one device of available that
// name names.
func findDevice(available []Device, name string) (string, error) {
	spec, err := ParseDevice(name)
	if err != nil {
		return "", err
	}
	if spec.Type == "" {
		return "", fmt.Errorf("%q: expected a device type and index, e.g. /gpu:0", name)
	}
	if spec.Index < 0 {
		spec.Index = 0
	}
	var found []string
	for _, d := range available {
		if spec.Matches(d.Name) {
			found = append(found, d.Name)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%q does not exist; the devices that exist are %s", name, deviceNames(available))
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%q names %d devices (%s); expected one", name, len(found), strings.Join(found, ", "))
}

// devicesOfType returns the full names of available's devices of type t,
// in TensorFlow's order.
func devicesOfType(available []Device, t string) []string {
	var out []string
	for _, d := range available {
		if d.Type == t {
			out = append(out, d.Name)
		}
	}
	return out
}

func deviceNames(available []Device) string {
	names := make([]string, len(available))
	for i, d := range available {
		names[i] = d.Name
	}
	return strings.Join(names, ", ")
}

// IsGPU reports whether the device named full is a GPU.
func IsGPU(full string) bool { return isType(full, "GPU") }

// IsCPU reports whether the device named full is a CPU; a name that gives
// no type (the placer's choice) is not.
func IsCPU(full string) bool { return isType(full, "CPU") }

func isType(full, typ string) bool {
	d, err := ParseDevice(full)
	return err == nil && d.Type == typ
}
