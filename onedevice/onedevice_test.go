package onedevice_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// The strategy is one replica on this process's CPU:0, or on the device
// WithDevice names; a device the process does not have is an error
// naming it.
func TestOneReplicaOnItsDevice(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	var _ strategy.Strategy = s
	assert.Equal(t, 1, s.NumReplicasInSync())
	assert.Equal(t, []string{strategy.LocalCPU(0)}, s.Devices())

	var v strategy.Variable
	require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
		v, err = sc.Variable("v", tf.Float, []int64{2}, strategy.Zeros())
		return err
	}))
	val, err := s.Value(context.Background(), v)
	require.NoError(t, err)
	assert.Equal(t, []float32{0, 0}, val.Value())

	_, err = onedevice.New(onedevice.WithDevice(strategy.LocalCPU(3)))
	assert.ErrorContains(t, err, "CPU:3")
}
