package ingraph

import (
	"fmt"

	"github.com/google/uuid"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/graphutil"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/strategy"
)

// Broadcaster is implemented by strategy.CrossDeviceOps whose replicas span
// processes: the engine passes every variable's initial value through
// Broadcast so that every copy, on every worker, starts from global replica
// 0's value even when initialisers are not deterministic.
type Broadcaster interface {
	// Broadcast returns, for each local replica, value as global replica 0
	// computed it. value is this process's replica 0 value.
	Broadcast(s *op.Scope, value tf.Output, devices []string) ([]tf.Output, error)
}

func checkLayout(values [][]tf.Output, devices []string) (int, error) {
	if len(values) != len(devices) {
		return 0, fmt.Errorf("%d replicas' values for %d devices", len(values), len(devices))
	}
	if len(values) == 0 {
		return 0, fmt.Errorf("no replicas")
	}
	k := len(values[0])
	for r := range values {
		if len(values[r]) != k {
			return 0, fmt.Errorf("replica %d has %d values, replica 0 has %d", r, len(values[r]), k)
		}
		for i := range values[r] {
			if values[r][i].DataType() != values[0][i].DataType() {
				return 0, fmt.Errorf("value %d: replica %d has %s, replica 0 has %s", i, r, graphutil.DTypeName(values[r][i].DataType()), graphutil.DTypeName(values[0][i].DataType()))
			}
		}
	}
	return k, nil
}

// ReductionToOneDevice reduces on one device (AddN there) and copies the
// result to every replica's device: tf.distribute's ReductionToOneDevice,
// the right choice on CPUs.
type ReductionToOneDevice struct {
	// Device is where the reduction runs ("" = the first replica's device).
	Device string
	// InTreeOrder adds the replicas' values pairwise along the tree of
	// TreeSumOn instead of with AddN, for Config.VirtualShards: the
	// values of one device on it, the sums across devices on Device.
	InTreeOrder bool
}

// BatchReduce implements strategy.CrossDeviceOps.
func (c ReductionToOneDevice) BatchReduce(s *op.Scope, red strategy.ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	return c.combine(s, "reduce", values, devices, func(rs *op.Scope, parts []tf.Output) tf.Output {
		var sum tf.Output
		switch {
		case len(parts) == 1:
			sum = op.Identity(rs.SubScope("sum"), parts[0])
		case c.InTreeOrder:
			sum = TreeSumOn(rs.SubScope("sum"), parts, devices, c.Device)
		default:
			sum = op.AddN(rs.SubScope("sum"), parts)
		}
		if red == strategy.Mean {
			sum = op.Div(rs.SubScope("mean"), sum, op.Cast(rs.SubScope("n"), op.Const(rs.SubScope("count"), int32(len(parts))), sum.DataType()))
		}
		return sum
	})
}

// BatchGather implements strategy.CrossDeviceOps.
func (c ReductionToOneDevice) BatchGather(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	return c.combine(s, "gather", values, devices, func(rs *op.Scope, parts []tf.Output) tf.Output {
		return op.ConcatV2(rs.SubScope("concat"), parts, op.Const(rs.SubScope("axis"), int32(0)))
	})
}

// combine combines each tensor k of every replica on the reduction's
// device with f, and copies the result to every replica's device.
func (c ReductionToOneDevice) combine(s *op.Scope, name string, values [][]tf.Output, devices []string,
	f func(*op.Scope, []tf.Output) tf.Output) ([][]tf.Output, error) {
	k, err := checkLayout(values, devices)
	if err != nil {
		return nil, err
	}
	dev := c.Device
	if dev == "" {
		dev = devices[0]
	}
	out := make([][]tf.Output, len(values))
	for i := range k {
		ts := s.SubScope(fmt.Sprintf("%s_%d", name, i))
		parts := make([]tf.Output, len(values))
		for r := range values {
			parts[r] = values[r][i]
		}
		v := f(ts.WithDevice(dev), parts)
		for r := range values {
			out[r] = append(out[r], op.Identity(ts.SubScope(fmt.Sprintf("to_%d", r)).WithDevice(devices[r]), v))
		}
	}
	return out, s.Err()
}

// NCCLAllReduce all-reduces with NVIDIA's NCCL between GPUs of one machine
// (TensorFlow's NcclAllReduce op). Every device must be a GPU; TensorFlow has
// no CPU kernel for it. No machine that tests tfdist has a GPU, so this path
// is untested.
type NCCLAllReduce struct{}

// BatchReduce implements strategy.CrossDeviceOps.
func (NCCLAllReduce) BatchReduce(s *op.Scope, red strategy.ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	k, err := checkLayout(values, devices)
	if err != nil {
		return nil, err
	}
	if err := RequireGPUs(devices); err != nil {
		return nil, err
	}
	reduction := "sum"
	out := make([][]tf.Output, len(values))
	for i := range k {
		ts := s.SubScope(fmt.Sprintf("nccl_%d", i))
		shared := "tfdist_nccl_" + uuid.NewString()
		for r := range values {
			rs := ts.SubScope(fmt.Sprintf("replica_%d", r)).WithDevice(devices[r])
			v := op.NcclAllReduce(rs, values[r][i], reduction, int64(len(values)), shared)
			if red == strategy.Mean {
				v = op.Div(rs.SubScope("mean"), v, op.Cast(rs.SubScope("n"), op.Const(rs.SubScope("count"), int32(len(values))), v.DataType()))
			}
			out[r] = append(out[r], v)
		}
	}
	return out, s.Err()
}

// BatchGather implements strategy.CrossDeviceOps by gathering on the first GPU, as
// tf.distribute does for NCCL (NCCL's all-gather is not a TensorFlow op).
func (NCCLAllReduce) BatchGather(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	return ReductionToOneDevice{}.BatchGather(s, values, devices)
}

// RequireGPUs returns an error naming the first device that is not a GPU.
func RequireGPUs(devices []string) error {
	for _, d := range devices {
		if !tfrt.IsGPU(d) {
			return fmt.Errorf("NCCL needs every device to be a GPU; %q is not (use ReductionToOneDevice on CPUs)", d)
		}
	}
	return nil
}

// Packed wraps a strategy.CrossDeviceOps so that many small tensors are reduced as
// few large ones: consecutive tensors of one dtype are flattened and
// concatenated into packs of at most BytesPerPack bytes (a tensor larger
// than that travels alone), reduced, and split back — tf.distribute's
// bytes_per_pack, Horovod's tensor fusion. Tensors whose shape is not fully
// known travel alone.
type Packed struct {
	Inner        strategy.CrossDeviceOps
	BytesPerPack int64
	// Reverse forms the packs from the last tensor to the first. Gradients
	// come in variable order and backprop produces the last layers' first,
	// so with an inner strategy.CrossDeviceOps that reduces each pack as its own
	// async op, the first packs travel while backprop still runs (the
	// buckets of PyTorch's DDP).
	Reverse bool
	// AloneFrom, when positive, lets a tensor of at least that many bytes
	// travel alone too, even where it would fit a pack: where a reduction's
	// fixed cost is small, copying a large tensor into a pack and out again
	// costs more than reducing it on its own, and it starts as soon as that
	// tensor exists.
	AloneFrom int64
}

// BatchGather implements strategy.CrossDeviceOps (gathers are not packed).
func (p Packed) BatchGather(s *op.Scope, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	return p.Inner.BatchGather(s, values, devices)
}

type pack struct {
	idx   []int
	sizes []int64
}

func elemBytes(dt tf.DataType) int64 {
	switch dt {
	case tf.Double, tf.Int64, tf.Complex64, tf.Uint64:
		return 8
	case tf.Half, tf.Bfloat16, tf.Int16, tf.Uint16:
		return 2
	case tf.Int8, tf.Uint8, tf.Bool:
		return 1
	}
	return 4
}

func staticSize(o tf.Output) (int64, bool) {
	shape, ok := graphutil.StaticShape(o)
	if !ok {
		return 0, false
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n, true
}

// plan groups tensor indices into packs.
func (p Packed) plan(values []tf.Output) []pack {
	var packs []pack
	var cur pack
	var curBytes int64
	var curType tf.DataType
	flush := func() {
		if len(cur.idx) > 0 {
			packs = append(packs, cur)
		}
		cur, curBytes = pack{}, 0
	}
	for x := range values {
		i := x
		if p.Reverse {
			i = len(values) - 1 - x
		}
		v := values[i]
		n, ok := staticSize(v)
		b := n * elemBytes(v.DataType())
		if !ok || b >= p.BytesPerPack || p.BytesPerPack <= 0 || (p.AloneFrom > 0 && b >= p.AloneFrom) {
			flush()
			packs = append(packs, pack{idx: []int{i}, sizes: []int64{-1}})
			continue
		}
		if len(cur.idx) > 0 && (v.DataType() != curType || curBytes+b > p.BytesPerPack) {
			flush()
		}
		cur.idx = append(cur.idx, i)
		cur.sizes = append(cur.sizes, n)
		curBytes += b
		curType = v.DataType()
	}
	flush()
	return packs
}

// flatConcat returns values idx flattened and concatenated, in that
// order: a pack's vector.
func flatConcat(s *op.Scope, values []tf.Output, idx []int) tf.Output {
	flat := make([]tf.Output, len(idx))
	for x, i := range idx {
		flat[x] = op.Reshape(s.SubScope(fmt.Sprintf("flat_%d", x)), values[i], op.Const(s.SubScope(fmt.Sprintf("minus_one_%d", x)), []int32{-1}))
	}
	if len(flat) == 1 {
		return flat[0]
	}
	return op.ConcatV2(s.SubScope("concat"), flat, op.Const(s.SubScope("axis"), int32(0)))
}

// BatchReduce implements strategy.CrossDeviceOps.
func (p Packed) BatchReduce(s *op.Scope, red strategy.ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	k, err := checkLayout(values, devices)
	if err != nil {
		return nil, err
	}
	packs := p.plan(values[0])
	in := make([][]tf.Output, len(values))
	for r := range values {
		for j, pk := range packs {
			if len(pk.idx) == 1 {
				in[r] = append(in[r], values[r][pk.idx[0]])
				continue
			}
			in[r] = append(in[r], flatConcat(s.SubScope(fmt.Sprintf("pack_%d_replica_%d", j, r)).WithDevice(devices[r]), values[r], pk.idx))
		}
	}
	reduced, err := p.Inner.BatchReduce(s.SubScope("packs"), red, in, devices)
	if err != nil {
		return nil, err
	}
	out := make([][]tf.Output, len(values))
	for r := range values {
		out[r] = make([]tf.Output, k)
		for j, pk := range packs {
			if len(pk.idx) == 1 {
				out[r][pk.idx[0]] = reduced[r][j]
				continue
			}
			us := s.SubScope(fmt.Sprintf("unpack_%d_replica_%d", j, r)).WithDevice(devices[r])
			parts := op.SplitV(us.SubScope("split"), reduced[r][j], op.Const(us.SubScope("sizes"), pk.sizes),
				op.Const(us.SubScope("axis"), int32(0)), int64(len(pk.sizes)))
			for x, i := range pk.idx {
				shape, _ := values[r][i].Shape().ToSlice()
				out[r][i] = op.Reshape(us.SubScope(fmt.Sprintf("shape_%d", x)), parts[x], op.Const(us.SubScope(fmt.Sprintf("dims_%d", x)), shape))
			}
		}
	}
	return out, s.Err()
}

// Broadcast implements Broadcaster when the inner strategy.CrossDeviceOps does; it
// returns value for every replica otherwise.
func (p Packed) Broadcast(s *op.Scope, value tf.Output, devices []string) ([]tf.Output, error) {
	if b, ok := p.Inner.(Broadcaster); ok {
		return b.Broadcast(s, value, devices)
	}
	out := make([]tf.Output, len(devices))
	for r := range out {
		out[r] = value
	}
	return out, nil
}
