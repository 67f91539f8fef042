package nn_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// BenchmarkMixedPrecisionStep times a training step (SGD, batch 256) of
// an MLP 64-2048-2048-10 on the default strategy under float32,
// mixed_bfloat16 and mixed_float16 (with loss scaling), interleaved in
// one run, and reports each policy's steps/s and its step time relative
// to float32's.
func BenchmarkMixedPrecisionStep(b *testing.B) {
	const batch = 256
	d, err := digits.Load()
	require.NoError(b, err)
	x, err := tf.NewTensor(d.X[:batch])
	require.NoError(b, err)
	y, err := tf.NewTensor(d.Y[:batch])
	require.NoError(b, err)
	feeds := []map[string]*tf.Tensor{{"x": x, "y": y}}
	policies := []nn.Policy{nn.Float32, nn.MixedBfloat16, nn.MixedFloat16}
	strategies := make([]*onedevice.Strategy, len(policies))
	steps := make([]strategy.Step, len(policies))
	for i, p := range policies {
		s, err := onedevice.New()
		require.NoError(b, err)
		defer s.Close()
		var m *nn.MLP
		require.NoError(b, s.Scope(func(sc strategy.Scope) (err error) {
			m, err = nn.NewMLP(sc, "mlp", []int{digits.Features, 2048, 2048, digits.Classes}, 1)
			return err
		}))
		opt, err := models.OptimizerFor(p, optimizer.NewSGD(optimizer.Constant(0.01)))
		require.NoError(b, err)
		steps[i], err = s.Build(models.Spec, models.TrainStep(m.WithPolicy(p), opt))
		require.NoError(b, err)
		strategies[i] = s
	}
	ctx := context.Background()
	run := func(i int) time.Duration {
		start := time.Now()
		_, err := strategies[i].RunReplicas(ctx, steps[i], feeds, batch)
		require.NoError(b, err)
		return time.Since(start)
	}
	for range 3 { // warm up
		for i := range policies {
			run(i)
		}
	}
	times := make([]time.Duration, len(policies))
	b.ResetTimer()
	for range b.N {
		for i := range policies {
			times[i] += run(i)
		}
	}
	for i, p := range policies {
		b.ReportMetric(float64(b.N)/times[i].Seconds(), p.Name()+"_steps/s")
		if i > 0 {
			b.ReportMetric(float64(times[i])/float64(times[0]), p.Name()+"/float32")
		}
	}
}
