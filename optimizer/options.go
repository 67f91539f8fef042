package optimizer

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/tfdist/tfdist/strategy"
)

// Option sets a hyperparameter of AdamW, LARS or LAMB. Each constructor
// takes the options of its own hyperparameters and refuses the others,
// naming them; an option's value is checked by the constructor.
type Option struct {
	name string
	set  func(*hyper)
}

// hyper holds the hyperparameters that Options set.
type hyper struct {
	weightDecay, beta1, beta2, epsilon, momentum, eta float32
	nesterov                                          bool
	decayExclude, adaptExclude                        []string
	adaptSet                                          bool // adaptExclude was given
}

// WithWeightDecay sets the weight decay rate (AdamW, LARS, LAMB).
func WithWeightDecay(wd float32) Option {
	return Option{"WithWeightDecay", func(h *hyper) { h.weightDecay = wd }}
}

// WithBetas sets the decay rates of the first and second moment estimates
// (AdamW, LAMB).
func WithBetas(beta1, beta2 float32) Option {
	return Option{"WithBetas", func(h *hyper) { h.beta1, h.beta2 = beta1, beta2 }}
}

// WithEpsilon sets the constant added to a denominator for numerical
// stability (AdamW, LARS, LAMB).
func WithEpsilon(eps float32) Option {
	return Option{"WithEpsilon", func(h *hyper) { h.epsilon = eps }}
}

// WithMomentum sets the momentum (LARS).
func WithMomentum(m float32) Option {
	return Option{"WithMomentum", func(h *hyper) { h.momentum = m }}
}

// WithNesterov selects Nesterov momentum (LARS).
func WithNesterov(nesterov bool) Option {
	return Option{"WithNesterov", func(h *hyper) { h.nesterov = nesterov }}
}

// WithTrustCoefficient sets LARS's trust coefficient η (eta).
func WithTrustCoefficient(eta float32) Option {
	return Option{"WithTrustCoefficient", func(h *hyper) { h.eta = eta }}
}

// ExcludeFromWeightDecay replaces the patterns of the variables that get no
// weight decay (AdamW, LARS, LAMB): regular expressions, any of which
// matching somewhere in a variable's name excludes it (Go's regexp syntax;
// anchor with ^ and $). No patterns exclude nothing. Under LARS and LAMB
// the variables excluded from weight decay are also excluded from layer
// adaptation unless ExcludeFromLayerAdaptation says otherwise, as in
// TensorFlow Addons' LAMB.
//
// Patterns see the variable's name: under the parameter-server strategy,
// a shard's "/part_<k>" suffix is removed first, so a pattern excludes
// every shard of the variables it names.
func ExcludeFromWeightDecay(patterns ...string) Option {
	return Option{"ExcludeFromWeightDecay", func(h *hyper) { h.decayExclude = slices.Clone(patterns) }}
}

// ExcludeFromLayerAdaptation replaces the patterns of the variables whose
// trust ratio is 1 (LARS, LAMB), as ExcludeFromWeightDecay's patterns.
func ExcludeFromLayerAdaptation(patterns ...string) Option {
	return Option{"ExcludeFromLayerAdaptation", func(h *hyper) { h.adaptExclude, h.adaptSet = slices.Clone(patterns), true }}
}

// DefaultExclusions returns the patterns LARS and LAMB exclude from weight
// decay and layer adaptation by default: biases and the scales and offsets
// of normalizations, the last part of a variable's name being "bias",
// "gamma" or "beta" (nn.Dense, nn.Conv2D, nn.LayerNorm and nn.BatchNorm
// name theirs "<layer>/bias", "<layer>/gamma" and "<layer>/beta"), or
// "scale" or "offset" (other libraries' names for gamma and beta).
func DefaultExclusions() []string {
	return []string{`(^|/)bias$`, `(^|/)(gamma|beta)$`, `(^|/)(scale|offset)$`}
}

// newHyper applies opts over defaults for the optimizer owner, which takes
// the options named in accepted, and checks every hyperparameter.
func newHyper(owner string, h hyper, accepted []string, opts []Option) (hyper, error) {
	for _, o := range opts {
		if !slices.Contains(accepted, o.name) {
			return hyper{}, fmt.Errorf("%s: option %s does not apply: %s takes %s", owner, o.name, owner, strings.Join(accepted, ", "))
		}
		o.set(&h)
	}
	if !h.adaptSet {
		h.adaptExclude = h.decayExclude
	}
	if err := h.validate(); err != nil {
		return hyper{}, fmt.Errorf("%s: %w", owner, err)
	}
	return h, nil
}

func (h hyper) validate() error {
	return errors.Join(
		nonNegative("weight decay", h.weightDecay),
		fraction("beta1", h.beta1),
		fraction("beta2", h.beta2),
		nonNegative("epsilon", h.epsilon),
		between("momentum", h.momentum, 0, 1),
		nonNegative("trust coefficient", h.eta),
	)
}

// between checks that the hyperparameter what is in [lo, hi].
func between(what string, v, lo, hi float32) error {
	if !(v >= lo && v <= hi) { // NaN too
		return fmt.Errorf("%s is %v, want a value in [%v, %v]", what, v, lo, hi)
	}
	return nil
}

// fraction checks that the hyperparameter what is in [0, 1).
func fraction(what string, v float32) error {
	if !(v >= 0 && v < 1) { // NaN too
		return fmt.Errorf("%s is %v, want a value in [0, 1)", what, v)
	}
	return nil
}

// exclusions matches variable names against patterns.
type exclusions []*regexp.Regexp

func compileExclusions(what string, patterns []string) (exclusions, error) {
	var ex exclusions
	for _, p := range patterns {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("%s pattern %q: %w", what, p, err)
		}
		ex = append(ex, re)
	}
	return ex, nil
}

// shardSuffix is the part of a parameter-server shard's name after its
// variable's.
var shardSuffix = regexp.MustCompile(`/part_[0-9]+$`)

// match reports whether a pattern matches v's name, without a shard's
// suffix.
func (ex exclusions) match(v strategy.Variable) bool {
	name := shardSuffix.ReplaceAllString(v.Name(), "")
	return slices.ContainsFunc(ex, func(re *regexp.Regexp) bool { return re.MatchString(name) })
}
