package train

import (
	"fmt"
	"slices"
	"sync"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/paramserver"
	"github.com/tfdist/tfdist/strategy"
)

// Strategy is what a model trains under: any strategy.Strategy (the
// default strategy, mirrored, multiworker), or a *paramserver.Strategy on
// its chief, whose coordinator then schedules the steps on the workers.
type Strategy interface {
	Scope(fn func(strategy.Scope) error) error
	Variables() []strategy.Variable
}

// Data keys: the names of the tensors of a dataset's elements that Fit,
// Evaluate and Predict read, as Keras reads (x, y, sample_weight).
const (
	// KeyX is the input of a model of one input. Each input of a model is
	// also read from its own name (nn.Input(…).Named), which a model of
	// several inputs needs.
	KeyX = "x"
	// KeyY is the labels, the target of the model's output.
	KeyY = "y"
	// KeySampleWeight is each example's weight in the loss and the
	// metrics, when an element has it ([batch] or [batch, 1]).
	KeySampleWeight = "sample_weight"
)

// Trainer is a model compiled with a loss, an optimizer and metrics for a
// strategy: Keras's compiled Model. Fit trains it, Evaluate scores it and
// Predict runs it, on every replica of every worker the strategy has. Its
// steps are built on the first call that sees data. A Trainer is not safe
// for concurrent use.
type Trainer struct {
	model *nn.Model
	loss  Loss
	opt   strategy.Optimizer
	cfg   config
	eng   engine
	mu    sync.Mutex
	steps map[string]any // built steps, by kind and input spec
	sizes []int          // the number of sums of each metric
	// rateReplicas is the replicas the rate is scaled for after a Fit
	// with PerReplicaBatch.
	rateReplicas int
}

// Compile returns a Trainer of m under s: m's loss, as loss computes it on
// its one output, minimized by opt, and the metrics WithMetrics names. m
// must have been made in s's Scope.
func Compile(s Strategy, m *nn.Model, loss Loss, opt strategy.Optimizer, opts ...Option) (*Trainer, error) {
	switch {
	case m == nil:
		return nil, fmt.Errorf("train: Compile: nil model")
	case loss == nil:
		return nil, fmt.Errorf("train: Compile: model %s: nil loss", m.Name())
	case opt == nil:
		return nil, fmt.Errorf("train: Compile: model %s: nil optimizer", m.Name())
	case m.OutputCount() != 1:
		return nil, fmt.Errorf("train: Compile: model %s has %d outputs; Fit trains a model of one output (a custom step, WithTrainStep, may train several)", m.Name(), m.OutputCount())
	}
	cfg := newConfig(opts)
	if err := cfg.check(); err != nil {
		return nil, err
	}
	t := &Trainer{model: m, loss: loss, opt: opt, cfg: cfg, steps: map[string]any{}}
	switch s := s.(type) {
	case *paramserver.Strategy:
		e, err := newPSEngine(s)
		if err != nil {
			return nil, err
		}
		t.eng = e
	case strategy.Strategy:
		t.eng = &syncEngine{s: s}
	default:
		return nil, fmt.Errorf("train: Compile: strategy of type %T, expected a strategy.Strategy or a *paramserver.Strategy", s)
	}
	return t, nil
}

// Model returns the compiled model.
func (t *Trainer) Model() *nn.Model { return t.model }

// Strategy returns the strategy the model trains under.
func (t *Trainer) Strategy() Strategy { return t.eng.strategy() }

// IsChief reports whether this process is the one of its job that writes
// what only one should (checkpoints, logs, exports): the chief of a
// multiworker job, the coordinator of parameter servers, any process of a
// one-process strategy.
func (t *Trainer) IsChief() bool { return t.eng.isChief() }

// Close releases what the Trainer holds beyond its strategy: the
// coordinator of parameter servers, which it stops. The strategy stays
// open.
func (t *Trainer) Close() error { return t.eng.close() }

// keys says which tensors of an element feed a model.
type keys struct {
	inputs []string // one per model input, in order
	weight bool     // the elements have sample weights
	labels bool
}

// keysFor matches an element's tensors to the model's inputs, checking
// their types and shapes, and finds the labels and weights.
func (t *Trainer) keysFor(e dataset.Element, needLabels bool) (keys, error) {
	var k keys
	infos := t.model.Inputs()
	for _, in := range infos {
		key := in.Name
		if _, ok := e[key]; !ok && len(infos) == 1 {
			key = KeyX
		}
		v, ok := e[key]
		if !ok {
			return k, fmt.Errorf("the data's elements have no %q for input %q of model %s (they have %v)", key, in.Name, t.model.Name(), sortedKeys(e))
		}
		if err := checkTensor(key, v, in.DType, in.Shape, "input "+in.Name); err != nil {
			return k, err
		}
		k.inputs = append(k.inputs, key)
	}
	_, k.labels = e[KeyY]
	if needLabels && !k.labels {
		return k, fmt.Errorf("the data's elements have no labels %q (they have %v); Fit and Evaluate need them", KeyY, sortedKeys(e))
	}
	_, k.weight = e[KeySampleWeight]
	return k, nil
}

// checkTensor checks one batch tensor against the dtype and per-example
// shape it must have.
func checkTensor(key string, v *tf.Tensor, dtype tf.DataType, shape []int64, what string) error {
	got := v.Shape()
	ok := len(got) == len(shape)+1
	for i := 0; ok && i < len(shape); i++ {
		ok = shape[i] < 0 || got[i+1] == shape[i]
	}
	sameType := v.DataType() == dtype || (graphutil.IsFloat(v.DataType()) && graphutil.IsFloat(dtype))
	if !ok || !sameType {
		return fmt.Errorf("the data's %q is %s of shape %v, expected %s of shape %s (batch, then %v) for %s",
			key, graphutil.DTypeName(v.DataType()), got, graphutil.DTypeName(dtype), shapeString(append([]int64{-1}, shape...)), shape, what)
	}
	return nil
}

func sortedKeys(e dataset.Element) []string {
	out := make([]string, 0, len(e))
	for k := range e {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// spec returns the input spec of the element's tensors a step reads.
func (k keys) spec(e dataset.Element) strategy.InputSpec {
	spec := strategy.InputSpec{}
	add := func(name string) {
		shape := slices.Clone(e[name].Shape())
		shape[0] = -1
		spec[name] = strategy.TensorSpec{DType: e[name].DataType(), Shape: shape}
	}
	for _, name := range k.inputs {
		add(name)
	}
	if k.labels {
		add(KeyY)
	}
	if k.weight {
		add(KeySampleWeight)
	}
	return spec
}

// stepKind is what a built step does.
type stepKind string

const (
	trainStep   stepKind = "train"
	testStep    stepKind = "test"
	predictStep stepKind = "predict"
)

// logsOutput is the reduced output of train and test steps: the loss, the
// examples and every metric's sums, one float32 vector.
const logsOutput = "train_logs"

// predOutput is the per-replica output of the predict step.
const predOutput = "y_pred"

// step returns the step of kind for elements like e, building it on first
// use.
func (t *Trainer) step(kind stepKind, e dataset.Element) (any, keys, error) {
	k, err := t.keysFor(e, kind != predictStep)
	if err != nil {
		return nil, k, err
	}
	spec := k.spec(e)
	id := fmt.Sprint(kind, spec)
	t.mu.Lock()
	defer t.mu.Unlock()
	if st, ok := t.steps[id]; ok {
		return st, k, nil
	}
	var fn strategy.ReplicaFn
	switch kind {
	case trainStep:
		fn = t.trainFn(k)
	case testStep:
		fn = t.testFn(k)
	default:
		fn = t.predictFn(k)
	}
	st, err := t.eng.build(spec, fn)
	if err != nil {
		return nil, k, fmt.Errorf("%s step: %w", kind, err)
	}
	t.steps[id] = st
	return st, k, nil
}

// trainFn is the training step: the compiled loss minimized, or the
// custom step's.
func (t *Trainer) trainFn(k keys) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := &StepContext{t: t, k: k, in: in}
		var loss, yPred tf.Output
		var err error
		if t.cfg.trainStep != nil {
			loss, yPred, err = t.cfg.trainStep(r, in, sc)
		} else {
			loss, yPred, err = sc.defaultTrain(r)
		}
		if err != nil {
			return nil, err
		}
		return nil, t.reduceLogs(r, in, k, loss, yPred)
	}
}

// testFn is the evaluation step: the loss and the metrics, in inference
// mode.
func (t *Trainer) testFn(k keys) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := &StepContext{t: t, k: k, in: in}
		yPred, err := sc.Predict(r, false)
		if err != nil {
			return nil, err
		}
		loss, err := sc.Loss(r, yPred)
		if err != nil {
			return nil, err
		}
		return nil, t.reduceLogs(r, in, k, loss, yPred)
	}
}

// predictFn is the prediction step: the model's output, per replica.
func (t *Trainer) predictFn(k keys) strategy.ReplicaFn {
	return func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		sc := &StepContext{t: t, k: k, in: in}
		yPred, err := sc.Predict(r, false)
		if err != nil {
			return nil, err
		}
		return strategy.Outputs{predOutput: yPred}, nil
	}
}

// reduceLogs declares the step's logs: the replica's share of the loss,
// its examples, and each metric's sums over them, summed across replicas.
func (t *Trainer) reduceLogs(r strategy.Replica, in strategy.Inputs, k keys, loss, yPred tf.Output) error {
	s := r.Scope().SubScope("train_logs")
	if loss.Op == nil || yPred.Op == nil {
		return fmt.Errorf("the step returned no loss or no predictions")
	}
	if n := loss.Shape().NumDimensions(); n != 0 {
		return fmt.Errorf("the step's loss has shape %v, expected a scalar", loss.Shape())
	}
	// n is the replica's examples, [1]: the leading dimension of its first input.
	n := op.Slice(s.SubScope("n"), op.Shape(s.SubScope("shape"), in[k.inputs[0]], op.ShapeOutType(tf.Int32)),
		op.Const(s.SubScope("begin"), []int32{0}), op.Const(s.SubScope("size"), []int32{1}))
	count := op.Reshape(s.SubScope("count"), op.Cast(s.SubScope("count_float"), n, tf.Float), op.Const(s.SubScope("scalar"), []int32{}))
	vals := []tf.Output{op.Cast(s.SubScope("loss"), loss, tf.Float), count}
	weight := sampleWeight(s.SubScope("weight"), in, k, n)
	t.sizes = make([]int, len(t.cfg.metrics))
	for i, m := range t.cfg.metrics {
		sums, err := m.Sums(s.SubScope(fmt.Sprintf("metric_%d", i)), in[KeyY], yPred, weight)
		if err != nil {
			return fmt.Errorf("metric %s: %w", m.Name(), err)
		}
		t.sizes[i] = len(sums)
		for j, v := range sums {
			vals = append(vals, op.Cast(s.SubScope(fmt.Sprintf("metric_%d_%d", i, j)), v, tf.Float))
		}
	}
	if err := s.Err(); err != nil {
		return err
	}
	return r.ReduceOutput(logsOutput, strategy.Sum, op.Pack(s.SubScope("pack"), vals))
}

// sampleWeight returns the batch's weights as a [batch] vector: its
// sample_weight, or n ([1], the batch's examples) ones.
func sampleWeight(s *op.Scope, in strategy.Inputs, k keys, n tf.Output) tf.Output {
	if k.weight {
		return op.Reshape(s.SubScope("flat"), op.Cast(s.SubScope("cast"), in[KeySampleWeight], tf.Float), op.Const(s.SubScope("shape"), []int32{-1}))
	}
	return op.Fill(s.SubScope("ones"), n, op.Const(s.SubScope("one"), float32(1)))
}
