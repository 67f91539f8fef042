package train_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/mirrored"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
	"github.com/tfdist/tfdist/train"
)

// compiledWith compiles mlp on s with opt.
func compiledWith(t testing.TB, s train.Strategy, opt strategy.Optimizer) *train.Trainer {
	t.Helper()
	var m *nn.Model
	require.NoError(t, s.Scope(func(sc strategy.Scope) error { m = mlp(t, sc); return nil }))
	tr, err := train.Compile(s, m, train.SparseCategoricalCrossentropy{FromLogits: true}, opt,
		train.WithMetrics(train.SparseCategoricalAccuracy{}))
	require.NoError(t, err)
	return tr
}

// adjustable compiles mlp on s with Keras's SGD with momentum 0.9 at a
// rate the program sets, starting at lr.
func adjustable(t testing.TB, s train.Strategy, lr float32) *train.Trainer {
	t.Helper()
	return compiledWith(t, s, optimizer.NewKerasMomentum(optimizer.NewAdjustable(lr), 0.9, false))
}

// withoutRate drops the learning rate's variable from a model's values.
func withoutRate(vals []strategy.VariableValue) []strategy.VariableValue {
	var out []strategy.VariableValue
	for _, v := range vals {
		if !strings.HasSuffix(v.Name, "/learning_rate") {
			out = append(out, v)
		}
	}
	return out
}

// f32 is x as a float32 rate reads back.
func rate32(x float64) float64 { return float64(float32(x)) }

// rates records the learning rate at the end of every epoch, after the
// callbacks before it: the rate of the next epoch.
type rates struct {
	train.BaseCallback
	after []float64
}

func (p *rates) OnEpochEnd(ctx context.Context, r *train.Run, _ int, _ train.Logs) error {
	lr, err := r.Trainer().LearningRate(ctx)
	p.after = append(p.after, lr)
	return err
}

// scripted adds key to every epoch's logs, from values.
type scripted struct {
	train.BaseCallback
	key    string
	values []float64
}

func (s *scripted) OnEpochEnd(_ context.Context, _ *train.Run, epoch int, logs train.Logs) error {
	logs[s.key] = s.values[epoch]
	return nil
}

// A LearningRateScheduler that halves the rate after each epoch trains
// exactly the model of a PiecewiseConstant schedule with the same rates at
// the epochs' boundaries (which Fit trains as a hand-written loop does, bit
// for bit: TestFitEqualsHandWrittenLoop): the rate the callback sets
// before an epoch is the rate of each of its steps. History logs each
// epoch's rate.
func TestLearningRateSchedulerEqualsPiecewiseConstant(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	const epochs, steps = 4, 5 // 300 examples in batches of 64

	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := adjustable(t, s, 0.05)
	halve := &train.LearningRateScheduler{Schedule: func(epoch int, lr float64) float64 {
		if epoch == 0 {
			return lr
		}
		return lr / 2
	}}
	h, err := tr.Fit(ctx, shuffled(t, d), train.Epochs(epochs), train.WithCallbacks(halve))
	require.NoError(t, err)

	sched := optimizer.PiecewiseConstant{Values: []float32{0.05}}
	for e := 1; e < epochs; e++ {
		sched.Boundaries = append(sched.Boundaries, int64(e*steps))
		sched.Values = append(sched.Values, sched.Values[e-1]/2)
	}
	var logged []float64
	for _, v := range sched.Values {
		logged = append(logged, float64(v))
	}
	assert.Equal(t, logged, h.Values[train.LogLearningRate])
	lr, err := tr.LearningRate(ctx)
	require.NoError(t, err)
	assert.Equal(t, logged[epochs-1], lr)

	ref, err := onedevice.New()
	require.NoError(t, err)
	defer ref.Close()
	want := compiledWith(t, ref, optimizer.NewKerasMomentum(sched, 0.9, false))
	wantH, err := want.Fit(ctx, shuffled(t, d), train.Epochs(epochs))
	require.NoError(t, err)
	assert.Equal(t, wantH.Values["loss"], h.Values["loss"])
	assert.Equal(t, readModel(t, ref), withoutRate(readModel(t, s)))
}

// ReduceLROnPlateau follows Keras's rule on a monitored sequence: a
// reduction after Patience epochs without an improvement of more than
// MinDelta, none during the Cooldown after it, none below MinLR, "auto"
// maximizing a key with "acc"; History logs the rate each epoch trained
// at and LearningRate the rate after the epoch's decision.
func TestReduceLROnPlateauFollowsKeras(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	one := dataset.Batched(sliceDS(t, d, 64), 64, false)
	for _, c := range []struct {
		name     string
		cb       *train.ReduceLROnPlateau
		factor   float64
		initial  float32
		values   []float64
		reduceAt []int // the epochs at whose end Keras reduces the rate
	}{{
		name:    "min",
		cb:      &train.ReduceLROnPlateau{Monitor: "score", Factor: 0.5, Patience: 2, Cooldown: 2, MinDelta: 0.1, MinLR: 0.01},
		factor:  0.5,
		initial: 0.08,
		values:  []float64{1, 0.95, 0.5, 0.45, 0.44, 0.43, 0.42, 0.41, 0.405, 0.38, 0.37, 0.36, 0.35, 0.34, 0.33, 0.32},
		// Epoch 2 improves by more than 0.1, 3 and 4 do not: 4 reduces.
		// 5 is in the cooldown, 6 and 7 are not: 7 reduces. 8 is in the
		// cooldown, 9 improves on 0.5 by 0.12, 10 and 11 do not: 11
		// reduces, to MinLR. 12 is in the cooldown, 13 and 14 do not
		// improve, but the rate is MinLR.
		reduceAt: []int{4, 7, 11},
	}, {
		name:    "auto is max for accuracy",
		cb:      &train.ReduceLROnPlateau{Monitor: "score_acc", Patience: 1, Cooldown: 2},
		factor:  0.1,
		initial: 0.1,
		values:  []float64{0.5, 0.6, 0.6, 0.6, 0.6, 0.60005, 0.7, 0.7},
		// 2 does not improve: it reduces. 3 is in the cooldown; 4 is not
		// and reduces. 5 is in the cooldown (and improves by less than
		// MinDelta, 1e-4), 6 improves, 7 reduces.
		reduceAt: []int{2, 4, 7},
	}} {
		t.Run(c.name, func(t *testing.T) {
			s, err := onedevice.New()
			require.NoError(t, err)
			defer s.Close()
			tr := adjustable(t, s, c.initial)
			probe := &rates{}
			h, err := tr.Fit(ctx, one, train.Epochs(len(c.values)),
				train.WithCallbacks(&scripted{key: c.cb.Monitor, values: c.values}, c.cb, probe))
			require.NoError(t, err)
			after, logged := make([]float64, len(c.values)), make([]float64, len(c.values))
			lr := float64(c.initial)
			for e := range c.values {
				logged[e] = lr
				if slices.Contains(c.reduceAt, e) {
					lr = rate32(max(lr*c.factor, c.cb.MinLR)) // Keras's arithmetic, in float64, kept in a float32
				}
				after[e] = lr
			}
			assert.Equal(t, after, probe.after)
			assert.Equal(t, logged, h.Values[train.LogLearningRate])
		})
	}
}

// ReduceLROnPlateau on the validation loss of a real run: the epochs
// where it reduces the rate are those where Keras's rule, applied to the
// val_loss History logs, reduces it.
func TestReduceLROnPlateauOnValidationLoss(t *testing.T) {
	ctx := context.Background()
	d, held := digitsData(t)
	val := dataset.Batched(sliceDS(t, held, 100), 50, false)
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := adjustable(t, s, 0.2)
	cb := &train.ReduceLROnPlateau{Factor: 0.5, Patience: 2, MinDelta: 0.02}
	probe := &rates{}
	h, err := tr.Fit(ctx, shuffled(t, d), train.Epochs(12), train.ValidationData(val), train.WithCallbacks(cb, probe))
	require.NoError(t, err)

	lr, best, wait, reductions := rate32(0.2), 1e300, 0, 0
	for e, v := range h.Values["val_loss"] {
		assert.Equal(t, lr, h.Values[train.LogLearningRate][e], "epoch %d trained at", e)
		if v < best-0.02 {
			best, wait = v, 0
		} else if wait++; wait >= 2 {
			lr, wait = rate32(lr*0.5), 0
			reductions++
		}
		assert.Equal(t, lr, probe.after[e], "after epoch %d", e)
	}
	assert.Positive(t, reductions, "the validation loss stops improving by 0.02: %v", h.Values["val_loss"])
}

// Under mirrored x2 and two workers of two devices, ReduceLROnPlateau
// reduces the rate at the same epochs as under the default strategy, to
// the same rates, on every worker (each worker decides from the same
// logs), and the models equal the default strategy's within 1e-4.
func TestLearningRateUnderReplicas(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	type out struct {
		vals  []strategy.VariableValue
		rates []float64
	}
	fit := func(s strategy.Strategy) out {
		tr := adjustable(t, s, 0.2)
		probe := &rates{}
		// The loss falls by 0.5 or more in each of the first 3 epochs and
		// by less than 0.2 in the 4th, so the decisions do not hang on the
		// last digits of the loss.
		_, err := tr.Fit(ctx, shuffled(t, d), train.Epochs(6),
			train.WithCallbacks(&train.ReduceLROnPlateau{Monitor: "loss", Factor: 0.5, Patience: 1, MinDelta: 0.3}, probe))
		require.NoError(t, err)
		return out{readModel(t, s), probe.after}
	}
	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	want := fit(def)
	assert.Equal(t, []float64{rate32(0.2), rate32(0.2), rate32(0.2), rate32(0.2), rate32(0.1), rate32(0.05)}, want.rates)

	check := func(what string, got out) {
		assert.Equal(t, want.rates, got.rates, what)
		diff, name, i := strategy.MaxDiff(want.vals, got.vals)
		assert.Less(t, diff, 1e-4, "%s: %s[%d]", what, name, i)
	}
	m, err := mirrored.New(mirrored.WithLogicalCPUs(2))
	require.NoError(t, err)
	check("mirrored x2", fit(m))
	copies, err := m.Copies(ctx, rateVariable(t, m))
	require.NoError(t, err)
	for r, c := range copies {
		assert.Equal(t, want.rates[5], float64(c.Value().(float32)), "replica %d's copy", r)
	}
	require.NoError(t, m.Close())

	outs := make([]out, 2)
	errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, 2), []multiworker.Option{multiworker.WithLogicalCPUs(2),
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) error {
			outs[w] = fit(s)
			return nil
		})
	for w := range 2 {
		require.NoError(t, errs[w])
		check("worker of 2x2", outs[w])
	}
}

// rateVariable returns the optimizer's learning-rate variable of s.
func rateVariable(t testing.TB, s strategy.Strategy) strategy.Variable {
	t.Helper()
	for _, v := range s.Variables() {
		if strings.HasSuffix(v.Name(), "/learning_rate") {
			return v
		}
	}
	require.FailNow(t, "no learning rate variable")
	return nil
}

// restoreRate restores a checkpoint once Fit has built the step, and
// stops training.
type restoreRate struct {
	train.BaseCallback
	prefix string
}

func (c *restoreRate) OnTrainBegin(ctx context.Context, r *train.Run) error {
	sv, err := checkpoint.NewSaver(r.Trainer().Strategy().(checkpoint.Source))
	if err != nil {
		return err
	}
	_, err = sv.Restore(ctx, c.prefix)
	r.StopTraining()
	return err
}

// A checkpoint saved after ReduceLROnPlateau reduced the rate, restored
// into a fresh strategy, restores the reduced rate.
func TestReducedRateIsCheckpointed(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	one := dataset.Batched(sliceDS(t, d, 64), 64, false)
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()
	tr := adjustable(t, s, 0.05)
	_, err = tr.Fit(ctx, one, train.Epochs(3), train.WithCallbacks(&scripted{key: "score", values: []float64{1, 1, 1}},
		&train.ReduceLROnPlateau{Monitor: "score", Patience: 1}))
	require.NoError(t, err)
	reduced, err := tr.LearningRate(ctx)
	require.NoError(t, err)
	require.Equal(t, rate32(rate32(rate32(0.05)*0.1)*0.1), reduced)
	prefix := filepath.Join(t.TempDir(), "ckpt")
	sv, err := checkpoint.NewSaver(s)
	require.NoError(t, err)
	require.NoError(t, sv.Save(ctx, prefix, nil))

	fresh, err := onedevice.New()
	require.NoError(t, err)
	defer fresh.Close()
	tr2 := adjustable(t, fresh, 0.05)
	h, err := tr2.Fit(ctx, one, train.WithCallbacks(&restoreRate{prefix: prefix}))
	require.NoError(t, err)
	require.Empty(t, h.Epochs)
	got, err := tr2.LearningRate(ctx)
	require.NoError(t, err)
	assert.Equal(t, reduced, got)
}

// Under parameter servers the rate the chief sets between epochs is the
// rate of the steps the workers run after it: at rate 0, SGD leaves the
// model as the first epoch left it.
func TestLearningRateUnderParameterServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, _ := digitsData(t)
	s := newPS(t)
	tr := compiledWith(t, s, optimizer.NewSGD(optimizer.NewAdjustable(0.05)))
	defer tr.Close()
	models := &psModels{}
	sched := &train.LearningRateScheduler{Schedule: func(epoch int, lr float64) float64 {
		if epoch == 0 {
			return lr
		}
		return 0
	}}
	h, err := tr.Fit(ctx, shuffled(t, d), train.Epochs(3), train.StepsPerEpoch(10), train.WithCallbacks(sched, models))
	require.NoError(t, err)
	assert.Equal(t, []float64{rate32(0.05), 0, 0}, h.Values[train.LogLearningRate])
	applied, err := s.AppliedSteps(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(30), applied)
	require.Len(t, models.vals, 3)
	assert.Equal(t, models.vals[0], models.vals[1], "epoch 1 at rate 0")
	assert.Equal(t, models.vals[0], models.vals[2], "epoch 2 at rate 0")
	lr, err := tr.LearningRate(ctx)
	require.NoError(t, err)
	assert.Zero(t, lr)
}

// psModels reads the model at the end of every epoch.
type psModels struct {
	train.BaseCallback
	vals [][]strategy.VariableValue
}

func (p *psModels) OnEpochEnd(ctx context.Context, r *train.Run, _ int, _ train.Logs) error {
	v, err := strategy.ReadVariables(ctx, r.Trainer().Strategy().(strategy.ValueReader), r.Trainer().Model().Vars())
	p.vals = append(p.vals, v)
	return err
}

// A rate that is not an optimizer.Adjustable cannot be read or set, and
// the callbacks that set it stop Fit before its first step; bad fields
// and a monitored key that is missing are errors naming them.
func TestLearningRateErrors(t *testing.T) {
	ctx := context.Background()
	d, _ := digitsData(t)
	one := dataset.Batched(sliceDS(t, d, 64), 64, false)
	s, err := onedevice.New()
	require.NoError(t, err)
	defer s.Close()

	fixed := compiled(t, s)
	other, err := onedevice.New()
	require.NoError(t, err)
	defer other.Close()
	const notSet = "optimizer: *optimizer.Momentum's learning rate is the constant optimizer.Constant(0.05), which the program cannot set: expected an optimizer.NewAdjustable(rate)"
	_, err = fixed.LearningRate(ctx)
	assert.ErrorContains(t, err, notSet)
	assert.ErrorContains(t, fixed.SetLearningRate(ctx, 0.01), "train: SetLearningRate(0.01): "+notSet)
	for _, cb := range []train.Callback{&train.LearningRateScheduler{Schedule: func(int, float64) float64 { return 0.1 }}, &train.ReduceLROnPlateau{Monitor: "loss"}} {
		h, err := fixed.Fit(ctx, one, train.Epochs(2), train.WithCallbacks(cb))
		assert.ErrorContains(t, err, notSet)
		assert.Empty(t, h.Epochs, "no epoch trained")
	}

	tr := adjustable(t, other, 0.05)
	assert.ErrorContains(t, tr.SetLearningRate(ctx, -1), "train: SetLearningRate: -1, expected a finite float32 >= 0")
	for _, c := range []struct {
		cb   train.Callback
		opts []train.FitOption
		want string
	}{
		{&train.ReduceLROnPlateau{Factor: 1.5}, nil, "callback ReduceLROnPlateau: OnTrainBegin: reduction Factor 1.5, expected 0 < Factor < 1"},
		{&train.ReduceLROnPlateau{Mode: "up"}, nil, `unknown Mode "up", expected "auto", "min" or "max"`},
		{&train.ReduceLROnPlateau{Monitor: "los"}, nil, `epoch 0: callback ReduceLROnPlateau: OnEpochEnd: no Monitor "los" in the logs of epoch 0, which have accuracy, learning_rate, loss`},
		{&train.ReduceLROnPlateau{}, nil, `callback ReduceLROnPlateau: OnTrainBegin: the Monitor "val_loss" is a validation log, and Fit has no ValidationData`},
		{&train.ReduceLROnPlateau{}, []train.FitOption{train.ValidationData(one), train.ValidationFreq(3)}, `callback ReduceLROnPlateau: OnTrainEnd: no epoch's logs had Monitor "val_loss"`},
		{&train.ReduceLROnPlateau{}, []train.FitOption{train.ValidationData(one), train.ValidationFreq(2)}, ""},
		{&train.LearningRateScheduler{}, nil, "callback LearningRateScheduler: OnTrainBegin: nil Schedule"},
		{&train.LearningRateScheduler{Schedule: func(int, float64) float64 { return -0.5 }}, nil, "callback LearningRateScheduler: OnEpochBegin: rate -0.5 from Schedule(0, 0.05000000074505806), expected a finite float32 >= 0"},
	} {
		_, err := tr.Fit(ctx, one, append([]train.FitOption{train.Epochs(2), train.WithCallbacks(c.cb)}, c.opts...)...)
		if c.want == "" {
			assert.NoError(t, err, "validation every other epoch: the epochs without val_loss are skipped")
		} else {
			assert.ErrorContains(t, err, c.want)
		}
	}
}
