package optimizer_test

import (
	"fmt"

	"github.com/tfdist/tfdist/optimizer"
)

// A large-batch recipe (Goyal et al., 2017; You et al., 2017): scale the
// rate tuned for batches of 256 to the global batch of 8192, warm up to it
// over the first 50 steps, decay it over the other 950, and train with
// LARS, which leaves biases and normalization variables out of weight
// decay and the trust ratio.
func Example_largeBatch() {
	peak, err := optimizer.ScaleLR(0.1, 256, 8192)
	if err != nil {
		fmt.Println(err)
		return
	}
	const total, warmup = 1000, 50
	sched := optimizer.Warmup{Steps: warmup, Then: optimizer.PolynomialDecay{Initial: peak, DecaySteps: total - warmup, Power: 2}}
	if err := optimizer.CheckSteps(sched, total); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := optimizer.NewLARS(sched, optimizer.WithWeightDecay(5e-5)); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("peak rate", peak)

	// A warmup longer than the run is refused.
	fmt.Println(optimizer.CheckSteps(optimizer.Warmup{Steps: 2000, Then: sched.Then}, total))
	// Output:
	// peak rate 3.2
	// Warmup.Steps is 2000, longer than the 1000 steps of the run: want at most 1000
}
