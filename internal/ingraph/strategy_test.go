package ingraph_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/ingraph"
	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/strategy"
)

var ctx = context.Background()

// local returns an engine with n replicas on n logical CPUs.
func local(t *testing.T, n int, cdo strategy.CrossDeviceOps) *ingraph.Engine {
	t.Helper()
	var devs []string
	for i := range n {
		devs = append(devs, strategy.LocalCPU(i))
	}
	if cdo == nil {
		cdo = ingraph.ReductionToOneDevice{}
	}
	so, err := tfrt.SessionOptions("", tfrt.WithLogicalCPUs(n), tfrt.WithThreads(2, 4))
	require.NoError(t, err)
	e, err := ingraph.New(ingraph.Config{Name: "test", Devices: devs, CrossDeviceOps: cdo, Session: so})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

var vecSpec = strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}}

func tensor(t *testing.T, v any) *tf.Tensor {
	t.Helper()
	x, err := tf.NewTensor(v)
	require.NoError(t, err)
	return x
}

// feeds gives replica r the vector {r+1, …} of length per.
func feeds(t *testing.T, n, per int) []map[string]*tf.Tensor {
	out := make([]map[string]*tf.Tensor, n)
	for r := range n {
		x := make([]float32, per)
		for i := range x {
			x[i] = float32(r*per + i + 1)
		}
		out[r] = map[string]*tf.Tensor{"x": tensor(t, x)}
	}
	return out
}

func TestAllReduceAndAllGather(t *testing.T) {
	e := local(t, 3, nil)
	step, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := rc.Scope()
		local := op.Sum(s.SubScope("sum"), in["x"], op.Const(s.SubScope("axis"), int32(0)))
		sum, err := rc.AllReduce(strategy.Sum, local)
		if err != nil {
			return nil, err
		}
		mean, err := rc.AllReduce(strategy.Mean, local)
		if err != nil {
			return nil, err
		}
		all, err := rc.AllGather(in["x"])
		if err != nil {
			return nil, err
		}
		id := op.Const(s.SubScope("id"), int32(rc.ReplicaID()))
		return strategy.Outputs{"sum": sum, "mean": mean, "all": all, "id": id}, nil
	})
	require.NoError(t, err)
	res, err := e.RunReplicas(ctx, step, feeds(t, 3, 2), 6)
	require.NoError(t, err)
	// replica inputs: {1,2}, {3,4}, {5,6}
	for r := range 3 {
		assert.Equal(t, float32(21), res["sum"][r].Value(), "replica %d", r)
		assert.Equal(t, float32(7), res["mean"][r].Value(), "replica %d", r)
		assert.Equal(t, []float32{1, 2, 3, 4, 5, 6}, res["all"][r].Value(), "replica %d", r)
		assert.Equal(t, int32(r), res["id"][r].Value())
	}
	red, err := e.Reduce(ctx, strategy.Sum, res["id"])
	require.NoError(t, err)
	assert.Equal(t, int32(3), red.Value())
	g, err := e.Gather(ctx, strategy.PerReplica{tensor(t, []int32{1}), tensor(t, []int32{2, 3}), tensor(t, []int32{4})})
	require.NoError(t, err)
	assert.Equal(t, []int32{1, 2, 3, 4}, g.Value())
}

// A gather concatenates along axis 0, so a scalar is refused, in a step as
// in Gather, with an error that says so, as tf.distribute's gather does.
func TestGatherRefusesScalars(t *testing.T) {
	e := local(t, 2, nil)
	_, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		all, err := rc.AllGather(op.Const(rc.Scope().SubScope("one"), float32(1)))
		return strategy.Outputs{"all": all}, err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "AllGather: replica 0's value is a scalar of float32")
	assert.Contains(t, err.Error(), "rank 1 or more")

	_, err = e.Gather(context.Background(), strategy.PerReplica{tensor(t, int64(1)), tensor(t, int64(2))})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "replica 0's value is a scalar of int64")
}

func TestPackedReductionEqualsUnpacked(t *testing.T) {
	for _, bytes := range []int64{1, 16, 40, 1 << 20} {
		t.Run(fmt.Sprint(bytes), func(t *testing.T) {
			e := local(t, 2, ingraph.Packed{Inner: ingraph.ReductionToOneDevice{}, BytesPerPack: bytes})
			shapes := [][]int64{{2, 3}, {3}, {1}, {4, 1}, {}}
			step, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
				out := strategy.Outputs{}
				for i, sh := range shapes {
					n := int64(1)
					for _, d := range sh {
						n *= d
					}
					s := rc.Scope().SubScope(fmt.Sprintf("t%d", i))
					vals := make([]float32, n)
					for j := range vals {
						vals[j] = float32((rc.ReplicaID()+1)*100 + i*10 + j)
					}
					x := op.Reshape(s, op.Const(s.SubScope("v"), vals), op.Const(s.SubScope("shape"), sh))
					y, err := rc.AllReduce(strategy.Sum, x)
					if err != nil {
						return nil, err
					}
					out[fmt.Sprint(i)] = y
				}
				return out, nil
			})
			require.NoError(t, err)
			res, err := e.RunReplicas(ctx, step, feeds(t, 2, 1), 2)
			require.NoError(t, err)
			for i, sh := range shapes {
				got := res[fmt.Sprint(i)][1]
				require.Len(t, got.Shape(), len(sh))
				for d := range sh {
					assert.Equal(t, sh[d], got.Shape()[d])
				}
				n := int64(1)
				for _, d := range sh {
					n *= d
				}
				flat := tensorutil.Float32s(got)
				for j := range n {
					assert.Equal(t, float32(300+2*(i*10+int(j))), flat[j])
				}
			}
		})
	}
}

// shapesSeen is a CrossDeviceOps that reduces as ReductionToOneDevice does
// and records the shape of every tensor it reduces.
type shapesSeen struct {
	ingraph.ReductionToOneDevice
	shapes *[][]int64
}

func (r shapesSeen) BatchReduce(s *op.Scope, red strategy.ReduceOp, values [][]tf.Output, devices []string) ([][]tf.Output, error) {
	for _, v := range values[0] {
		shape, _ := v.Shape().ToSlice()
		*r.shapes = append(*r.shapes, shape)
	}
	return r.ReductionToOneDevice.BatchReduce(s, red, values, devices)
}

// Packed reduces tensors in packs of at most BytesPerPack bytes, the
// larger ones alone, and with AloneFrom also those of at least that many
// bytes; the sums are the tensors' own either way.
func TestPackedPlansPacks(t *testing.T) {
	shapes := [][]int64{{2, 3}, {3}, {1}, {4, 1}, {}}
	for _, c := range []struct {
		bytes, aloneFrom int64
		reduced          [][]int64 // the shapes the inner CrossDeviceOps reduces, in order
	}{
		{16, 0, [][]int64{{2, 3}, {4}, {4, 1}, {}}},
		{40, 0, [][]int64{{10}, {5}}},
		{1 << 20, 0, [][]int64{{15}}},
		{1 << 20, 16, [][]int64{{2, 3}, {4}, {4, 1}, {}}},
	} {
		t.Run(fmt.Sprintf("%d_alone_from_%d", c.bytes, c.aloneFrom), func(t *testing.T) {
			g := tf.NewGraph()
			s := op.NewScopeWithGraph(g)
			devices := []string{strategy.LocalCPU(0), strategy.LocalCPU(0)}
			values := make([][]tf.Output, 2)
			for r := range values {
				for i, sh := range shapes {
					n := int64(1)
					for _, d := range sh {
						n *= d
					}
					vals := make([]float32, n)
					for j := range vals {
						vals[j] = float32((r+1)*100 + i*10 + j)
					}
					vs := s.SubScope(fmt.Sprintf("r%d_t%d", r, i))
					values[r] = append(values[r], op.Reshape(vs, op.Const(vs.SubScope("v"), vals), op.Const(vs.SubScope("shape"), sh)))
				}
			}
			var seen [][]int64
			out, err := ingraph.Packed{Inner: shapesSeen{shapes: &seen}, BytesPerPack: c.bytes, AloneFrom: c.aloneFrom}.
				BatchReduce(s.SubScope("reduce"), strategy.Sum, values, devices)
			require.NoError(t, err)
			assert.Equal(t, c.reduced, seen)
			sess, err := tf.NewSession(g, nil)
			require.NoError(t, err)
			defer sess.Close()
			res, err := sess.Run(nil, out[1], nil)
			require.NoError(t, err)
			for i := range shapes {
				for j, v := range tensorutil.Float32s(res[i]) {
					assert.Equal(t, float32(300+2*(i*10+j)), v, "tensor %d element %d", i, j)
				}
			}
		})
	}
}

func TestMergeMismatchIsABuildError(t *testing.T) {
	e := local(t, 2, nil)
	_, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		if rc.ReplicaID() == 0 {
			if _, err := rc.AllReduce(strategy.Sum, in["x"]); err != nil {
				return nil, err
			}
		}
		return strategy.Outputs{"x": in["x"]}, nil
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "AllReduce")

	_, err = e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		var err error
		if rc.ReplicaID() == 0 {
			_, err = rc.AllReduce(strategy.Sum, in["x"])
		} else {
			_, err = rc.AllGather(in["x"])
		}
		return strategy.Outputs{"x": in["x"]}, err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "AllGather")
	assert.Contains(t, err.Error(), "replica 1")
}

func TestReplicaErrorsAndPanicsAreBuildErrors(t *testing.T) {
	e := local(t, 2, nil)
	_, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		if rc.ReplicaID() == 1 {
			return nil, fmt.Errorf("model refused")
		}
		return strategy.Outputs{"x": in["x"]}, nil
	})
	var be *strategy.BuildError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 1, be.Replica)
	assert.Contains(t, err.Error(), "model refused")

	_, err = e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		var s []int
		_ = s[len(in)] // panics: index out of range
		return nil, nil
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "panic")

	// Two ops of one name on the replica's scope: the error names the op
	// the graph refused, the replica and the remedy, once.
	_, err = e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		x := op.Neg(rc.Scope(), in["x"])
		return strategy.Outputs{"x": op.Neg(rc.Scope(), x)}, nil
	})
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 0, be.Replica)
	assert.Contains(t, err.Error(), `strategy: build: replica 0: failed to add operation "Neg": Duplicate node name in graph: 'step`)
	assert.Contains(t, err.Error(), "every op needs a name of its own")
	assert.Equal(t, 1, strings.Count(err.Error(), "strategy: build"), err.Error())
	assert.Equal(t, 1, strings.Count(err.Error(), "Duplicate node name"), err.Error())

	// A failed build does not poison the next one.
	step, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		return strategy.Outputs{"x": op.Identity(rc.Scope().SubScope("id"), in["x"])}, nil
	})
	require.NoError(t, err)
	_, err = e.RunReplicas(ctx, step, feeds(t, 2, 1), 2)
	require.NoError(t, err)
}

func TestNoGradientIsABuildError(t *testing.T) {
	e := local(t, 1, nil)
	var w strategy.Variable
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		var err error
		w, err = sc.Variable("w", tf.Float, []int64{3}, strategy.Zeros())
		return err
	}))
	_, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := rc.Scope()
		wv := strategy.MustRead(rc, w)
		// Round has no registered gradient in TensorFlow's C++ registry.
		loss := op.Sum(s.SubScope("loss"), op.Round(s.SubScope("round"), wv), op.Const(s.SubScope("axis"), int32(0)))
		grads, err := rc.(*ingraph.ReplicaContext).Gradients(loss, []strategy.Variable{w})
		_ = grads
		return strategy.Outputs{"loss": loss}, err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "No gradient defined for op: Round")

	_, err = e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := rc.Scope()
		loss := op.Sum(s.SubScope("loss"), in["x"], op.Const(s.SubScope("axis"), int32(0)))
		_, err := rc.(*ingraph.ReplicaContext).Gradients(loss, []strategy.Variable{w})
		return strategy.Outputs{"loss": loss}, err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `does not depend on variable "w"`)
}

func TestVariableOfAnotherStrategy(t *testing.T) {
	a, b := local(t, 1, nil), local(t, 1, nil)
	var w strategy.Variable
	require.NoError(t, a.Scope(func(sc strategy.Scope) error {
		var err error
		w, err = sc.Variable("w", tf.Float, []int64{1}, strategy.Zeros())
		return err
	}))
	_, err := b.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		v, err := rc.Read(w)
		return strategy.Outputs{"w": v}, err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not created in this strategy's scope")

	var leaked strategy.Scope
	require.NoError(t, a.Scope(func(sc strategy.Scope) error { leaked = sc; return nil }))
	_, err = leaked.Variable("late", tf.Float, []int64{1}, strategy.Zeros())
	assert.ErrorIs(t, err, strategy.ErrScopeClosed)
}

func TestVariableValidation(t *testing.T) {
	e := local(t, 1, nil)
	err := e.Scope(func(sc strategy.Scope) error {
		_, err := sc.Variable("w", tf.Float, []int64{2}, strategy.Zeros())
		require.NoError(t, err)
		_, err = sc.Variable("w", tf.Float, []int64{2}, strategy.Zeros())
		assert.ErrorContains(t, err, `"w": already used`)
		_, err = sc.Variable("bad name!", tf.Float, []int64{2}, strategy.Zeros())
		assert.ErrorContains(t, err, "bad name!")
		_, err = sc.Variable("unknown", tf.Float, []int64{-1}, strategy.Zeros())
		assert.ErrorContains(t, err, "known size")
		_, err = sc.Variable("c", tf.Float, []int64{3}, strategy.Constant(tensor(t, []float32{1, 2})))
		assert.ErrorContains(t, err, "shape [2], expected [3]")
		return nil
	})
	require.NoError(t, err)
}

func TestAssignRules(t *testing.T) {
	e := local(t, 2, nil)
	var plain, summed, first, metric, noagg strategy.Variable
	require.NoError(t, e.Scope(func(sc strategy.Scope) error {
		var err error
		mk := func(name string, opts ...strategy.VariableOption) strategy.Variable {
			v, e2 := sc.Variable(name, tf.Float, nil, strategy.Zeros(), opts...)
			if e2 != nil {
				err = e2
			}
			return v
		}
		plain = mk("plain")
		summed = mk("summed", strategy.WithAggregation(strategy.AggregationSum))
		first = mk("first", strategy.WithAggregation(strategy.AggregationOnlyFirstReplica))
		metric = mk("metric", strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationSum))
		noagg = mk("noagg", strategy.WithSynchronization(strategy.OnRead))
		return err
	}))
	assert.False(t, metric.Trainable(), "OnRead variables are not trainable")

	_, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		return strategy.Outputs{"x": in["x"]}, rc.Assign(plain, op.Const(rc.Scope().SubScope("v"), float32(1)))
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "aggregation NONE")

	step, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		s := rc.Scope()
		val := op.Const(s.SubScope("v"), float32(rc.ReplicaID()+1)) // 1 on replica 0, 2 on replica 1
		for _, v := range []strategy.Variable{summed, first} {
			if err := rc.Assign(v, val); err != nil {
				return nil, err
			}
		}
		if err := rc.AssignAdd(metric, val); err != nil {
			return nil, err
		}
		return strategy.Outputs{"x": in["x"]}, rc.AssignAdd(noagg, val)
	})
	require.NoError(t, err)
	for range 2 {
		_, err = e.RunReplicas(ctx, step, feeds(t, 2, 1), 2)
		require.NoError(t, err)
	}
	value := func(v strategy.Variable) float32 {
		x, err := e.Value(ctx, v)
		require.NoError(t, err)
		return x.Value().(float32)
	}
	assert.Equal(t, float32(3), value(summed), "Sum aggregation: 1+2")
	assert.Equal(t, float32(1), value(first), "OnlyFirstReplica: replica 0's value")
	assert.Equal(t, float32(6), value(metric), "OnRead Sum: (1+1)+(2+2) across the copies")
	_, err = e.Value(ctx, noagg)
	assert.ErrorContains(t, err, "aggregation NONE")
}

func TestUnknownDeviceListsDevices(t *testing.T) {
	so, err := tfrt.SessionOptions("", tfrt.WithLogicalCPUs(2))
	require.NoError(t, err)
	_, err = ingraph.New(ingraph.Config{Devices: []string{strategy.LocalCPU(0), strategy.LocalCPU(7)},
		CrossDeviceOps: ingraph.ReductionToOneDevice{}, Session: so})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CPU:7")
	assert.Contains(t, err.Error(), "/job:localhost/replica:0/task:0/device:CPU:1")
}

// RunReplicas refuses, naming what is wrong, inputs that do not fit the
// step, a global count that is not positive, an ended context, and a step
// another strategy built (or none).
func TestRunChecksInputs(t *testing.T) {
	e := local(t, 2, nil)
	step := buildOn(t, e)
	_, err := e.RunReplicas(ctx, step, feeds(t, 1, 1), 1)
	assert.ErrorContains(t, err, "1 per-replica inputs, expected 2")
	bad := feeds(t, 2, 1)
	delete(bad[1], "x")
	_, err = e.RunReplicas(ctx, step, bad, 2)
	assert.ErrorContains(t, err, `replica 1: input "x" missing`)
	bad = feeds(t, 2, 1)
	bad[0]["x"] = tensor(t, []int32{1})
	_, err = e.RunReplicas(ctx, step, bad, 2)
	assert.ErrorContains(t, err, "dtype int32, expected float32")
	bad = feeds(t, 2, 1)
	bad[0]["x"] = tensor(t, [][]float32{{1}})
	_, err = e.RunReplicas(ctx, step, bad, 2)
	assert.ErrorContains(t, err, "shape [1 1], expected [-1]")
	_, err = e.RunReplicas(ctx, step, feeds(t, 2, 1), 0)
	assert.ErrorContains(t, err, "global batch count 0")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = e.RunReplicas(cctx, step, feeds(t, 2, 1), 2)
	assert.ErrorIs(t, err, context.Canceled)
	for name, foreign := range map[string]strategy.Step{"another engine's step": buildOn(t, local(t, 2, nil)), "no step": nil} {
		_, err = e.RunReplicas(ctx, foreign, feeds(t, 2, 1), 2)
		assert.ErrorContains(t, err, "the step was built by another strategy", name)
	}
}

// buildOn builds an identity step on e.
func buildOn(t *testing.T, e *ingraph.Engine) strategy.Step {
	t.Helper()
	step, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		return strategy.Outputs{"x": op.Identity(rc.Scope().SubScope("id"), in["x"])}, nil
	})
	require.NoError(t, err)
	return step
}

func TestNCCLOnCPUIsAnError(t *testing.T) {
	e := local(t, 2, ingraph.NCCLAllReduce{})
	_, err := e.Build(vecSpec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
		y, err := rc.AllReduce(strategy.Sum, in["x"])
		return strategy.Outputs{"y": y}, err
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NCCL needs every device to be a GPU")
}

// A process that runs part of the replicas learns the step's example count
// and whether any worker has another batch from one reduction, whether its
// reductions are packed or not: a step that reduces nothing of its own
// runs exactly one per run.
func TestWorkerAgreesOnCountsInOneReduction(t *testing.T) {
	e, err := ingraph.New(ingraph.Config{Name: "worker", Devices: []string{strategy.LocalCPU(0)},
		NumReplicasInSync: 2, NumWorkers: 2,
		CrossDeviceOps: testmodel.CountingOps{Inner: ingraph.ReductionToOneDevice{}, Counter: "reductions"}})
	require.NoError(t, err)
	defer e.Close()
	var counter strategy.Variable
	require.NoError(t, e.Scope(func(sc strategy.Scope) (err error) {
		counter, err = testmodel.NewCounter(sc, "reductions")
		return err
	}))
	step, err := e.Build(strategy.InputSpec{"x": {DType: tf.Float, Shape: []int64{-1}}},
		func(_ strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
			return strategy.Outputs{"x": in["x"]}, nil
		})
	require.NoError(t, err)
	var counts []int64
	after := testmodel.CountAfterRuns(ctx, e, counter, &counts)
	require.NoError(t, after(0))
	for run := range 3 {
		x, err := tf.NewTensor([]float32{1, 2, 3})
		require.NoError(t, err)
		_, err = e.RunReplicas(ctx, step, []map[string]*tf.Tensor{{"x": x}}, 3)
		require.NoError(t, err)
		require.NoError(t, after(run))
	}
	assert.Equal(t, []int64{1, 1, 1}, testmodel.Deltas(counts))
}

// TreeSumOn adds a device's own parts on that device and only the
// devices' sums across them (on the device named for that, or the first
// part's), so that a GPU's shards cross to another device as one sum; the
// additions are those of the tree on one device, so the bits are too.
func TestTreeSumOnAddsEachDevicesPartsOnIt(t *testing.T) {
	a, b, host := strategy.LocalCPU(1), strategy.LocalCPU(2), strategy.LocalCPU(0)
	devices := []string{a, a, a, a, b, b, b, b}
	s := op.NewScope()
	parts := make([]tf.Output, len(devices))
	for r, d := range devices {
		// Values whose sum depends on the grouping of its additions.
		parts[r] = op.Const(s.SubScope("part").WithDevice(d), []float32{1e8 * float32(r%3-1), 1.5 + float32(r)*1e-3, -0.3 * float32(r)})
	}
	onDevices := ingraph.TreeSumOn(s.SubScope("on").WithDevice(host), parts, devices, host)
	firstPart := ingraph.TreeSumOn(s.SubScope("first").WithDevice(host), parts, devices, "")
	plain := ingraph.TreeSumOn(s.SubScope("plain").WithDevice(host), parts, nil, "")
	g, err := s.Finalize()
	require.NoError(t, err)

	placed := map[string]map[string]int{"on": {}, "first": {}} // additions by scope and device
	for _, o := range g.Operations() {
		if scope, _, _ := strings.Cut(o.Name(), "/"); o.Type() == "AddV2" && placed[scope] != nil {
			placed[scope][o.Device()]++
		}
	}
	assert.Equal(t, map[string]int{a: 3, b: 3, host: 1}, placed["on"], "each device's 4 parts summed on it, the two sums on the host")
	assert.Equal(t, map[string]int{a: 4, b: 3}, placed["first"], "without a device for the sums across devices, the first part's")

	opts, err := tfrt.SessionOptions("", tfrt.WithLogicalCPUs(3))
	require.NoError(t, err)
	sess, err := tf.NewSession(g, opts)
	require.NoError(t, err)
	defer sess.Close()
	out, err := sess.Run(nil, []tf.Output{onDevices, firstPart, plain}, nil)
	require.NoError(t, err)
	want := out[2].Value().([]float32)
	assert.Equal(t, want, out[0].Value().([]float32), "the same additions, the same bits")
	assert.Equal(t, want, out[1].Value().([]float32))
}
