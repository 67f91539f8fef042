package strategy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// An optimizer updates an external variable through a SlotStore's
// ApplyContext, with its slots and step count created in the store, named
// as under an engine, and reported with the variable they serve.
func TestSlotStoreGivesOptimizersExternalVariables(t *testing.T) {
	g := tf.NewGraph()
	s := op.NewScopeWithGraph(g).SubScope("model")
	h := op.VarHandleOp(s.SubScope("w"), tf.Float, tf.MakeShape(2), op.VarHandleOpSharedName("w"))
	initW := op.AssignVariableOp(s.SubScope("init"), h, op.Const(s.SubScope("w0"), []float32{1, 2}))
	w, err := strategy.NewExternalVariable("w", tf.Float, []int64{2}, h)
	require.NoError(t, err)
	assert.Equal(t, 1, w.NumCopies())

	store := strategy.NewSlotStore(g)
	ac, err := store.ApplyContext(s.SubScope("apply"))
	require.NoError(t, err)
	assert.Equal(t, h, ac.Handle(w))
	up, err := optimizer.NewMomentum(optimizer.Constant(0.1), 0.9, false).Apply(ac, []tf.Output{op.Const(s.SubScope("g"), []float32{1, 1})}, []strategy.Variable{w})
	require.NoError(t, err)
	read := op.ReadVariableOp(s.SubScope("read"), h, tf.Float)
	require.NoError(t, s.Err())

	slots := store.Slots()
	require.Len(t, slots, 2)
	byName := map[string]strategy.SlotInfo{}
	for _, sl := range slots {
		byName[sl.Var.Name()] = sl
	}
	require.Contains(t, byName, "w/Momentum/momentum")
	require.Contains(t, byName, "Momentum/iterations")
	assert.Equal(t, w, byName["w/Momentum/momentum"].Primary)
	assert.Equal(t, "momentum", byName["w/Momentum/momentum"].Slot)
	assert.Nil(t, byName["Momentum/iterations"].Primary)
	assert.Equal(t, "Momentum", byName["Momentum/iterations"].Owner)

	sess, err := tf.NewSession(g, nil)
	require.NoError(t, err)
	defer sess.Close()
	targets := []*tf.Operation{initW}
	for _, sl := range slots {
		targets = append(targets, sl.Init)
	}
	_, err = sess.Run(nil, nil, targets)
	require.NoError(t, err)
	_, err = sess.Run(nil, nil, []*tf.Operation{up})
	require.NoError(t, err)
	out, err := sess.Run(nil, []tf.Output{read}, nil)
	require.NoError(t, err)
	assert.InDeltaSlice(t, []float32{0.9, 1.9}, out[0].Value(), 1e-6)
}

func TestExternalVariableRejectsBadInput(t *testing.T) {
	s := op.NewScope()
	c := op.Const(s, float32(1))
	_, err := strategy.NewExternalVariable("x", tf.Float, nil, c)
	assert.ErrorContains(t, err, "expected a resource handle")
	_, err = strategy.NewExternalVariable("/x", tf.Float, nil, c)
	assert.ErrorContains(t, err, `name "/x"`)
	_, err = strategy.NewExternalVariable("x", tf.Float, nil, tf.Output{})
	assert.ErrorContains(t, err, "no handle")
	_, err = (*strategy.SlotStore)(nil).ApplyContext(s)
	assert.Error(t, err)
}
