package multiworker

import (
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/strategy"
)

// Compression is how gradients travel between workers (WithCompression).
type Compression int

const (
	// None sends gradients as they are.
	None Compression = iota
	// FP16 sends float32 gradients as IEEE half precision.
	FP16
	// BF16 sends float32 gradients as bfloat16.
	BF16
)

// String returns the compression's name, as the classifier's flag takes
// it: none, fp16 or bf16.
func (c Compression) String() string {
	switch c {
	case None:
		return "none"
	case FP16:
		return "fp16"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("Compression(%d)", int(c))
}

// wire returns the engine's wire type of c.
func (c Compression) wire() collective.DType {
	switch c {
	case FP16:
		return collective.Float16
	case BF16:
		return collective.BFloat16
	}
	return 0
}

// minCompressed is the fewest elements of a tensor (or pack) sent
// compressed: smaller ones, biases and norms, travel as float32, where
// their few bytes cost nothing and keep their precision.
const minCompressed = 1024

// WithCompression sends the gradients' all-reduces (float32 tensors and
// packs of at least 1024 elements) over the wire as c: each worker
// converts what it sends to 16 bits and what it receives back to float32,
// and sums in float32 at every hop, so precision is lost once per
// transfer, never accumulated, and every worker still ends with the same
// bits. Other reductions (losses, metrics, variable reads) stay exact.
// Only tfdist's engine compresses: New refuses c with
// WithCommunication(Ring or NCCL), and with WithAggregation.
func WithCompression(c Compression) Option { return func(cfg *config) { cfg.compression = c } }

func (c config) checkCompression() error {
	switch {
	case c.compression == None:
		return nil
	case c.compression.wire() == 0:
		return fmt.Errorf("multiworker: WithCompression(%v): expected None, FP16 or BF16", c.compression)
	case c.comm != Auto && c.comm != Engine:
		return fmt.Errorf("multiworker: WithCompression(%v): only tfdist's collective engine compresses; WithCommunication(%v) sends gradients as they are", c.compression, c.comm)
	case c.aggregation != nil:
		return fmt.Errorf("multiworker: WithCompression(%v) with WithAggregation(%s): a rule gathers every vote as float32; use one or the other", c.compression, c.aggregation)
	}
	return nil
}

// packed wraps ops in the packing of WithBytesPerPack.
func (c config) packed(ops *engineOps) strategy.CrossDeviceOps {
	if c.bytesPerPack > 0 {
		return strategy.Packed{Inner: ops, BytesPerPack: c.bytesPerPack, Reverse: true}
	}
	return ops
}

// compressing returns a copy of c whose float32 all-reduces travel as
// comp, naming its ops in the same sequence as c.
func (c *engineOps) compressing(comp Compression) *engineOps {
	cc := *c
	cc.wire = comp.wire()
	return &cc
}

// wireFor returns the wire type of v's all-reduce: c's for a float32
// tensor known to hold at least minCompressed elements, none otherwise.
func (c *engineOps) wireFor(v tf.Output) collective.DType {
	if c.wire == 0 || v.DataType() != tf.Float {
		return 0
	}
	shape, err := v.Shape().ToSlice()
	if err != nil {
		return 0
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if n < minCompressed {
		return 0
	}
	return c.wire
}

// compressed is the GradientReducer of WithCompression: the gradients'
// sum through compressing CrossDeviceOps.
type compressed struct{ ops strategy.CrossDeviceOps }

func (c compressed) ReduceGradients(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	return c.ops.BatchReduce(s, strategy.Sum, values, devices)
}
