package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// Embedding maps integer ids in [0, InputDim) to rows of a table
// [InputDim, OutputDim], initialised from U(-0.05, 0.05) as Keras does.
// Inputs of any shape [batch, …] give [batch, …, OutputDim]. The table is
// read through Replica.Lookup: under the parameter-server strategy only
// the rows looked up travel, and Minimize updates them with the sparse
// optimizer of strategy.WithSparseOptimizer, or without one updates the
// whole table with the step's optimizer, as Keras does; the synchronous
// strategies update it like any variable.
type Embedding struct {
	InputDim, OutputDim int
}

// Kind implements Spec.
func (Embedding) Kind() string { return "embedding" }

// Build implements Spec.
func (e Embedding) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	if e.InputDim < 1 || e.OutputDim < 1 {
		return nil, nil, fmt.Errorf("Embedding: InputDim %d, OutputDim %d: expected both at least 1", e.InputDim, e.OutputDim)
	}
	table, err := sc.Variable(name+"/embeddings", tf.Float, []int64{int64(e.InputDim), int64(e.OutputDim)}, uniformInit(seed, 0.05))
	if err != nil {
		return nil, nil, err
	}
	return &embedding{table: table, in: in}, append(append([]int64(nil), in...), int64(e.OutputDim)), nil
}

type embedding struct {
	table strategy.Variable
	in    []int64
}

func (e *embedding) Vars() []strategy.Variable { return []strategy.Variable{e.table} }

func (e *embedding) Apply(r strategy.Replica, ids tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(ids, e.in); err != nil {
		return tf.Output{}, err
	}
	return r.Lookup(e.table, ids)
}

// uniformInit draws from U(-limit, limit), seeded.
func uniformInit(seed int64, limit float64) strategy.Initializer {
	return func(s *op.Scope, dtype tf.DataType, shape []int64) (tf.Output, error) {
		return uniform(s, dtype, shape, seed, limit)
	}
}

// PositionEmbedding learns one vector per position of a sequence
// (keras_hub's PositionEmbedding): called on [batch, steps, width], it
// returns the table's first steps rows, [SequenceLength, width]
// Glorot-initialised, broadcast to the input's shape; add them to the
// input to encode positions. A sequence longer than SequenceLength is an
// error when the model is built or, if the model leaves the length open,
// fails the step, naming the layer.
type PositionEmbedding struct {
	SequenceLength int
}

// Kind implements Spec.
func (PositionEmbedding) Kind() string { return "position_embedding" }

// Build implements Spec.
func (p PositionEmbedding) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	if len(in) < 2 || in[len(in)-1] < 0 {
		return nil, nil, fmt.Errorf("PositionEmbedding: input shape %v, expected [batch, steps, width] with a known width", append([]int64{-1}, in...))
	}
	l, err := buildPositions(sc, "PositionEmbedding", name, name+"/embeddings", p.SequenceLength, in, len(in)-1, in[len(in)-1], GlorotUniform(seed))
	if err != nil {
		return nil, nil, err
	}
	return l, in, nil
}

// positions is a table of position embeddings for a layer's inputs of
// shape in, whose steps are on axis (counted from 0, the batch).
type positions struct {
	table   strategy.Variable
	in      []int64
	axis    int
	tooLong string // the error of a longer sequence at run time
}

// buildPositions creates the variable table, [length, width], of the
// layer name of type layer, whose inputs of shape in have their steps on
// axis.
func buildPositions(sc strategy.Scope, layer, name, table string, length int, in []int64, axis int, width int64, init strategy.Initializer) (*positions, error) {
	if err := checkPositions(layer, length, in, axis); err != nil {
		return nil, err
	}
	v, err := sc.Variable(table, tf.Float, []int64{int64(length), width}, init)
	if err != nil {
		return nil, err
	}
	tooLong := fmt.Sprintf("%s %s: input shape %v has sequences longer than SequenceLength %d; steps:", layer, name, append([]int64{-1}, in...), length)
	return &positions{table: v, in: in, axis: axis, tooLong: tooLong}, nil
}

// checkPositions reports a length of no steps, or inputs of shape in
// whose steps, on axis, are more than length.
func checkPositions(layer string, length int, in []int64, axis int) error {
	if length < 1 {
		return fmt.Errorf("%s: SequenceLength %d, expected at least 1", layer, length)
	}
	if steps := in[axis-1]; steps > int64(length) {
		return fmt.Errorf("%s: input shape %v has sequences of %d steps, longer than SequenceLength %d",
			layer, append([]int64{-1}, in...), steps, length)
	}
	return nil
}

func (p *positions) Vars() []strategy.Variable { return []strategy.Variable{p.table} }

func (p *positions) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, p.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "position_embedding")
	pos, err := p.rows(r, b, x)
	if err != nil {
		return tf.Output{}, err
	}
	return b.BroadcastTo(pos, x), b.Err()
}

// rows returns the table's first rows, one per step of x, in x's type.
func (p *positions) rows(r strategy.Replica, b *Builder, x tf.Output) (tf.Output, error) {
	t, err := readAs(r, x.DataType(), b, p.table)
	if err != nil {
		return tf.Output{}, err
	}
	if steps := p.in[p.axis-1]; steps != p.table.Shape()[0] {
		return b.firstRows(t[0], steps, x, p.axis, p.tooLong), nil
	}
	return t[0], nil
}

// TokenAndPositionEmbedding embeds integer ids [batch, steps] in
// [0, VocabularySize) as the sum of a token embedding and a position
// embedding, [batch, steps, EmbeddingDim] (keras_hub's
// TokenAndPositionEmbedding): its variables are
// <name>/token_embedding/embeddings, read as Embedding reads its table,
// and <name>/position_embedding/embeddings, both initialised from U(-0.05,
// 0.05) as keras_hub does. A sequence longer than SequenceLength is an
// error, as PositionEmbedding's.
type TokenAndPositionEmbedding struct {
	VocabularySize, SequenceLength, EmbeddingDim int
}

// Kind implements Spec.
func (TokenAndPositionEmbedding) Kind() string { return "token_and_position_embedding" }

// Build implements Spec.
func (e TokenAndPositionEmbedding) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	const layer = "TokenAndPositionEmbedding"
	if len(in) == 0 {
		return nil, nil, fmt.Errorf("%s: input shape [-1], expected [batch, steps]", layer)
	}
	if e.VocabularySize < 1 || e.EmbeddingDim < 1 {
		return nil, nil, fmt.Errorf("%s: VocabularySize %d, EmbeddingDim %d: expected both at least 1", layer, e.VocabularySize, e.EmbeddingDim)
	}
	if err := checkPositions(layer, e.SequenceLength, in, len(in)); err != nil {
		return nil, nil, err
	}
	tokens, out, err := Embedding{InputDim: e.VocabularySize, OutputDim: e.EmbeddingDim}.Build(sc, name+"/token_embedding", in, seed)
	if err != nil {
		return nil, nil, err
	}
	pos, err := buildPositions(sc, layer, name, name+"/position_embedding/embeddings", e.SequenceLength, in, len(in), int64(e.EmbeddingDim), uniformInit(seed+1, 0.05))
	if err != nil {
		return nil, nil, err
	}
	return &tokenAndPosition{tokens: tokens, pos: pos}, out, nil
}

type tokenAndPosition struct {
	tokens Layer
	pos    *positions
}

func (l *tokenAndPosition) Vars() []strategy.Variable {
	return append(l.tokens.Vars(), l.pos.Vars()...)
}

func (l *tokenAndPosition) Apply(r strategy.Replica, ids tf.Output, training bool) (tf.Output, error) {
	x, err := l.tokens.Apply(r, ids, training)
	if err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "token_and_position_embedding")
	pos, err := l.pos.rows(r, b, x)
	if err != nil {
		return tf.Output{}, err
	}
	return b.Add(x, pos), b.Err()
}
