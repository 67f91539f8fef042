package classifier

import (
	"flag"
	"fmt"
	"math"
	"sync"

	"github.com/tfdist/tfdist/accountant"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// DP holds the flags of differentially private training.
type DP struct {
	Clip, Noise, Delta, Epsilon float64
}

func registerPrivacyFlags(fs *flag.FlagSet, d *DP) {
	fs.Float64Var(&d.Clip, "dp-clip", 0, "train with DP-SGD and Poisson sampling: clip each example's gradient to this L2 norm (0: no DP-SGD)")
	fs.Float64Var(&d.Noise, "dp-noise", 0, "DP-SGD: the noise multiplier; 0 with -dp-epsilon: the smallest that stays within it")
	fs.Float64Var(&d.Delta, "dp-delta", 1e-5, "DP-SGD: the delta of the (epsilon, delta) guarantee")
	fs.Float64Var(&d.Epsilon, "dp-epsilon", 0, "DP-SGD: the epsilon not to exceed; a run whose -steps would exceed it refuses to start (0: no target)")
}

// on reports whether the run trains with DP-SGD.
func (d DP) on() bool { return d.Clip > 0 }

// check reports the first privacy flag whose value cannot work with o.
func (d DP) check(o Options) error {
	switch {
	case d.Clip < 0 || math.IsNaN(d.Clip) || math.IsInf(d.Clip, 0):
		return fmt.Errorf("-dp-clip %v: expected a positive norm, or 0 for no DP-SGD", d.Clip)
	case !d.on():
		return nil
	case d.Noise < 0 || math.IsNaN(d.Noise) || math.IsInf(d.Noise, 0):
		return fmt.Errorf("-dp-noise %v: expected a finite noise multiplier >= 0", d.Noise)
	case !(d.Delta > 0 && d.Delta < 1):
		return fmt.Errorf("-dp-delta %v: expected a value in (0, 1)", d.Delta)
	case d.Epsilon < 0 || math.IsNaN(d.Epsilon) || math.IsInf(d.Epsilon, 0):
		return fmt.Errorf("-dp-epsilon %v: expected a finite epsilon > 0, or 0 for no target", d.Epsilon)
	case o.Strategy == "ps":
		return fmt.Errorf("-dp-clip with -strategy ps: the parameter-server strategy's workers update asynchronously, which DP-SGD's accounting does not cover")
	case o.Accumulate > 1:
		return fmt.Errorf("-dp-clip with -accumulate %d: DP-SGD does not accumulate; use a larger -global-batch", o.Accumulate)
	case o.ClipNorm > 0:
		return fmt.Errorf("-dp-clip with -clip-norm %v: DP-SGD clips each example; drop -clip-norm", o.ClipNorm)
	case o.MixedPrecision == nn.MixedFloat16:
		return fmt.Errorf("-dp-clip with -mixed-precision mixed_float16: DP-SGD does not scale the loss; use mixed_bfloat16")
	}
	return nil
}

// privacy is a DP-SGD run: its sampling rate, noise and accounting.
type privacy struct {
	DP
	rate        float64 // each step takes each example with this probability
	expected    float64 // the expected global batch: rate × examples
	maxExamples int     // per replica

	// The last epsilon computed: each logged step asks for it twice
	// (TensorBoard and the progress line).
	mu       sync.Mutex
	lastStep int
	lastEps  float64
}

// newPrivacy settles the noise multiplier for a run of o on examples
// training examples and replicas replicas in sync: -dp-noise, or the
// smallest that keeps -steps within -dp-epsilon; and refuses a run that
// would spend more than -dp-epsilon.
func newPrivacy(o Options, examples, replicas int) (*privacy, error) {
	p := &privacy{DP: o.DP, expected: float64(o.GlobalBatch), rate: float64(o.GlobalBatch) / float64(examples)}
	if p.rate > 1 {
		return nil, fmt.Errorf("-global-batch %d with -dp-clip: the expected batch is larger than the %d training examples", o.GlobalBatch, examples)
	}
	if p.Noise == 0 && p.Epsilon > 0 {
		noise, err := accountant.NoiseMultiplier(p.rate, o.Steps, p.Delta, p.Epsilon)
		if err != nil {
			return nil, fmt.Errorf("-dp-epsilon %v: %w", p.Epsilon, err)
		}
		p.Noise = noise
	}
	if eps := p.epsilon(o.Steps); p.Epsilon > 0 && eps > p.Epsilon {
		need, err := accountant.NoiseMultiplier(p.rate, o.Steps, p.Delta, p.Epsilon)
		hint := ""
		if err == nil {
			hint = fmt.Sprintf(" (a -dp-noise of %.4g would)", need)
		}
		return nil, fmt.Errorf("-steps %d with -dp-noise %v spend epsilon %.4g, more than -dp-epsilon %v allows%s", o.Steps, p.Noise, eps, p.Epsilon, hint)
	}
	// A Poisson batch exceeds its mean by 6 standard deviations about once
	// in 10^9 steps; a replica's share is at most one more than an even one.
	sd := math.Sqrt(float64(examples) * p.rate * (1 - p.rate))
	p.maxExamples = int(math.Ceil((p.expected+6*sd)/float64(replicas))) + 1
	return p, nil
}

// epsilon returns the epsilon spent after steps steps.
func (p *privacy) epsilon(steps int) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if steps == p.lastStep && steps > 0 {
		return p.lastEps
	}
	eps, _, err := accountant.Epsilon(p.rate, p.Noise, steps, p.Delta)
	if err != nil {
		eps = math.NaN()
	}
	p.lastStep, p.lastEps = steps, eps
	return eps
}

// optimizer wraps opt in DP-SGD.
func (p *privacy) optimizer(opt strategy.Optimizer, seed uint64) (strategy.Optimizer, error) {
	return optimizer.DPSGD(opt, optimizer.DPConfig{ClipNorm: float32(p.Clip), NoiseMultiplier: float32(p.Noise),
		ExpectedBatch: p.expected, MaxExamples: p.maxExamples, Seed: int64(seed)})
}

// batches returns the run's training batches: Poisson samples of train.
func (p *privacy) batches(train digits.Data, steps int, seed uint64) (dataset.Dataset, error) {
	ds, err := dataset.FromSlices(map[string]any{"x": train.X, "y": train.Y})
	if err != nil {
		return nil, err
	}
	return dataset.PoissonSample(ds, p.rate, steps, seed), nil
}
