// Package voting runs an aggregation rule over gradient votes for the
// strategies that offer one: the Aggregator their aggregate ops call, with
// the statistics, and the graph pieces
// that turn a replica's gradients into one vote and the aggregate back
// into gradients.
package voting

import (
	"fmt"
	"math"
	"slices"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/graphutil"
)

// Voter applies a rule to the votes of a step: a engineops.Aggregator.
type Voter struct {
	rule   aggregate.Rule
	voters []string // who casts each vote, for errors and logs
	log    *zap.Logger

	mu    sync.Mutex
	stats aggregate.Stats
}

// New returns a Voter applying rule to the votes of voters, in order.
func New(rule aggregate.Rule, voters []string, log *zap.Logger) *Voter {
	return &Voter{rule: rule, voters: voters, log: log,
		stats: aggregate.Stats{Rule: rule.String(), Discarded: make([]int64, len(voters))}}
}

// Aggregate writes into out n times the rule's estimate of the honest mean
// vote, n the number of votes, so that it stands for their sum. A vote
// holding NaN or Inf fails the step under aggregate.Mean, naming its voter,
// and is discarded under any other rule.
func (v *Voter) Aggregate(votes [][]float32, out []float32) error {
	v.mu.Lock()
	step := v.stats.Steps
	v.mu.Unlock()
	var honest [][]float32
	var index, faulty []int
	for w, vote := range votes {
		if finite(vote) {
			honest, index = append(honest, vote), append(index, w)
		} else {
			faulty = append(faulty, w)
		}
	}
	if len(faulty) > 0 && v.rule.String() == aggregate.Mean().String() {
		return fmt.Errorf("aggregation mean: %s sent a gradient holding NaN or Inf", v.names(faulty))
	}
	if err := v.rule.Check(len(honest)); err != nil {
		return fmt.Errorf("aggregation: %s sent gradients holding NaN or Inf, and of the others: %w", v.names(faulty), err)
	}
	discarded := faulty
	for _, i := range v.rule.Aggregate(honest, out) {
		discarded = append(discarded, index[i])
	}
	slices.Sort(discarded)
	n := float32(len(votes))
	for i := range out {
		out[i] *= n
	}
	v.record(step, discarded)
	return nil
}

func (v *Voter) record(step int64, discarded []int) {
	v.mu.Lock()
	v.stats.Steps++
	v.stats.LastDiscarded = discarded
	for _, w := range discarded {
		v.stats.Discarded[w]++
	}
	v.mu.Unlock()
	level := zap.DebugLevel
	if len(discarded) > 0 {
		level = zap.InfoLevel
	}
	v.log.Log(level, "aggregated votes", zap.String("rule", v.stats.Rule), zap.Int64("step", step),
		zap.Int("discarded", len(discarded)), zap.String("voters", v.names(discarded)))
}

// Stats returns what the rule has done so far.
func (v *Voter) Stats() aggregate.Stats {
	if v == nil {
		return aggregate.Stats{}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.stats
	s.Discarded = slices.Clone(s.Discarded)
	s.LastDiscarded = slices.Clone(s.LastDiscarded)
	return s
}

// names names the voters ws.
func (v *Voter) names(ws []int) string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = v.voters[w]
	}
	return fmt.Sprint(out)
}

func finite(vote []float32) bool {
	for _, x := range vote {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
	}
	return true
}

// Flatten casts grads to float32 and concatenates them into one vector:
// a vote.
func Flatten(s *op.Scope, grads []tf.Output) tf.Output {
	flat := make([]tf.Output, len(grads))
	for i, g := range grads {
		vs := s.SubScope(fmt.Sprintf("vote_%d", i))
		flat[i] = op.Reshape(vs.SubScope("flat"), graphutil.CastTo(vs, g, tf.Float), op.Const(vs.SubScope("minus_one"), []int32{-1}))
	}
	return op.ConcatV2(s.SubScope("vote"), flat, op.Const(s.SubScope("axis"), int32(0)))
}

// Sizes returns the element count of each of grads, for Unflatten.
func Sizes(s *op.Scope, grads []tf.Output) tf.Output {
	n := make([]tf.Output, len(grads))
	for i, g := range grads {
		n[i] = op.Size(s.SubScope(fmt.Sprintf("size_%d", i)), g, op.SizeOutType(tf.Int32))
	}
	return op.Pack(s.SubScope("sizes"), n)
}

// Unflatten splits an aggregate of votes Flatten made back into gradients
// of like's shapes and types.
func Unflatten(s *op.Scope, agg, sizes tf.Output, like []tf.Output) []tf.Output {
	parts := op.SplitV(s.SubScope("split"), agg, sizes, op.Const(s.SubScope("split_axis"), int32(0)), int64(len(like)))
	out := make([]tf.Output, len(like))
	for i, l := range like {
		gs := s.SubScope(fmt.Sprintf("gradient_%d", i))
		g := op.Reshape(gs, parts[i], op.Shape(gs.SubScope("shape"), l))
		out[i] = graphutil.CastTo(gs, g, l.DataType())
	}
	return out
}
