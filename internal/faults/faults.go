// Package faults injects faults into tfdist runs for tfdist's own tests:
// a worker whose gradient votes are corrupted on purpose, so that tests
// can show what each aggregation rule withstands. The attack comes in as
// the aggregation rule a strategy is given (VoteAttack.Rule), or, for a
// NaN vote, as a replica whose gradients are poisoned: no strategy holds
// a hook for it. It is not part of the public API.
package faults

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/tfdist/tfdist/aggregate"
)

// Attack kinds.
const (
	// SignFlip replaces the worker's vote by -Scale times itself.
	SignFlip = "signflip"
	// Noise replaces it by Gaussian noise whose standard deviation is
	// Scale times the root mean square of the honest votes' elements: noise
	// that keeps dominating as the gradients grow.
	Noise = "noise"
	// LittleIsEnough replaces it by the honest votes' mean minus Scale
	// times their standard deviation, coordinate by coordinate (Baruch et
	// al., 2019); Scale 0 takes z from the paper's formula for the group's
	// size and one attacker.
	LittleIsEnough = "alie"
	// NaN replaces it by NaNs, as a faulty device's overflow would.
	NaN = "nan"
)

// VoteAttack corrupts one worker's gradient vote, as every worker sees it
// once the votes are gathered: an omniscient attacker, the strongest case.
type VoteAttack struct {
	Worker int     // the faulty worker's index
	Kind   string  // SignFlip, Noise or LittleIsEnough
	Scale  float64 // see the kinds
	Seed   uint64  // of Noise
}

// Rule returns inner with a's attack applied to the votes before inner
// aggregates them, counting the steps from 0 (Noise's seed): the rule to
// give a strategy (WithAggregation) for an omniscient attacker. It names
// itself as inner does. A NaN vote is set aside before any rule sees it,
// so Kind NaN is refused: poison the faulty replica's gradients instead.
func (a *VoteAttack) Rule(inner aggregate.Rule) (aggregate.Rule, error) {
	switch {
	case inner == nil:
		return nil, errors.New("faults: nil rule")
	case a.Kind == NaN:
		return nil, fmt.Errorf("faults: kind %s: the strategy sets a NaN vote aside before the rule sees it; poison the replica's gradients instead", NaN)
	}
	return &attacked{Rule: inner, a: a}, nil
}

// attacked is a Rule whose votes an attack corrupts.
type attacked struct {
	aggregate.Rule
	a    *VoteAttack
	mu   sync.Mutex
	step int64
}

func (r *attacked) Aggregate(votes [][]float32, out []float32) []int {
	r.mu.Lock()
	step := r.step
	r.step++
	r.mu.Unlock()
	return r.Rule.Aggregate(r.a.Apply(step, votes), out)
}

// ParseVoteAttack reads "worker=W,kind=K[,scale=S][,seed=N]".
func ParseVoteAttack(s string) (*VoteAttack, error) {
	a := &VoteAttack{Worker: -1, Scale: math.NaN()}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		var err error
		switch {
		case !ok:
			err = fmt.Errorf("expected key=value")
		case k == "worker":
			a.Worker, err = strconv.Atoi(v)
		case k == "kind":
			a.Kind = v
		case k == "scale":
			a.Scale, err = strconv.ParseFloat(v, 64)
		case k == "seed":
			a.Seed, err = strconv.ParseUint(v, 10, 64)
		default:
			err = fmt.Errorf("unknown key %q", k)
		}
		if err != nil {
			return nil, fmt.Errorf("vote attack %q: %q: %w", s, kv, err)
		}
	}
	defaults := map[string]float64{SignFlip: 100, Noise: 100, LittleIsEnough: 0, NaN: 0}
	d, known := defaults[a.Kind]
	switch {
	case !known:
		return nil, fmt.Errorf("vote attack %q: kind %q: expected %s, %s, %s or %s", s, a.Kind, SignFlip, Noise, LittleIsEnough, NaN)
	case a.Worker < 0:
		return nil, fmt.Errorf("vote attack %q: expected worker=W, W >= 0", s)
	case math.IsNaN(a.Scale):
		a.Scale = d
	}
	return a, nil
}

// Apply returns votes with the attacker's vote replaced, at the given
// step; the other votes, and the slices of votes, are not changed. It does
// nothing when the attacker is not among the votes.
func (a *VoteAttack) Apply(step int64, votes [][]float32) [][]float32 {
	if a == nil || a.Worker >= len(votes) {
		return votes
	}
	bad := make([]float32, len(votes[a.Worker]))
	switch a.Kind {
	case SignFlip:
		for i, x := range votes[a.Worker] {
			bad[i] = float32(-a.Scale * float64(x))
		}
	case Noise:
		r := rand.New(rand.NewPCG(a.Seed, uint64(step)))
		sigma := a.Scale * a.honestRMS(votes)
		for i := range bad {
			bad[i] = float32(sigma * r.NormFloat64())
		}
	case LittleIsEnough:
		a.littleIsEnough(votes, bad)
	case NaN:
		for i := range bad {
			bad[i] = float32(math.NaN())
		}
	}
	out := append([][]float32(nil), votes...)
	out[a.Worker] = bad
	return out
}

// honestRMS returns the root mean square of the other votes' elements.
func (a *VoteAttack) honestRMS(votes [][]float32) float64 {
	var sq float64
	var n int
	for w, v := range votes {
		if w == a.Worker {
			continue
		}
		for _, x := range v {
			sq += float64(x) * float64(x)
		}
		n += len(v)
	}
	if n == 0 {
		return 0
	}
	return math.Sqrt(sq / float64(n))
}

// littleIsEnough writes mean - z·std of the other votes into bad.
func (a *VoteAttack) littleIsEnough(votes [][]float32, bad []float32) {
	z := a.Scale
	if z == 0 {
		z = alieZ(len(votes), 1)
	}
	n := float64(len(votes) - 1)
	for i := range bad {
		var sum, sq float64
		for w, v := range votes {
			if w != a.Worker {
				sum += float64(v[i])
				sq += float64(v[i]) * float64(v[i])
			}
		}
		mean := sum / n
		std := math.Sqrt(math.Max(sq/n-mean*mean, 0))
		bad[i] = float32(mean - z*std)
	}
}

// alieZ is Baruch et al.'s z for n workers of which f attack: the largest
// z for which s = floor(n/2+1) - f workers' honest values lie within z
// standard deviations of the mean with probability (n-s)/n.
func alieZ(n, f int) float64 {
	s := n/2 + 1 - f
	p := float64(n-s) / float64(n)
	return math.Sqrt2 * math.Erfinv(2*p-1)
}
