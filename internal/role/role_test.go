package role_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/role"
	"github.com/tfdist/tfdist/onedevice"
)

// A source with an IsChief method is the chief as it says; any other
// source is; an explicit choice overrides both. (A multiworker.Strategy's
// case runs in checkpoint's TestMultiWorkerOnlyChiefWritesByDefault.)
func TestRule(t *testing.T) {
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {"127.0.0.1:1"}, cluster.Worker: {"127.0.0.1:2"}})
	require.NoError(t, err)
	worker := &cluster.TFConfig{Cluster: spec, Task: cluster.Task{Type: cluster.Worker, Index: 0}}
	chief := &cluster.TFConfig{Cluster: spec, Task: cluster.Task{Type: cluster.Chief, Index: 0}}
	yes, no := true, false

	assert.True(t, role.IsChief(def), "a strategy of one process")
	assert.True(t, role.IsChief(chief))
	assert.False(t, role.IsChief(worker))
	assert.True(t, role.Writes(def, nil))
	assert.False(t, role.Writes(worker, nil))
	assert.False(t, role.Writes(def, &no))
	assert.True(t, role.Writes(worker, &yes))
}
