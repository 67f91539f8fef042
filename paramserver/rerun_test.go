package paramserver

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// A step run again after its update was applied — as when its worker dies
// between the ps tasks' update and its answer — applies nothing: every
// variable and optimizer slot keeps its value, element by element, under
// optimizers whose update combines shards held by two ps tasks (a global
// norm; Adam's step count on the first ps task).
func TestRerunOfAnAppliedStepAppliesNothing(t *testing.T) {
	clipped, err := optimizer.ClipByGlobalNorm(optimizer.NewSGD(optimizer.Constant(0.5)), 1)
	require.NoError(t, err)
	for name, opt := range map[string]strategy.Optimizer{
		"clip by global norm": clipped,
		"adam":                optimizer.NewAdam(optimizer.Constant(0.01)),
	} {
		t.Run(name, func(t *testing.T) {
			s := newInProcess(t, 1, 2)
			ctx := testContext(t, time.Minute)
			var a, b strategy.Variable
			require.NoError(t, s.Scope(func(sc strategy.Scope) (err error) {
				if a, err = sc.Variable("a", tf.Float, []int64{6, 2}, strategy.Constant(tensor(t, table(6, 2))),
					strategy.WithPartitioner(FixedShards(2))); err != nil {
					return err
				}
				b, err = sc.Variable("b", tf.Float, []int64{3}, strategy.Constant(tensor(t, []float32{1, 2, 3})))
				return err
			}))
			spec := strategy.InputSpec{"ga": {DType: tf.Float, Shape: []int64{6, 2}}}
			fn, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
				sc := rc.Scope()
				loss := op.Add(sc.SubScope("loss"),
					graphutil.SumAll(sc.SubScope("a"), op.Mul(sc.SubScope("mul_a"), strategy.MustRead(rc, a), in["ga"])),
					graphutil.SumAll(sc.SubScope("b"), op.Square(sc.SubScope("sq_b"), strategy.MustRead(rc, b))))
				return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, []strategy.Variable{a, b})
			})
			require.NoError(t, err)
			in := Feed(dataset.Element{"ga": tensor(t, table(6, 2))})
			c := newCoordinator(t, s)
			step := func() RunInfo {
				rv, err := c.Schedule(fn, in)
				require.NoError(t, err)
				require.NoError(t, c.Join(ctx))
				return rv.Info()
			}
			require.True(t, step().Applied)
			before := values(t, ctx, s, slotNames(s)...)
			s.nextClosure.Add(-1) // the next step is the last one again
			assert.False(t, step().Applied, "the rerun applies nothing")
			assert.Equal(t, before, values(t, ctx, s, slotNames(s)...), "every variable and slot as the step left them")
			require.True(t, step().Applied, "the next step applies")
			assert.NotEqual(t, fmt.Sprint(before), fmt.Sprint(values(t, ctx, s, slotNames(s)...)))
		})
	}
}

// slotNames names every slot variable of s.
func slotNames(s *Strategy) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sv := range s.slotList {
		out = append(out, sv.name)
	}
	return out
}
