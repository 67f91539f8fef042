package classifier

import (
	"flag"
	"fmt"

	"github.com/tfdist/tfdist/aggregate"
	"github.com/tfdist/tfdist/internal/faults"
	"github.com/tfdist/tfdist/multiworker"
)

func registerRobustFlags(fs *flag.FlagSet, o *Options) {
	fs.StringVar(&o.Aggregation, "aggregation", "", "multiworker, mirrored: combine the workers' (replicas') gradients with `RULE` instead of summing them: mean, median, trimmed_mean(f), krum(f), multi_krum(f,m) or centered_clip(tau,iterations)")
	fs.StringVar(&o.Compression, "compression", "none", "multiworker: send gradients between workers as `C`: none, fp16 or bf16 (summed in float32 at every hop), int8 (summed exactly in 256-element blocks of a shared scale), or topk(ratio) (the largest ratio of each gradient's elements, the rest fed back into the next step)")
}

// compression returns the compression of -compression.
func (o Options) compression() (multiworker.Compression, error) {
	c, err := multiworker.ParseCompression(o.Compression)
	switch {
	case err != nil:
		return c, fmt.Errorf("-compression: %w", err)
	case c != multiworker.None && o.Strategy != "multiworker":
		return c, fmt.Errorf("-compression %s: only -strategy multiworker sends gradients between workers (-strategy %s cannot honour it)", o.Compression, o.Strategy)
	}
	return c, nil
}

// aggregation returns the rule of -aggregation, nil without one.
func (o Options) aggregation() (aggregate.Rule, error) {
	if o.Aggregation == "" {
		return nil, nil
	}
	r, err := aggregate.Parse(o.Aggregation)
	if err != nil {
		return nil, fmt.Errorf("-aggregation: %w", err)
	}
	if o.Strategy != "multiworker" && o.Strategy != "mirrored" {
		return nil, fmt.Errorf("-aggregation %s: only -strategy multiworker (a vote per worker) and mirrored (a vote per replica) combine votes (-strategy %s cannot honour it)", r, o.Strategy)
	}
	if a := o.Faults.VoteAttack; a != nil && a.Kind != faults.NaN {
		return a.Rule(r)
	}
	return r, nil
}

// gradientOptions returns the multiworker options of -aggregation and
// -compression.
func (o Options) gradientOptions() ([]multiworker.Option, error) {
	r, err := o.aggregation()
	if err != nil {
		return nil, err
	}
	c, err := o.compression()
	if err != nil {
		return nil, err
	}
	opts := []multiworker.Option{multiworker.WithCompression(c)}
	if r != nil {
		opts = append(opts, multiworker.WithAggregation(r))
	}
	return opts, nil
}

// aggregationResult adds what the aggregation rule did to res, and returns
// the scalars TensorBoard records of it.
func aggregationResult(s any, res *Result) map[string]float64 {
	v, ok := s.(interface{ AggregationStats() aggregate.Stats })
	if !ok {
		return nil
	}
	st := v.AggregationStats()
	if st.Rule == "" {
		return nil
	}
	res.Aggregation, res.DiscardedVotes = st.Rule, st.Discarded
	return map[string]float64{"aggregation/discarded_votes": float64(len(st.LastDiscarded))}
}
