package multiworker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/strategy"
)

// Gradients sent as float16, bfloat16 or int8 train, on 2 workers of 2
// replicas, close to the default strategy's model but not exactly it (the
// wire rounds), both workers hold the same bits, and the workers send
// little more than half the bytes (a quarter for int8).
func TestCompressedGradientsTrainTheModel(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 30, MicroBatches: []int{32}}
	want, err := testmodel.TrainDefault(context.Background(), sgd(), plan)
	require.NoError(t, err)
	var plain int64
	for _, c := range []struct {
		comp      multiworker.Compression
		tol, sent float64 // the bytes sent, of float32's
	}{{multiworker.None, 1e-5, 1}, {multiworker.FP16, 1e-2, 0.55}, {multiworker.BF16, 5e-2, 0.55}, {multiworker.INT8, 5e-2, 0.3}} {
		got, sent := trainTwoByTwo(t, sgd, plan, multiworker.WithCompression(c.comp))
		assertCompressed(t, c.comp, want, got, sent, c.tol, c.sent, &plain)
	}
}

// assertCompressed checks a run of two workers with comp, which trained
// got and sent sent: both workers hold the same bits, within tol of want,
// the default strategy's; uncompressed, it records the bytes in *plain,
// else the model differs from want, and the bytes are less than sent
// times *plain.
func assertCompressed(t *testing.T, comp multiworker.Compression, want testmodel.Outcome, got []testmodel.Outcome, sent []int64, tol, ratio float64, plain *int64) {
	t.Helper()
	assert.Equal(t, got[0].Params, got[1].Params, "%v: both workers hold the same bits", comp)
	d, at := testmodel.MaxParamDiff(want, got[0])
	assert.Less(t, d, tol, "%v: %s differs from the default strategy's by %v", comp, at, d)
	if comp == multiworker.None {
		*plain = sent[0]
		return
	}
	assert.NotZero(t, d, "%v: the gradients were rounded on the wire", comp)
	assert.Less(t, float64(sent[0]), ratio*float64(*plain), "%v: bytes sent, against %d uncompressed", comp, *plain)
	t.Logf("%v: %d bytes sent, %.3f of float32's", comp, sent[0], float64(sent[0])/float64(*plain))
}

// trainTwoByTwo trains the model of plan with opt on 2 workers of 2
// replicas each with opts, and returns each worker's outcome and bytes
// sent.
func trainTwoByTwo(t *testing.T, opt func() strategy.Optimizer, plan testmodel.Plan, opts ...multiworker.Option) ([]testmodel.Outcome, []int64) {
	t.Helper()
	got, stats := trainOn(t, 2, 2, opt, plan, opts...)
	sent := make([]int64, len(stats))
	for w, st := range stats {
		sent[w] = st.BytesSent
	}
	return got, sent
}

// Compression the backend cannot honour is refused at start.
func TestCompressionRefused(t *testing.T) {
	_, err := multiworker.ParseCompression("topk(x)")
	require.ErrorContains(t, err, `compression "topk(x)": expected none, fp16, bf16, int8 or topk(ratio)`)
	c, err := multiworker.ParseCompression("topk(0.01)")
	require.NoError(t, err)
	require.Equal(t, multiworker.TopK(0.01), c)
	for _, c := range []struct {
		opts []multiworker.Option
		want string
	}{
		{[]multiworker.Option{multiworker.WithCompression(multiworker.FP16), multiworker.WithCommunication(multiworker.Ring)},
			"WithCompression(fp16): only tfdist's collective engine compresses"},
		{[]multiworker.Option{multiworker.WithCompression(multiworker.BF16), multiworker.WithAggregation(aggregate.Median())},
			"WithCompression(bf16) with WithAggregation(median)"},
		{[]multiworker.Option{multiworker.WithCompression(multiworker.TopK(0))}, "compression topk(0): the ratio must be in (0, 1]"},
		{[]multiworker.Option{multiworker.WithCompression(multiworker.TopK(1.5))}, "compression topk(1.5): the ratio must be in (0, 1]"},
	} {
		errs := onWorkers(loopbackSpec(t, 2), c.opts, func(int, *multiworker.Strategy) error { return nil })
		for _, err := range errs {
			require.ErrorContains(t, err, c.want)
		}
	}
}

// TopK(0.01) with error feedback sends at least 20 times fewer bytes than
// the dense all-reduce over the same 100 steps of the MLP on 2 workers of
// 2 replicas, both workers hold the same bits, and it trains: its loss
// falls from about 2.3 to below 0.2 (the dense run's: 0.12).
func TestTopKSendsFewerBytes(t *testing.T) {
	plan := testmodel.Plan{Model: "mlp", Steps: 100, MicroBatches: []int{32}}
	var loss [2]float64
	var sent [2]int64
	for i, comp := range []multiworker.Compression{multiworker.None, multiworker.TopK(0.01)} {
		got := make([]testmodel.Outcome, 2)
		bytes := make([]int64, 2)
		errs := onWorkers(loopbackSpec(t, 2), append([]multiworker.Option{multiworker.WithCompression(comp)}, twoByTwo...),
			func(w int, s *multiworker.Strategy) error {
				p := plan
				p.FirstReplica = 2 * w
				var err error
				got[w], err = testmodel.TrainPlan(context.Background(), s, sgd(), p)
				bytes[w] = s.CollectiveStats().BytesSent
				return err
			})
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		assert.Equal(t, got[0].Params, got[1].Params, "%v: both workers hold the same bits", comp)
		loss[i], sent[i] = got[0].FinalLoss, bytes[0]
	}
	t.Logf("bytes sent in 100 steps: dense %d, topk(0.01) %d (%.1fx fewer); final loss %.4f vs %.4f",
		sent[0], sent[1], float64(sent[0])/float64(sent[1]), loss[0], loss[1])
	assert.GreaterOrEqual(t, float64(sent[0])/float64(sent[1]), 20.0)
	assert.Less(t, loss[1], 0.2)
}
