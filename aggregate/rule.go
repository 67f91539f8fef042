package aggregate

import (
	"fmt"
	"math"
	"strconv"
)

// Rule combines the workers' votes into the one update every worker applies.
type Rule interface {
	// String names the rule and its parameters as Parse reads them:
	// "mean", "median", "trimmed_mean(1)", "krum(1)", "multi_krum(1,3)",
	// "centered_clip(10,3)".
	String() string
	// Check returns nil when the rule can aggregate the votes of n
	// workers, or an error naming the rule, its parameters, n and what is
	// needed.
	Check(n int) error
	// Aggregate writes into out the rule's estimate of the honest workers'
	// mean vote and returns, sorted ascending, the indices of the votes
	// that did not count fully; nil when all counted. It panics when
	// Check(len(votes)) fails or a vote's length differs from len(out).
	// The votes must be finite, which Aggregate does not check, and must
	// not overlap out.
	Aggregate(votes [][]float32, out []float32) []int
}

// Mean returns the rule that averages the votes. One Byzantine vote can
// move it anywhere.
func Mean() Rule { return mean{} }

// Median returns the rule that takes the coordinate-wise median of the
// votes, the mean of the two middle values when their number is even.
func Median() Rule { return median{} }

// TrimmedMean returns the rule that, in each coordinate, drops the f
// largest and the f smallest values and averages the rest. It needs more
// than 2f workers.
func TrimmedMean(f int) Rule {
	r := trimmedMean{f}
	if f < 0 {
		return invalid{r.String(), "f must be >= 0"}
	}
	return r
}

// Krum returns the Krum rule of Blanchard et al. (2017) for at most f
// Byzantine workers: it picks the vote whose summed squared distance to
// its n-f-2 nearest other votes is least, the lowest index on ties. It
// needs more than 2f+2 workers.
func Krum(f int) Rule { return newKrum(f, 1, false) }

// MultiKrum returns the rule that averages the m votes with the lowest
// Krum scores for at most f Byzantine workers, preferring lower indices
// on ties. It needs more than 2f+2 workers and at least f+m. MultiKrum(f,
// 1) gives the same results as Krum(f).
func MultiKrum(f, m int) Rule { return newKrum(f, m, true) }

func newKrum(f, m int, multi bool) Rule {
	r := krum{f, m, multi}
	switch {
	case f < 0:
		return invalid{r.String(), "f must be >= 0"}
	case m < 1:
		return invalid{r.String(), "m must be >= 1"}
	}
	return r
}

// CenteredClip returns the stateless centered clipping rule of
// Karimireddy et al. (2021): starting from the coordinate-wise median v,
// it repeats iterations times v += (1/n) Σᵢ (xᵢ-v)·min(1, tau/‖xᵢ-v‖).
// tau must be positive and finite and iterations at least 1.
func CenteredClip(tau float64, iterations int) Rule {
	r := centeredClip{tau, iterations}
	switch {
	case !(tau > 0) || math.IsInf(tau, 1):
		return invalid{r.String(), "tau must be > 0 and finite"}
	case iterations < 1:
		return invalid{r.String(), "iterations must be >= 1"}
	}
	return r
}

type (
	mean        struct{}
	median      struct{}
	trimmedMean struct{ f int }
	krum        struct {
		f, m  int
		multi bool // named multi_krum rather than krum
	}
	centeredClip struct {
		tau        float64
		iterations int
	}
	// invalid is a rule made with bad parameters: its Check always fails.
	invalid struct{ name, reason string }
)

func (mean) String() string          { return "mean" }
func (median) String() string        { return "median" }
func (r trimmedMean) String() string { return fmt.Sprintf("trimmed_mean(%d)", r.f) }
func (r invalid) String() string     { return r.name }

func (r krum) String() string {
	if r.multi {
		return fmt.Sprintf("multi_krum(%d,%d)", r.f, r.m)
	}
	return fmt.Sprintf("krum(%d)", r.f)
}

func (r centeredClip) String() string {
	return fmt.Sprintf("centered_clip(%s,%d)", strconv.FormatFloat(r.tau, 'g', -1, 64), r.iterations)
}

func (r mean) Check(n int) error         { return atLeastOne(r, n) }
func (r median) Check(n int) error       { return atLeastOne(r, n) }
func (r centeredClip) Check(n int) error { return atLeastOne(r, n) }
func (r invalid) Check(int) error        { return fmt.Errorf("aggregate: %s: %s", r.name, r.reason) }

func (r trimmedMean) Check(n int) error {
	if n >= 1 && r.f <= (n-1)/2 { // n > 2f without overflow
		return nil
	}
	return fmt.Errorf("aggregate: %v needs more than 2f = %d workers, got %d", r, 2*r.f, n)
}

func (r krum) Check(n int) error {
	if n < 3 || r.f > (n-3)/2 { // n <= 2f+2 without overflow
		return fmt.Errorf("aggregate: %v needs more than 2f+2 = %d workers, got %d", r, 2*r.f+2, n)
	}
	if r.m > n-r.f {
		return fmt.Errorf("aggregate: %v needs at least f+m = %d workers, got %d", r, r.f+r.m, n)
	}
	return nil
}

func atLeastOne(r Rule, n int) error {
	if n >= 1 {
		return nil
	}
	return fmt.Errorf("aggregate: %v needs at least 1 worker, got %d", r, n)
}

// prepare panics unless r can aggregate votes into out.
func prepare(r Rule, votes [][]float32, out []float32) {
	if err := r.Check(len(votes)); err != nil {
		panic(err)
	}
	for i, v := range votes {
		if len(v) != len(out) {
			panic(fmt.Sprintf("aggregate: %v: vote %d has %d elements, out has %d", r, i, len(v), len(out)))
		}
	}
}

func (r invalid) Aggregate(votes [][]float32, out []float32) []int {
	prepare(r, votes, out)
	return nil // not reached: Check fails
}

// Stats reports what a strategy's rule did: the same on every worker.
type Stats struct {
	// Rule names the rule, "" without one.
	Rule string
	// Steps counts the aggregations.
	Steps int64
	// Discarded counts, per voter (a worker under multiworker, a replica
	// under mirrored), the steps whose vote did not count fully (see Rule
	// for what each rule discards).
	Discarded []int64
	// LastDiscarded lists the voters whose votes did not count fully in
	// the last step.
	LastDiscarded []int
}
