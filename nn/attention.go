package nn

import (
	"fmt"
	"math"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// MultiHeadAttention is Keras' layers.MultiHeadAttention over sequences:
// it projects a query [batch, Tq, dq], a value [batch, Tv, dv] and a key
// [batch, Tv, dk] (the value unless given) to NumHeads heads, lets each
// query position attend to the key positions with the softmax of the
// heads' dot products scaled by 1/√KeyDim, and projects the heads'
// weighted values to an output [batch, Tq, OutputShape].
//
// Call(x, x) is self-attention; CallMasked adds a key and a mask. Its
// inputs, in the order a shared layer (Share) takes them, are query,
// value, then key and then mask when given: a mask without a key takes
// the value as key.
//
// It computes as Keras does without dropout: logits in float32 under a
// 16-bit input (and in the input's type otherwise), masked logits
// replaced by -0.7·3.38953e38, the softmax in that type and cast back.
// A query position whose mask admits no key position attends to all of
// them equally, as there. Its kernels are Glorot-initialised with fans
// as Keras' EinsumDense counts them (a query kernel [dq, heads, KeyDim]
// has fan-in dq and fan-out heads·KeyDim), its biases zero. It computes
// in its input's type, its float32 variables read cast to it (see
// Policy).
type MultiHeadAttention struct {
	// NumHeads is the number of attention heads.
	NumHeads int
	// KeyDim is the size of each head of the query and key; 0 divides
	// the query's width by NumHeads.
	KeyDim int
	// ValueDim is the size of each head of the value; 0 is KeyDim.
	ValueDim int
	// Dropout is the rate at which attention probabilities are dropped
	// while training, with masks drawn as Dropout's.
	Dropout float64
	// NoBias leaves out the projections' biases (Keras' use_bias=False).
	NoBias bool
	// OutputShape is the width of the output; 0 is the query's width.
	OutputShape int
	// UseCausalMask lets query position i attend only to key positions
	// j ≤ i, combined with any mask by logical and.
	UseCausalMask bool
}

// Kind implements AnySpec.
func (MultiHeadAttention) Kind() string { return "multi_head_attention" }

// Call returns the output of a new MultiHeadAttention layer in which
// query attends to value (Keras' layer(query, value)): Call(x, x) is
// self-attention.
func (a MultiHeadAttention) Call(query, value *Tensor) *Tensor {
	return a.CallMasked(query, value, nil, nil)
}

// CallMasked returns the output of a new MultiHeadAttention layer in
// which query attends to value through key (nil: the value), admitting
// only the key positions that mask allows (nil: every one). mask is
// [batch, Tq, Tv] of bool or numbers: true or nonzero attends.
func (a MultiHeadAttention) CallMasked(query, value, key, mask *Tensor) *Tensor {
	xs := []*Tensor{query, value}
	if key == nil && mask != nil {
		key = value
	}
	if key != nil {
		xs = append(xs, key)
	}
	if mask != nil {
		xs = append(xs, mask)
	}
	return callSpec(a, xs)
}

// attentionRoles names the layer's inputs in order.
var attentionRoles = []string{"query", "value", "key", "mask"}

// projection is one of the layer's EinsumDense projections.
type projection struct {
	name     string
	equation string
	kernel   []int64
	inAxes   int // the kernel's leading axes that the equation contracts
}

// BuildMulti implements MultiSpec.
func (a MultiHeadAttention) BuildMulti(sc strategy.Scope, name string, in [][]int64, seed int64) (MultiLayer, []int64, error) {
	g, err := a.geometry(in)
	if err != nil {
		return nil, nil, fmt.Errorf("MultiHeadAttention: %w", err)
	}
	l := &attention{g: g, in: in, perProj: 2}
	if a.NoBias {
		l.perProj = 1
	}
	for i, p := range g.projections(in) {
		k, err := sc.Variable(name+"/"+p.name+"/kernel", tf.Float, p.kernel, einsumGlorot(seed+int64(i)<<32, p.inAxes))
		if err != nil {
			return nil, nil, err
		}
		l.vars = append(l.vars, k)
		if a.NoBias {
			continue
		}
		b, err := sc.Variable(name+"/"+p.name+"/bias", tf.Float, p.kernel[p.inAxes:], strategy.Zeros())
		if err != nil {
			return nil, nil, err
		}
		l.vars = append(l.vars, b)
	}
	if a.Dropout > 0 {
		if l.drop, _, err = (Dropout{Rate: a.Dropout}).Build(sc, name+"/dropout", []int64{g.heads, in[0][0], in[1][0]}, seed); err != nil {
			return nil, nil, err
		}
	}
	return l, []int64{in[0][0], g.out}, nil
}

// attentionGeometry is a MultiHeadAttention's sizes for its inputs.
type attentionGeometry struct {
	heads, keyDim, valueDim, out int64
	causal, masked               bool
}

// projections returns the query, key, value and output projections for
// inputs of the shapes in.
func (g attentionGeometry) projections(in [][]int64) []projection {
	key := in[1]
	if len(in) > 2 {
		key = in[2]
	}
	return []projection{
		{"query", "BTD,DNH->BTNH", []int64{in[0][1], g.heads, g.keyDim}, 1},
		{"key", "BSD,DNH->BSNH", []int64{key[1], g.heads, g.keyDim}, 1},
		{"value", "BSD,DNH->BSNH", []int64{in[1][1], g.heads, g.valueDim}, 1},
		{"attention_output", "BTNH,NHO->BTO", []int64{g.heads, g.valueDim, g.out}, 2},
	}
}

// geometry checks a's settings and its inputs' shapes (without the
// batch) and returns its sizes.
func (a MultiHeadAttention) geometry(in [][]int64) (attentionGeometry, error) {
	if err := checkAttentionShapes(in); err != nil {
		return attentionGeometry{}, err
	}
	g := attentionGeometry{heads: int64(a.NumHeads), keyDim: int64(a.KeyDim), valueDim: int64(a.ValueDim),
		out: int64(a.OutputShape), causal: a.UseCausalMask, masked: len(in) == 4}
	width := in[0][1]
	switch {
	case a.NumHeads < 1:
		return g, fmt.Errorf("NumHeads %d, expected at least 1", a.NumHeads)
	case a.KeyDim < 0:
		return g, fmt.Errorf("KeyDim %d, expected at least 1, or 0 for the query's width over NumHeads", a.KeyDim)
	case a.KeyDim == 0 && width%g.heads != 0:
		return g, fmt.Errorf("NumHeads %d does not divide the query's width %d (query shape %v); give KeyDim or a NumHeads that divides it",
			a.NumHeads, width, withBatch(in[0]))
	case a.ValueDim < 0:
		return g, fmt.Errorf("ValueDim %d, expected at least 1, or 0 for KeyDim", a.ValueDim)
	case a.OutputShape < 0:
		return g, fmt.Errorf("OutputShape %d, expected at least 1, or 0 for the query's width", a.OutputShape)
	case a.Dropout < 0 || a.Dropout >= 1:
		return g, fmt.Errorf("Dropout %v, expected 0 <= Dropout < 1", a.Dropout)
	}
	if g.keyDim == 0 {
		g.keyDim = width / g.heads
	}
	if g.valueDim == 0 {
		g.valueDim = g.keyDim
	}
	if g.out == 0 {
		g.out = width
	}
	return g, nil
}

// checkAttentionShapes reports how the shapes of query, value, key and
// mask (without the batch) do not fit the layer.
func checkAttentionShapes(in [][]int64) error {
	if len(in) < 2 || len(in) > 4 {
		return fmt.Errorf("called on %d inputs %v, expected query, value, then key and mask when given", len(in), in)
	}
	for i, s := range in[:min(len(in), 3)] {
		if len(s) != 2 || s[1] < 1 {
			return fmt.Errorf("%s shape %v, expected [batch, time, features] with features known", attentionRoles[i], withBatch(s))
		}
	}
	if len(in) > 2 && !fitShape(in[2][:1], in[1][:1]) {
		return fmt.Errorf("key shape %v and value shape %v, expected one length", withBatch(in[2]), withBatch(in[1]))
	}
	if len(in) == 4 && !fitShape(in[3], []int64{in[0][0], in[1][0]}) {
		return fmt.Errorf("mask shape %v, expected [batch, query length, value length] = %v (-1: any size)",
			withBatch(in[3]), withBatch([]int64{in[0][0], in[1][0]}))
	}
	return nil
}

// withBatch returns shape with the batch dimension, -1, in front.
func withBatch(shape []int64) []int64 { return append([]int64{-1}, shape...) }

// einsumGlorot is GlorotUniform for a kernel whose first inAxes axes are
// contracted with the input: fan-in is their product, fan-out the
// product of the others, as Keras' EinsumDense counts them.
func einsumGlorot(seed int64, inAxes int) strategy.Initializer {
	return func(s *op.Scope, dtype tf.DataType, shape []int64) (tf.Output, error) {
		flat, err := GlorotUniform(seed)(s, dtype, []int64{prod(shape[:inAxes]), prod(shape[inAxes:])})
		if err != nil {
			return tf.Output{}, err
		}
		return op.Reshape(s.SubScope("reshape"), flat, op.Const(s.SubScope("kernel_shape"), shape)), s.Err()
	}
}

// attention is a built MultiHeadAttention.
type attention struct {
	g       attentionGeometry
	in      [][]int64
	vars    []strategy.Variable // per projection its kernel, then its bias unless NoBias
	perProj int                 // variables per projection
	drop    Layer               // nil without dropout
}

func (l *attention) Vars() []strategy.Variable { return l.vars }

func (l *attention) ApplyMulti(r strategy.Replica, xs []tf.Output, training bool) (tf.Output, error) {
	if len(xs) != len(l.in) {
		return tf.Output{}, fmt.Errorf("%d inputs, expected %d", len(xs), len(l.in))
	}
	for i, x := range xs {
		if err := checkInput(x, l.in[i]); err != nil {
			return tf.Output{}, fmt.Errorf("%s: %w", attentionRoles[i], err)
		}
	}
	b := NewBuilder(r.Scope(), "multi_head_attention")
	w, err := readAs(r, xs[0].DataType(), b, l.vars...)
	if err != nil {
		return tf.Output{}, err
	}
	query, value, key := xs[0], xs[1], xs[1]
	if len(xs) > 2 {
		key = xs[2]
	}
	ps := l.g.projections(l.in)
	q := l.project(b, ps, w, 0, query)
	probs, err := l.probabilities(r, b, q, l.project(b, ps, w, 1, key), l.mask(b, xs), training)
	if err != nil {
		return tf.Output{}, err
	}
	heads := b.Einsum("BNTS,BSNH->BTNH", probs, l.project(b, ps, w, 2, value))
	return l.project(b, ps, w, 3, heads), b.Err()
}

// project applies projection i, of ps, to x.
func (l *attention) project(b *Builder, ps []projection, w []tf.Output, i int, x tf.Output) tf.Output {
	y := b.Einsum(ps[i].equation, x, w[i*l.perProj])
	if l.perProj == 2 {
		y = b.Add(y, w[i*l.perProj+1])
	}
	return y
}

// maskedLogit replaces masked logits: Keras' large negative number for
// float32 logits.
const maskedLogit = -0.7 * 3.38953e38

// probabilities returns the attention probabilities [batch, heads, Tq,
// Tv] of the projected query q and key k, admitting where mask (if any)
// is true, with dropout while training.
func (l *attention) probabilities(r strategy.Replica, b *Builder, q, k, mask tf.Output, training bool) (tf.Output, error) {
	dt := q.DataType()
	ldt := dt
	if isHalf(dt) {
		ldt = tf.Float
	}
	logits := b.Mul(b.Cast(b.Einsum("BTNH,BSNH->BNTS", q, k), ldt), b.Scalar(1/math.Sqrt(float64(l.g.keyDim)), ldt))
	if mask.Op != nil {
		logits = b.Where(mask, logits, b.Scalar(maskedLogit, ldt))
	}
	probs := b.Cast(b.Softmax(logits), dt)
	if l.drop == nil {
		return probs, nil
	}
	return l.drop.Apply(r, probs, training)
}

// mask returns the mask [batch or 1, 1, Tq, Tv] of the key positions
// each query position may attend to: the mask input's and the causal
// mask's logical and; no Output when neither applies.
func (l *attention) mask(b *Builder, xs []tf.Output) tf.Output {
	var m tf.Output
	if l.g.masked {
		if m = xs[3]; m.DataType() != tf.Bool {
			m = op.NotEqual(b.Op(), m, b.Scalar(0, m.DataType()))
		}
	}
	if l.g.causal {
		rows := b.Reshape(op.Range(b.Op(), b.Const(int32(0)), b.dim(xs[0], 1), b.Const(int32(1))), -1, 1)
		cols := b.Reshape(op.Range(b.Op(), b.Const(int32(0)), b.dim(xs[1], 1), b.Const(int32(1))), 1, -1)
		causal := op.GreaterEqual(b.Op(), rows, cols)
		if m.Op == nil {
			m = causal
		} else {
			m = op.LogicalAnd(b.Op(), m, causal)
		}
	}
	if m.Op == nil {
		return m
	}
	return op.ExpandDims(b.Op(), m, b.Const(int32(-3)))
}
