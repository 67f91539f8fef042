package nn

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/strategy"
)

// Padding says how a window meets the edges of its input.
type Padding int

const (
	// Valid keeps only windows inside the input: out = (in-size)/stride+1.
	Valid Padding = iota
	// Same pads the input with zeros so that out = ceil(in/stride).
	Same
)

func (p Padding) String() string {
	if p == Same {
		return "SAME"
	}
	return "VALID"
}

// window is the geometry of a 2-D window over NHWC inputs.
type window struct {
	layer           string
	size, stride    int
	padding         Padding
	outChannelsFrom int64 // 0: keep the input's channels
}

// outShape returns the output shape [h, w, c] of the window over in
// [h, w, c], or an error naming what does not fit.
func (wn window) outShape(in []int64) ([]int64, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("%s: input shape %v, expected [batch, height, width, channels]", wn.layer, append([]int64{-1}, in...))
	}
	if wn.size < 1 || wn.stride < 1 {
		return nil, fmt.Errorf("%s: window %d, stride %d: expected both at least 1", wn.layer, wn.size, wn.stride)
	}
	out := make([]int64, 3)
	for i, d := range in[:2] {
		k, s := int64(wn.size), int64(wn.stride)
		switch wn.padding {
		case Same:
			out[i] = (d + s - 1) / s
		default:
			if d < k {
				return nil, fmt.Errorf("%s: window %d with VALID padding does not fit input %v (dimension %d is %d); use Same padding or a smaller window",
					wn.layer, wn.size, append([]int64{-1}, in...), i+1, d)
			}
			out[i] = (d-k)/s + 1
		}
	}
	out[2] = in[2]
	if wn.outChannelsFrom > 0 {
		out[2] = wn.outChannelsFrom
	}
	return out, nil
}

// Conv2D is a 2-D convolution over NHWC inputs [batch, height, width,
// channels]: Filters kernels of Kernel×Kernel, moved by Strides (default
// 1), then a bias and Activation. Its kernel is He-initialised for ReLU
// and Glorot-initialised otherwise. It computes in its input's type, its
// float32 variables read cast to it (see Policy).
type Conv2D struct {
	Filters    int
	Kernel     int
	Strides    int
	Padding    Padding
	Activation Activation
	NoBias     bool // leave the bias out (Keras' use_bias=False), as before a BatchNorm
}

// Kind implements Spec.
func (Conv2D) Kind() string { return "conv2d" }

// Build implements Spec.
func (c Conv2D) Build(sc strategy.Scope, name string, in []int64, seed int64) (Layer, []int64, error) {
	if c.Strides == 0 {
		c.Strides = 1
	}
	if c.Filters < 1 {
		return nil, nil, fmt.Errorf("Conv2D: Filters %d, expected at least 1", c.Filters)
	}
	wn := window{layer: "Conv2D", size: c.Kernel, stride: c.Strides, padding: c.Padding, outChannelsFrom: int64(c.Filters)}
	out, err := wn.outShape(in)
	if err != nil {
		return nil, nil, err
	}
	if err := c.Activation.check("Conv2D", out); err != nil {
		return nil, nil, err
	}
	init := GlorotUniform(seed)
	if c.Activation == ReLU {
		init = HeUniform(seed)
	}
	k := int64(c.Kernel)
	kb, err := newKernelBias(sc, name, []int64{k, k, in[2], int64(c.Filters)}, init, c.NoBias)
	if err != nil {
		return nil, nil, err
	}
	return &conv2D{kernelBias: kb, in: in, c: c}, out, nil
}

type conv2D struct {
	kernelBias
	in []int64
	c  Conv2D
}

func (l *conv2D) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, l.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "conv2d")
	w, addBias, err := l.read(r, b, x.DataType(), b.BiasAdd)
	if err != nil {
		return tf.Output{}, err
	}
	s := int64(l.c.Strides)
	y := op.Conv2D(b.Op(), x, w, []int64{1, s, s, 1}, l.c.Padding.String())
	return l.c.Activation.Apply(b, addBias(y)), b.Err()
}

// MaxPool2D takes the maximum of each Size×Size window of NHWC inputs,
// moved by Strides (default Size).
type MaxPool2D struct {
	Size    int
	Strides int
	Padding Padding
}

// Kind implements Spec.
func (MaxPool2D) Kind() string { return "max_pool2d" }

// Build implements Spec.
func (p MaxPool2D) Build(_ strategy.Scope, _ string, in []int64, _ int64) (Layer, []int64, error) {
	return buildPool("MaxPool2D", p.Size, p.Strides, p.Padding, in, op.MaxPool)
}

// AvgPool2D averages each Size×Size window of NHWC inputs, moved by
// Strides (default Size).
type AvgPool2D struct {
	Size    int
	Strides int
	Padding Padding
}

// Kind implements Spec.
func (AvgPool2D) Kind() string { return "avg_pool2d" }

// Build implements Spec.
func (p AvgPool2D) Build(_ strategy.Scope, _ string, in []int64, _ int64) (Layer, []int64, error) {
	return buildPool("AvgPool2D", p.Size, p.Strides, p.Padding, in, func(s *op.Scope, x tf.Output, k, st []int64, pad string, _ ...op.MaxPoolAttr) tf.Output {
		return op.AvgPool(s, x, k, st, pad)
	})
}

type poolFn func(s *op.Scope, x tf.Output, ksize, strides []int64, padding string, optional ...op.MaxPoolAttr) tf.Output

func buildPool(layer string, size, strides int, padding Padding, in []int64, fn poolFn) (Layer, []int64, error) {
	if strides == 0 {
		strides = size
	}
	wn := window{layer: layer, size: size, stride: strides, padding: padding}
	out, err := wn.outShape(in)
	if err != nil {
		return nil, nil, err
	}
	return &pool{in: in, wn: wn, fn: fn}, out, nil
}

type pool struct {
	in []int64
	wn window
	fn poolFn
}

func (p *pool) Vars() []strategy.Variable { return nil }

func (p *pool) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, p.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "pool")
	k, s := int64(p.wn.size), int64(p.wn.stride)
	return p.fn(b.Op(), x, []int64{1, k, k, 1}, []int64{1, s, s, 1}, p.wn.padding.String()), b.Err()
}

// Flatten reshapes [batch, d1, d2, …] to [batch, d1·d2·…].
type Flatten struct{}

// Kind implements Spec.
func (Flatten) Kind() string { return "flatten" }

// Build implements Spec.
func (Flatten) Build(_ strategy.Scope, _ string, in []int64, _ int64) (Layer, []int64, error) {
	return &flatten{in: in}, []int64{prod(in)}, nil
}

type flatten struct{ in []int64 }

func (f *flatten) Vars() []strategy.Variable { return nil }

func (f *flatten) Apply(r strategy.Replica, x tf.Output, _ bool) (tf.Output, error) {
	if err := checkInput(x, f.in); err != nil {
		return tf.Output{}, err
	}
	b := NewBuilder(r.Scope(), "flatten")
	return b.Reshape(x, -1, prod(f.in)), b.Err()
}
