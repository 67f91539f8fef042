package optimizer

import (
	"errors"
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
)

// Schedule is a learning rate as a function of the optimizer's step count
// (0 for the first update), built into the graph.
//
// Every schedule of this package also has a Validate method, which the
// optimizers call before building: a negative, NaN or infinite rate, a
// decay over fewer than one step and the like are errors naming the field.
type Schedule interface {
	// Build returns the float32 learning rate for step (an int64 scalar).
	Build(s *op.Scope, step tf.Output) tf.Output
}

// validateSchedule runs s's Validate method when it has one.
func validateSchedule(s Schedule) error {
	if s == nil {
		return errors.New("learning rate schedule is nil")
	}
	if v, ok := s.(interface{ Validate() error }); ok {
		return v.Validate()
	}
	return nil
}

// Constant is a fixed learning rate.
type Constant float32

// Build implements Schedule.
func (c Constant) Build(s *op.Scope, _ tf.Output) tf.Output { return op.Const(s, float32(c)) }

// Validate checks that the rate is finite and not negative.
func (c Constant) Validate() error { return nonNegative("Constant learning rate", float32(c)) }

// ExponentialDecay is Initial * Rate^(step/DecaySteps), with the exponent
// rounded down when Staircase is set (Keras' ExponentialDecay).
type ExponentialDecay struct {
	Initial    float32
	DecaySteps int64
	Rate       float32
	Staircase  bool
}

// Build implements Schedule.
func (d ExponentialDecay) Build(s *op.Scope, step tf.Output) tf.Output {
	p := op.Div(s.SubScope("p"), op.Cast(s.SubScope("step"), step, tf.Float), op.Const(s.SubScope("decay_steps"), float32(max(d.DecaySteps, 1))))
	if d.Staircase {
		p = op.Floor(s.SubScope("floor"), p)
	}
	return op.Mul(s.SubScope("lr"), op.Const(s.SubScope("initial"), d.Initial), op.Pow(s.SubScope("pow"), op.Const(s.SubScope("rate"), d.Rate), p))
}

// Validate checks the fields: finite rates not below 0, DecaySteps > 0.
func (d ExponentialDecay) Validate() error {
	return errors.Join(nonNegative("ExponentialDecay.Initial", d.Initial), positiveSteps("ExponentialDecay.DecaySteps", d.DecaySteps),
		nonNegative("ExponentialDecay.Rate", d.Rate))
}

// PiecewiseConstant is Values[i] while step < Boundaries[i], and the last
// value afterwards (Keras' PiecewiseConstantDecay). len(Values) must be
// len(Boundaries)+1.
type PiecewiseConstant struct {
	Boundaries []int64
	Values     []float32
}

// Build implements Schedule.
func (p PiecewiseConstant) Build(s *op.Scope, step tf.Output) tf.Output {
	// index = number of boundaries passed; lr = Values[index].
	b := op.Const(s.SubScope("boundaries"), append(p.Boundaries, math.MaxInt64))
	passed := op.Cast(s.SubScope("passed"), op.GreaterEqual(s.SubScope("ge"), op.Reshape(s.SubScope("step"), step, op.Const(s.SubScope("one"), []int32{1})), b), tf.Int32)
	idx := op.Sum(s.SubScope("idx"), passed, op.Const(s.SubScope("axis"), int32(0)))
	return op.GatherV2(s.SubScope("lr"), op.Const(s.SubScope("values"), p.Values), idx, op.Const(s.SubScope("gaxis"), int32(0)))
}

// Validate checks that there is one value more than boundaries, that the
// boundaries increase and that the values are finite and not negative.
func (p PiecewiseConstant) Validate() error {
	if len(p.Values) != len(p.Boundaries)+1 {
		return fmt.Errorf("PiecewiseConstant: %d values for %d boundaries, want %d", len(p.Values), len(p.Boundaries), len(p.Boundaries)+1)
	}
	for i := 1; i < len(p.Boundaries); i++ {
		if p.Boundaries[i] <= p.Boundaries[i-1] {
			return fmt.Errorf("PiecewiseConstant.Boundaries[%d] is %d after %d, want increasing boundaries", i, p.Boundaries[i], p.Boundaries[i-1])
		}
	}
	var errs []error
	for i, v := range p.Values {
		errs = append(errs, nonNegative(fmt.Sprintf("PiecewiseConstant.Values[%d]", i), v))
	}
	return errors.Join(errs...)
}

// CosineDecay goes from Initial to Initial*Alpha over DecaySteps along a
// half cosine, then stays (Keras' CosineDecay; wrap it in a Warmup for
// Keras' warmup_steps and warmup_target).
type CosineDecay struct {
	Initial    float32
	DecaySteps int64
	Alpha      float32
}

// Build implements Schedule.
func (c CosineDecay) Build(s *op.Scope, step tf.Output) tf.Output {
	f := op.Minimum(s.SubScope("frac"), op.Div(s.SubScope("div"), op.Cast(s.SubScope("step"), step, tf.Float),
		op.Const(s.SubScope("decay_steps"), float32(max(c.DecaySteps, 1)))), op.Const(s.SubScope("one"), float32(1)))
	cos := op.Mul(s.SubScope("half"), op.Const(s.SubScope("c05"), float32(0.5)),
		op.Add(s.SubScope("plus1"), op.Const(s.SubScope("c1"), float32(1)), op.Cos(s.SubScope("cos"), op.Mul(s.SubScope("pi"), op.Const(s.SubScope("cpi"), float32(math.Pi)), f))))
	decayed := op.Add(s.SubScope("decayed"), op.Mul(s.SubScope("scale"), op.Const(s.SubScope("one_minus_alpha"), 1-c.Alpha), cos), op.Const(s.SubScope("alpha"), c.Alpha))
	return op.Mul(s.SubScope("lr"), op.Const(s.SubScope("initial"), c.Initial), decayed)
}

// Validate checks the fields: Initial and Alpha finite and not negative,
// DecaySteps > 0.
func (c CosineDecay) Validate() error {
	return errors.Join(nonNegative("CosineDecay.Initial", c.Initial), positiveSteps("CosineDecay.DecaySteps", c.DecaySteps),
		nonNegative("CosineDecay.Alpha", c.Alpha))
}

// PolynomialDecay goes from Initial to End over DecaySteps as
// (Initial-End)·(1-step/DecaySteps)^Power + End, then stays at End
// (Keras' PolynomialDecay). With Cycle, the decay restarts from Initial
// over a span stretched to the next multiple of DecaySteps past the step:
// DecaySteps·ceil(step/DecaySteps), or DecaySteps at step 0.
//
// Power 0 is taken as 1, a linear decay. Keras' defaults are End 1e-4 and
// Power 1; here End is what the field says, 0 if unset.
type PolynomialDecay struct {
	Initial    float32
	DecaySteps int64
	End        float32
	Power      float32
	Cycle      bool
}

// Build implements Schedule.
func (d PolynomialDecay) Build(s *op.Scope, step tf.Output) tf.Output {
	t := op.Cast(s.SubScope("step"), step, tf.Float)
	span := op.Const(s.SubScope("decay_steps"), float32(max(d.DecaySteps, 1)))
	if d.Cycle {
		zero := op.Equal(s.SubScope("at_zero"), t, op.Const(s.SubScope("zero"), float32(0)))
		mult := op.Select(s.SubScope("multiplier"), zero, op.Const(s.SubScope("one"), float32(1)), op.Ceil(s.SubScope("ceil"), op.Div(s.SubScope("cycles"), t, span)))
		span = op.Mul(s.SubScope("span"), span, mult)
	} else {
		t = op.Minimum(s.SubScope("clamp"), t, span)
	}
	p := op.Div(s.SubScope("p"), t, span)
	power := d.Power
	if power == 0 {
		power = 1
	}
	left := op.Pow(s.SubScope("pow"), op.Sub(s.SubScope("remaining"), op.Const(s.SubScope("c1"), float32(1)), p), op.Const(s.SubScope("power"), power))
	return op.Add(s.SubScope("lr"), op.Mul(s.SubScope("scaled"), op.Const(s.SubScope("range"), d.Initial-d.End), left), op.Const(s.SubScope("end"), d.End))
}

// Validate checks the fields: Initial, End and Power finite and not
// negative, DecaySteps > 0.
func (d PolynomialDecay) Validate() error {
	return errors.Join(nonNegative("PolynomialDecay.Initial", d.Initial), positiveSteps("PolynomialDecay.DecaySteps", d.DecaySteps),
		nonNegative("PolynomialDecay.End", d.End), nonNegative("PolynomialDecay.Power", d.Power))
}

// Warmup ramps the learning rate linearly over the first Steps steps, from
// Initial (0 by default) to the rate Then starts with, and then follows
// Then, offset by Steps: the rate at step k ≥ Steps is Then's at k-Steps
// (Goyal et al., 2017's gradual warmup). This is Keras' convention — its
// CosineDecay with warmup_steps W and warmup_target T is
// Warmup{Steps: W, Initial: initial_learning_rate, Then: CosineDecay{Initial: T, …}},
// and the rate at step k < W is (T-Initial)·k/W + Initial — so a run of N
// steps that should end its decay at step N gives Then N-Steps decay
// steps. (TensorFlow Model Garden's LinearWarmup does not offset the
// schedule after the warmup; this one does.)
type Warmup struct {
	Steps   int64
	Initial float32
	Then    Schedule
}

// Build implements Schedule.
func (w Warmup) Build(s *op.Scope, step tf.Output) tf.Output {
	if w.Steps <= 0 {
		return w.Then.Build(s.SubScope("after"), step)
	}
	steps := op.Const(s.SubScope("warmup_steps"), w.Steps)
	later := op.Maximum(s.SubScope("offset"), op.Sub(s.SubScope("sub"), step, steps), op.Const(s.SubScope("zero"), int64(0)))
	after := w.Then.Build(s.SubScope("after"), later)
	target := w.Then.Build(s.SubScope("target"), op.Const(s.SubScope("start"), int64(0)))
	initial := op.Const(s.SubScope("initial"), w.Initial)
	frac := op.Div(s.SubScope("frac"), op.Cast(s.SubScope("step"), step, tf.Float), op.Const(s.SubScope("steps"), float32(w.Steps)))
	warm := op.Add(s.SubScope("warm"), op.Mul(s.SubScope("ramp"), op.Sub(s.SubScope("delta"), target, initial), frac), initial)
	return op.Select(s.SubScope("lr"), op.Less(s.SubScope("warming"), step, steps), warm, after)
}

// Validate checks the fields: Steps not negative, Initial finite and not
// negative, Then a valid schedule.
func (w Warmup) Validate() error {
	var errs []error
	if w.Steps < 0 {
		errs = append(errs, fmt.Errorf("Warmup.Steps is %d, want >= 0", w.Steps))
	}
	errs = append(errs, nonNegative("Warmup.Initial", w.Initial))
	if _, ok := w.Then.(*Adjustable); ok {
		errs = append(errs, errors.New("Warmup.Then is an Adjustable rate, a variable only an optimizer builds, expected a schedule of the step count"))
	} else if err := validateSchedule(w.Then); err != nil {
		errs = append(errs, fmt.Errorf("Warmup.Then: %w", err))
	}
	return errors.Join(errs...)
}

// CheckSteps validates s for a run of total steps: s itself, and every
// Warmup in it (a Warmup's Then included) must be no longer than the run.
// Use it where the number of steps is known, as a trainer's flags give it.
func CheckSteps(s Schedule, total int64) error {
	if total < 1 {
		return fmt.Errorf("total steps is %d, want >= 1", total)
	}
	if err := validateSchedule(s); err != nil {
		return err
	}
	for w, ok := s.(Warmup); ok; w, ok = w.Then.(Warmup) {
		if w.Steps > total {
			return fmt.Errorf("Warmup.Steps is %d, longer than the %d steps of the run: want at most %d", w.Steps, total, total)
		}
	}
	return nil
}

// nonNegative checks that the float32 hyperparameter what is finite and not
// negative.
func nonNegative(what string, v float32) error {
	if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return fmt.Errorf("%s is %v, want a finite value >= 0", what, v)
	}
	return nil
}

// positiveSteps checks that the step count what is at least 1.
func positiveSteps(what string, n int64) error {
	if n < 1 {
		return fmt.Errorf("%s is %d, want >= 1", what, n)
	}
	return nil
}
