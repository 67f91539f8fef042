package multiworker

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/engineops"
	"github.com/tfdist/tfdist/internal/voting"
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
// did on this worker (every worker sees the same); its voters are the
// workers.
type AggregationStats = aggregate.Stats

// AggregationStats returns what WithAggregation's rule has done so far.
func (s *Strategy) AggregationStats() AggregationStats { return s.voter.Stats() }

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

// ReduceGradients implements ingraph.GradientReducer with the rule's
// aggregate op: a worker's vote is its local replicas' gradients summed,
// cast to float32 and concatenated; the aggregate is split back into the
// gradients, cast to their types and copied to every local replica.
func (c *engineOps) ReduceGradients(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	if err := c.check("aggregation", values); err != nil {
		return nil, err
	}
	name := c.name("aggregate")
	ns := s.SubScope(name)
	hs := ns.WithDevice(c.host)
	k := len(values[0])
	sums := make([]tf.Output, k)
	for i := range k {
		sums[i] = sumOnHost(ns.SubScope(fmt.Sprintf("local_%d", i)), c.host, column(values, i), devices)
	}
	agg := engineops.Aggregate(hs.SubScope("engine"), voting.Flatten(hs, sums), c.group, name, c.aggregator)
	grads := voting.Unflatten(hs, agg, voting.Sizes(hs, sums), values[0])
	out := make([][]tf.Output, len(values))
	for i, g := range grads {
		appendPerReplica(out, fromHost(ns.SubScope(fmt.Sprintf("copies_%d", i)), g, devices))
	}
	return out, s.Err()
}
