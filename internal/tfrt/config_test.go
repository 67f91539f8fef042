package tfrt_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/tfrt"
)

// The strategies' default thread pools follow TensorFlow's environment
// variables, as TensorFlow's own defaults do, so that workers on machines
// with different core counts can run the same pools; a bad value is an
// error naming the variable and its value.
func TestDefaultThreadsFollowTheEnvironment(t *testing.T) {
	t.Setenv("TF_NUM_INTRAOP_THREADS", "")
	t.Setenv("TF_NUM_INTEROP_THREADS", "")
	intra, inter, err := tfrt.DefaultThreads()
	require.NoError(t, err)
	assert.Equal(t, runtime.NumCPU(), intra)
	assert.Equal(t, max(runtime.NumCPU(), 2), inter)

	t.Setenv("TF_NUM_INTRAOP_THREADS", "3")
	t.Setenv("TF_NUM_INTEROP_THREADS", "5")
	intra, inter, err = tfrt.DefaultThreads()
	require.NoError(t, err)
	assert.Equal(t, []int{3, 5}, []int{intra, inter})
	intra, inter, err = tfrt.ResolveThreads(1, 0)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 5}, []int{intra, inter}, "a count given wins; one not given is the default")

	for _, bad := range []string{"0", "-2", "many"} {
		t.Setenv("TF_NUM_INTEROP_THREADS", bad)
		_, _, err = tfrt.DefaultThreads()
		assert.EqualError(t, err, `TF_NUM_INTEROP_THREADS="`+bad+`": expected a positive number of threads`)
	}
}
