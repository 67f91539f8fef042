package multiworker

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/internal/tensorutil"
)

// A worker restores its own row of the saved residuals when the job saved
// them with as many workers, and the rows' mean otherwise, so that what
// the workers had not sent, as a share of the sum, is kept.
func TestResidualRowFollowsTheWorkerCount(t *testing.T) {
	saved := [][]float32{{1, 2}, {3, 4}}
	for _, c := range []struct {
		workers, id int
		want        []float32
	}{
		{2, 0, []float32{1, 2}},
		{2, 1, []float32{3, 4}},
		{3, 2, []float32{2, 3}},
		{1, 0, []float32{2, 3}},
	} {
		s := &Strategy{workerID: c.id, workers: make([]cluster.Task, c.workers)}
		root := op.NewScope()
		row := s.residualRow(root.SubScope("row"), op.Const(root.SubScope("saved"), saved))
		g, err := root.Finalize()
		require.NoError(t, err)
		sess, err := tf.NewSession(g, nil)
		require.NoError(t, err)
		out, err := sess.Run(nil, []tf.Output{row}, nil)
		require.NoError(t, err)
		assert.Equal(t, c.want, tensorutil.Float32s(out[0]), fmt.Sprintf("worker %d of %d", c.id, c.workers))
		require.NoError(t, sess.Close())
	}
}
