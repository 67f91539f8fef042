package savedmodel_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/savedmodel"
	"github.com/tfdist/tfdist/strategy"
)

// A signature's AverageLoss divides by the batch's examples, the leading
// dimension, as every strategy's does: a per-token loss of 2 sequences
// of 3 tokens averages to its sum over 2.
func TestSignatureAverageLossDividesByExamples(t *testing.T) {
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	sig := savedmodel.Signature{
		Name:   savedmodel.DefaultSignature,
		Inputs: strategy.InputSpec{"loss": {DType: tf.Float, Shape: []int64{-1, 3}}},
		Fn: func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"mean": r.AverageLoss(in["loss"])}, nil
		},
	}
	dir, err := savedmodel.Export(testContext(t), s, t.TempDir()+"/m", []savedmodel.Signature{sig})
	require.NoError(t, err)
	sm, err := tf.LoadSavedModel(dir, []string{savedmodel.ServeTag}, nil)
	require.NoError(t, err)
	defer sm.Session.Close()
	loss, err := tf.NewTensor([][]float32{{1, 2, 3}, {4, 5, 6}})
	require.NoError(t, err)
	got := sm.Signatures[savedmodel.DefaultSignature]
	res, err := sm.Session.Run(map[tf.Output]*tf.Tensor{output(t, sm.Graph, got.Inputs["loss"].Name): loss},
		[]tf.Output{output(t, sm.Graph, got.Outputs["mean"].Name)}, nil)
	require.NoError(t, err)
	assert.Equal(t, float32(21.0/2), res[0].Value())
}
