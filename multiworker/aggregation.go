package multiworker

import (
	"fmt"
	"math"
	"slices"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"
	"go.uber.org/zap"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/faults"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/tfrt"
)

// WithAggregation combines the workers' gradients with rule instead of
// summing them: each worker's gradient of a step, its replicas summed, is
// one vote; the votes are gathered, and every worker computes the rule's
// aggregate of them (aggregate.Median, TrimmedMean, Krum, …), bit for bit
// the same, and applies it scaled by the number of workers, as it would
// the sum. A vote holding NaN or Inf fails the step naming its worker under
// aggregate.Mean, and is discarded as faulty under any other rule. nil
// (the default) sums the gradients with an all-reduce, bucketed and
// overlapped with backpropagation; a rule gathers all of a step's
// gradients at once, after backpropagation. Only tfdist's engine
// aggregates: New refuses a rule with WithCommunication(Ring or NCCL), and
// a rule that cannot work with the number of workers.
func WithAggregation(rule aggregate.Rule) Option { return func(c *config) { c.aggregation = rule } }

// AggregationStats reports what the aggregation rule of WithAggregation
// did on this worker (every worker sees the same).
type AggregationStats struct {
	// Rule names the rule, "" without one.
	Rule string
	// Steps counts the aggregations.
	Steps int64
	// Discarded counts, per worker, the steps whose vote did not count
	// fully (see package aggregate for what each rule discards).
	Discarded []int64
	// LastDiscarded lists the workers whose votes did not count fully in
	// the last step.
	LastDiscarded []int
}

// AggregationStats returns what WithAggregation's rule has done so far.
func (s *Strategy) AggregationStats() AggregationStats {
	if s.voter == nil {
		return AggregationStats{}
	}
	return s.voter.snapshot()
}

// checkAggregation refuses a rule the backend or the group's size cannot
// honour.
func (c config) checkAggregation(workers int) error {
	if c.aggregation == nil {
		return nil
	}
	if c.comm != Auto && c.comm != Engine {
		return fmt.Errorf("multiworker: WithAggregation(%s): only tfdist's collective engine aggregates votes; WithCommunication(%v) can only sum", c.aggregation, c.comm)
	}
	if err := c.aggregation.Check(workers); err != nil {
		return fmt.Errorf("multiworker: WithAggregation: %w", err)
	}
	return nil
}

// voter is the Aggregator of a worker's aggregate ops: the rule, the fault
// hook of tfdist's tests, and the statistics.
type voter struct {
	rule    aggregate.Rule
	workers []string
	log     *zap.Logger

	mu    sync.Mutex
	stats AggregationStats
}

func newVoter(rule aggregate.Rule, workers []string, log *zap.Logger) *voter {
	return &voter{rule: rule, workers: workers, log: log,
		stats: AggregationStats{Rule: rule.String(), Discarded: make([]int64, len(workers))}}
}

// aggregate is a tfrt.Aggregator: out is n times the rule's estimate of the
// honest mean vote, n the number of workers, so that it stands for the sum
// of the gradients.
func (v *voter) aggregate(votes [][]float32, out []float32) error {
	v.mu.Lock()
	step := v.stats.Steps
	v.mu.Unlock()
	votes = faults.CurrentVoteAttack().Apply(step, votes)
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

func (v *voter) record(step int64, discarded []int) {
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
		zap.Int("discarded", len(discarded)), zap.String("workers", v.names(discarded)))
}

func (v *voter) snapshot() AggregationStats {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.stats
	s.Discarded = slices.Clone(s.Discarded)
	s.LastDiscarded = slices.Clone(s.LastDiscarded)
	return s
}

// names names the workers ws.
func (v *voter) names(ws []int) string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = v.workers[w]
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

// ReduceGradients implements strategy.GradientReducer with the rule's
// aggregate op: a worker's vote is its local replicas' gradients summed,
// cast to float32 and concatenated; the aggregate is split back into the
// gradients, cast to their types and copied to every local replica.
func (c *engineOps) ReduceGradients(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	if err := c.check("aggregation", values); err != nil {
		return nil, err
	}
	name := c.name("aggregate")
	hs := s.SubScope(name).WithDevice(c.host)
	k := len(values[0])
	flat, sizes := make([]tf.Output, k), make([]tf.Output, k)
	for i := range k {
		vs := hs.SubScope(fmt.Sprintf("vote_%d", i))
		sum := graphutil.CastTo(vs, local(vs.SubScope("local"), values, i, op.AddN), tf.Float)
		flat[i] = op.Reshape(vs.SubScope("flat"), sum, op.Const(vs.SubScope("minus_one"), []int32{-1}))
		sizes[i] = op.Size(vs.SubScope("size"), sum, op.SizeOutType(tf.Int32))
	}
	vote := op.ConcatV2(hs.SubScope("vote"), flat, op.Const(hs.SubScope("axis"), int32(0)))
	agg := tfrt.Aggregate(hs.SubScope("engine"), vote, c.group, name, c.aggregator)
	parts := op.SplitV(hs.SubScope("split"), agg, op.Pack(hs.SubScope("sizes"), sizes), op.Const(hs.SubScope("split_axis"), int32(0)), int64(k))
	out := make([][]tf.Output, len(values))
	for i := range k {
		gs := hs.SubScope(fmt.Sprintf("gradient_%d", i))
		g := op.Reshape(gs, parts[i], op.Shape(gs.SubScope("shape"), values[0][i]))
		appendPerReplica(out, toReplicas(gs, graphutil.CastTo(gs, g, values[0][i].DataType()), devices))
	}
	return out, s.Err()
}
