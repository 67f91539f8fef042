package multiworker

import (
	"fmt"
	"strconv"
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/strategy"
)

// Compression is how gradients travel between workers (WithCompression):
// None, FP16, BF16, INT8 or TopK(ratio).
type Compression struct {
	kind  compressionKind
	ratio float64 // of TopK
}

type compressionKind int

const (
	uncompressed compressionKind = iota
	fp16
	bf16
	topK
	int8
)

var (
	// None sends gradients as they are.
	None = Compression{}
	// FP16 sends float32 gradients as IEEE half precision.
	FP16 = Compression{kind: fp16}
	// BF16 sends float32 gradients as bfloat16.
	BF16 = Compression{kind: bf16}
	// INT8 sends float32 gradients as int8, about a quarter of their
	// bytes, each block of 256 elements in units of a largest magnitude
	// (collective.Compress): up to 256 KiB of int8, each worker's
	// rounded to 127 levels of its own; larger, each worker's rounded to
	// 127/n levels (n workers) of the largest on any, so that their sum
	// around the ring is exact: coarser the more workers, 31 levels on 4,
	// 7 on 16, and at most 127 workers.
	INT8 = Compression{kind: int8}
)

// TopK sends, of each float32 gradient (or pack of gradients), only the
// ratio of its elements largest in magnitude, with error feedback (Lin et
// al., 2018): each worker adds to its gradient what it did not send
// before, its residual, which it keeps per gradient and which checkpoints
// save and restore, every worker's own. ratio must be in (0, 1].
func TopK(ratio float64) Compression { return Compression{kind: topK, ratio: ratio} }

// String returns the compression as ParseCompression reads it: none,
// fp16, bf16, int8 or topk(ratio).
func (c Compression) String() string {
	switch c.kind {
	case uncompressed:
		return "none"
	case fp16:
		return "fp16"
	case bf16:
		return "bf16"
	case int8:
		return "int8"
	case topK:
		return fmt.Sprintf("topk(%g)", c.ratio)
	}
	return fmt.Sprintf("compression(%d)", int(c.kind))
}

// ParseCompression reads none, fp16, bf16, int8 or topk(ratio).
func ParseCompression(s string) (Compression, error) {
	switch s {
	case "none", "":
		return None, nil
	case "fp16":
		return FP16, nil
	case "bf16":
		return BF16, nil
	case "int8":
		return INT8, nil
	}
	arg, prefixed := strings.CutPrefix(s, "topk(")
	if arg, closed := strings.CutSuffix(arg, ")"); prefixed && closed {
		if ratio, err := strconv.ParseFloat(arg, 64); err == nil {
			c := TopK(ratio)
			return c, c.check()
		}
	}
	return None, fmt.Errorf("compression %q: expected none, fp16, bf16, int8 or topk(ratio)", s)
}

// check names a ratio out of (0, 1].
func (c Compression) check() error {
	if c.kind == topK && !(c.ratio > 0 && c.ratio <= 1) {
		return fmt.Errorf("compression topk(%g): the ratio must be in (0, 1]", c.ratio)
	}
	return nil
}

// wire returns the engine's wire type of c.
func (c Compression) wire() collective.DType {
	switch c.kind {
	case fp16:
		return collective.Float16
	case bf16:
		return collective.BFloat16
	case int8:
		return collective.Int8
	}
	return 0
}

// minCompressed is the fewest elements of a tensor (or pack) sent
// compressed: smaller ones, biases and norms, travel as float32, where
// their few bytes cost nothing and keep their precision.
const minCompressed = 1024

// WithCompression sends the gradients' all-reduces (float32 tensors and
// packs of at least 1024 elements) over the wire as c: under FP16 and
// BF16 each worker converts what it sends to 16 bits and what it receives
// back to float32, and sums in float32 at every hop, so precision is lost
// once per transfer, never accumulated; under INT8 each worker's gradient
// is rounded once and the sum is exact. Every worker ends with the same
// bits. Other reductions (losses, metrics, variable reads) stay exact.
// Only tfdist's engine compresses: New refuses c with
// WithCommunication(Ring or NCCL), and with WithAggregation.
func WithCompression(c Compression) Option { return func(cfg *config) { cfg.compression = c } }

// checkGradients refuses an aggregation rule or a compression that the
// backend, the other options or the group of workers cannot honour.
func (c config) checkGradients(workers int) error {
	if err := c.checkAggregation(workers); err != nil {
		return err
	}
	return c.checkCompression()
}

func (c config) checkCompression() error {
	if c.compression == None {
		return nil
	}
	if err := c.compression.check(); err != nil {
		return fmt.Errorf("multiworker: WithCompression: %w", err)
	}
	switch {
	case c.comm != Auto && c.comm != Engine:
		return fmt.Errorf("multiworker: WithCompression(%v): only tfdist's collective engine compresses; WithCommunication(%v) sends gradients as they are", c.compression, c.comm)
	case c.aggregation != nil:
		return fmt.Errorf("multiworker: WithCompression(%v) with WithAggregation(%s): a rule gathers every vote as float32; use one or the other", c.compression, c.aggregation)
	}
	return nil
}

// aloneFrom is the size from which a tensor goes to tfdist's engine alone
// rather than in a pack: an all-reduce of 1 MiB costs little more than its
// bytes' transfer, less than copying them into a pack and out again. (The
// MLP of BenchmarkOverlap, 17 MiB of gradients in the default pack of
// 32 MiB, took 6-12% less time per step than in one pack.)
const aloneFrom = 1 << 20

// packed wraps ops in the packing of WithBytesPerPack.
func (c config) packed(ops *engineOps) strategy.CrossDeviceOps {
	if c.bytesPerPack > 0 {
		return ingraph.Packed{Inner: ops, BytesPerPack: c.bytesPerPack, Reverse: true, AloneFrom: aloneFrom}
	}
	return ops
}

// compressing returns a copy of c whose float32 all-reduces travel as
// comp, naming its ops in the same sequence as c.
func (c *engineOps) compressing(comp Compression) *engineOps {
	cc := *c
	cc.wire = comp.wire()
	if comp.kind == topK {
		cc.topK = comp.ratio
	}
	return &cc
}

// wireFor returns the wire type of v's all-reduce: c's for a
// compressible tensor, none otherwise.
func (c *engineOps) wireFor(v tf.Output) collective.DType {
	if c.wire == 0 || compressible(v) == 0 {
		return 0
	}
	return c.wire
}

// compressible returns the elements of v when compression applies to it:
// v is float32 and known to hold at least minCompressed elements; 0
// otherwise.
func compressible(v tf.Output) int64 {
	shape, err := v.Shape().ToSlice()
	if err != nil || v.DataType() != tf.Float {
		return 0
	}
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0
		}
		n *= d
	}
	if n < minCompressed {
		return 0
	}
	return n
}

// compressed is the GradientReducer of WithCompression: the gradients'
// sum through compressing CrossDeviceOps.
type compressed struct{ ops strategy.CrossDeviceOps }

func (c compressed) ReduceGradients(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	return c.ops.BatchReduce(s, strategy.Sum, values, devices)
}
