package classifier

import (
	"flag"
	"fmt"
	"math"

	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// optimizerNames are the values of -optimizer.
var optimizerNames = []string{"sgd", "momentum", "adam", "adamw", "lars", "lamb"}

// registerLargeBatchFlags defines the flags of large-batch training.
func registerLargeBatchFlags(fs *flag.FlagSet, o *Options) {
	fs.StringVar(&o.Optimizer, "optimizer", "sgd", fmt.Sprintf("optimizer: one of %v", optimizerNames))
	fs.IntVar(&o.WarmupSteps, "warmup-steps", 0, "raise the learning rate linearly from 0 to -lr over this many updates")
	fs.Float64Var(&o.ClipNorm, "clip-norm", 0, "clip the gradients to this global norm (0: no clipping)")
	fs.IntVar(&o.Accumulate, "accumulate", 1, "accumulate the gradients of this many steps, then all-reduce and apply them once (in-graph strategies)")
	fs.Var(&o.MixedPrecision, "mixed-precision", "policy: float32, mixed_bfloat16 or mixed_float16 (with loss scaling)")
}

// checkLargeBatch reports the first large-batch flag whose value cannot
// work.
func (o Options) checkLargeBatch() error {
	switch {
	case o.WarmupSteps < 0:
		return fmt.Errorf("-warmup-steps %d: expected 0 or more", o.WarmupSteps)
	case o.ClipNorm < 0 || math.IsNaN(o.ClipNorm) || math.IsInf(o.ClipNorm, 0):
		return fmt.Errorf("-clip-norm %v: expected a positive number, or 0 for no clipping", o.ClipNorm)
	case o.Accumulate < 1:
		return fmt.Errorf("-accumulate %d: expected at least 1", o.Accumulate)
	case o.Steps%o.Accumulate != 0:
		return fmt.Errorf("-steps %d: expected a multiple of -accumulate %d, so that the last step applies", o.Steps, o.Accumulate)
	case o.LR <= 0 || math.IsNaN(o.LR) || math.IsInf(o.LR, 0):
		return fmt.Errorf("-lr %v: expected a positive number", o.LR)
	}
	if o.WarmupSteps > 0 && o.Steps > 0 {
		if err := optimizer.CheckSteps(o.schedule(), int64(o.Steps/o.Accumulate)); err != nil {
			return fmt.Errorf("-warmup-steps %d: %w", o.WarmupSteps, err)
		}
	}
	return nil
}

// schedule returns the learning rate: -lr, after a linear warmup.
func (o Options) schedule() optimizer.Schedule {
	lr := optimizer.Constant(o.LR)
	if o.WarmupSteps == 0 {
		return lr
	}
	return optimizer.Warmup{Steps: int64(o.WarmupSteps), Then: lr}
}

// newOptimizer returns the optimizer the flags ask for: clipped with
// -clip-norm, DP-SGD with -dp-clip, and with loss scaling under
// -mixed-precision mixed_float16.
func newOptimizer(o Options) (strategy.Optimizer, error) {
	opt, err := baseOptimizer(o.Optimizer, o.schedule())
	if err != nil {
		return nil, err
	}
	if o.ClipNorm > 0 {
		if opt, err = optimizer.ClipByGlobalNorm(opt, float32(o.ClipNorm)); err != nil {
			return nil, fmt.Errorf("-clip-norm: %w", err)
		}
	}
	if o.dp != nil {
		if opt, err = o.dp.optimizer(opt, o.Seed); err != nil {
			return nil, fmt.Errorf("-dp-clip: %w", err)
		}
	}
	return models.OptimizerFor(o.MixedPrecision, opt)
}

func baseOptimizer(name string, lr optimizer.Schedule) (strategy.Optimizer, error) {
	switch name {
	case "sgd":
		return optimizer.NewSGD(lr), nil
	case "momentum":
		return optimizer.NewMomentum(lr, 0.9, false), nil
	case "adam":
		return optimizer.NewAdam(lr), nil
	case "adamw":
		return optimizer.NewAdamW(lr)
	case "lars":
		return optimizer.NewLARS(lr)
	case "lamb":
		return optimizer.NewLAMB(lr)
	}
	return nil, fmt.Errorf("-optimizer %q: expected one of %v", name, optimizerNames)
}

// minimizeOptions are the options of the training step's Minimize.
func (o Options) minimizeOptions() []strategy.MinimizeOption {
	if o.Accumulate > 1 {
		return []strategy.MinimizeOption{strategy.WithAccumulation(o.Accumulate)}
	}
	return nil
}
