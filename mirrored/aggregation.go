package mirrored

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/engineops"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/voting"
	"github.com/tfdist/tfdist/logging"
)

// WithAggregation combines the replicas' gradients with rule instead of
// summing them, to tolerate a faulty device: each replica's gradient of a
// step is one vote, and every copy applies the rule's aggregate of the
// votes (aggregate.Median, TrimmedMean, Krum, …) scaled by the number of
// replicas, as it would the sum. A vote holding NaN or Inf fails the step
// naming its replica under aggregate.Mean, and is discarded as faulty
// under any other rule. The votes are combined on the host CPU, after
// backpropagation, in tfdist's Go implementation of the rule. New refuses
// a rule that cannot work with the number of replicas; accumulating
// gradients (strategy.WithAccumulation) is refused at the step.
func WithAggregation(rule aggregate.Rule) Option { return func(c *config) { c.aggregation = rule } }

// AggregationStats returns what WithAggregation's rule has done so far;
// its voters are the replicas, in device order.
func (s *Strategy) AggregationStats() aggregate.Stats { return s.voter.Stats() }

// voteReducer is the ingraph.GradientReducer of WithAggregation: a
// replica's gradients, cast to float32 and concatenated, are its vote; the
// votes are stacked on the host, where an aggregate op combines them, and
// the result is split back into gradients on every replica's device.
type voteReducer struct {
	host       string
	aggregator string // the voter's id (engineops.RegisterAggregator)
}

func (v voteReducer) ReduceGradients(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	if len(values) != len(devices) {
		return nil, fmt.Errorf("aggregation: gradients of %d replicas for %d devices", len(values), len(devices))
	}
	hs := s.SubScope("aggregate").WithDevice(v.host)
	votes := make([]tf.Output, len(values))
	for r, grads := range values {
		votes[r] = voting.Flatten(s.SubScope(fmt.Sprintf("vote_%d", r)).WithDevice(devices[r]), grads)
	}
	sizes := voting.Sizes(hs, values[0])
	rows := op.Unpack(hs.SubScope("rows"), engineops.AggregateRows(hs.SubScope("engine"), op.Pack(hs.SubScope("votes"), votes), v.aggregator), int64(len(values)))
	out := make([][]tf.Output, len(values))
	for r := range values {
		out[r] = voting.Unflatten(s.SubScope(fmt.Sprintf("gradients_%d", r)).WithDevice(devices[r]), rows[r], sizes, values[r])
	}
	return out, s.Err()
}

// newVoter registers the voter of c's rule over the replicas on devices;
// it returns nils without a rule.
func newVoter(c config, devices []string) (*voting.Voter, ingraph.GradientReducer, func(), error) {
	if c.aggregation == nil {
		return nil, nil, func() {}, nil
	}
	if err := c.aggregation.Check(len(devices)); err != nil {
		return nil, nil, nil, fmt.Errorf("mirrored: WithAggregation over %d replicas (one vote each): %w", len(devices), err)
	}
	names := make([]string, len(devices))
	for i, d := range devices {
		names[i] = fmt.Sprintf("replica %d (%s)", i, d)
	}
	v := voting.New(c.aggregation, names, logging.OrNop(c.log))
	id, unregister := engineops.RegisterAggregator(v.Aggregate)
	return v, voteReducer{host: hostDevice(devices), aggregator: id}, unregister, nil
}
