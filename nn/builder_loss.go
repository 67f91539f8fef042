package nn

import (
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// DivNoNan returns x/y, and 0 where y is 0, broadcasting.
func (b *Builder) DivNoNan(x, y tf.Output) tf.Output {
	return op.DivNoNan(b.s.SubScope("div_no_nan"), x, y)
}

// numElements returns the number of elements of x, an int32 scalar.
func (b *Builder) numElements(x tf.Output) tf.Output { return op.Size(b.s.SubScope("size"), x) }

// expandLast returns x with a last axis of size 1 added.
func (b *Builder) expandLast(x tf.Output) tf.Output {
	return op.ExpandDims(b.s.SubScope("expand_dims"), x, b.Const(int32(-1)))
}

// squeezeLast returns x without its last axis, which must have size 1.
func (b *Builder) squeezeLast(x tf.Output) tf.Output {
	return op.Squeeze(b.s.SubScope("squeeze"), x, op.SqueezeAxis([]int64{-1}))
}

// assertRankAtLeast1 returns x with a check, run before x is read, that
// fails the step when x is a scalar: for an x whose rank the graph does
// not know.
func (b *Builder) assertRankAtLeast1(x tf.Output, message string) tf.Output {
	ok := op.GreaterEqual(b.s.SubScope("rank_ok"), op.Rank(b.s.SubScope("rank"), x), b.Const(int32(1)))
	check := op.Assert(b.s.SubScope("check_rank"), ok, []tf.Output{b.Const(message)})
	return op.Identity(b.s.SubScope("checked").WithControlDependencies(check), x)
}
