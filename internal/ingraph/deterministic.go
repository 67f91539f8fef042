package ingraph

import (
	"cmp"
	"fmt"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tfrt"
	"github.com/tfdist/tfdist/strategy"
)

// Topology-invariant training (Config.VirtualShards).
//
// Floating-point addition is commutative bit for bit; only its grouping
// changes the result. A job of V virtual shards runs V replicas in sync
// whatever its devices: each device runs V/N of them (N the devices across
// workers), every replica's step sees the same examples and shapes on
// every topology, and every cross-replica sum adds the V replicas' values
// along one binary tree over their ids (TreeSumOn on a worker, and
// collective.InTreeOrder across workers, whose members each bring the sum
// of an aligned block of leaves). V a power of two makes every block that
// a replica count dividing V cuts a subtree, so the sums, and the model,
// are the same bits on 1 device or on N. TensorFlow's op determinism is
// on for the process (tfrt.EnableOpDeterminism), so a kernel with no
// deterministic implementation fails rather than add in another order,
// and Build refuses the ops known to (refuseIrreproducible).

// ShardsPerReplica returns how many of v virtual shards each of n
// replicas in sync runs, or an error naming what would make it work: v a
// power of two, and n dividing it.
func ShardsPerReplica(v, n int) (int, error) {
	switch {
	case v <= 0 || v&(v-1) != 0:
		return 0, fmt.Errorf("deterministic with %d virtual shards: expected a power of two (1, 2, 4, 8, …), "+
			"so that every replica count dividing it splits the summation tree at the same places", v)
	case n <= 0 || v%n != 0:
		return 0, fmt.Errorf("deterministic with %d virtual shards: %d replicas in sync do not divide them; "+
			"expected a replica count that divides %d (a power of two up to %d)", v, n, v, v)
	}
	return v / n, nil
}

// virtualize makes cfg's replicas its virtual shards: each device
// repeated VirtualShards / NumReplicasInSync times, the replicas in sync
// and the first replica's id counted in shards, the session without
// Grappler (whose arithmetic optimizer would regroup a tree of additions
// into an AddN), and TensorFlow's op determinism on.
func (cfg *Config) virtualize() error {
	k, err := ShardsPerReplica(cfg.VirtualShards, cfg.NumReplicasInSync)
	if err != nil {
		return fmt.Errorf("strategy: %w", err)
	}
	cfg.Devices = VirtualDevices(cfg.Devices, k)
	cfg.NumReplicasInSync, cfg.FirstReplicaID = cfg.VirtualShards, cfg.FirstReplicaID*k
	if cfg.Session, err = tfrt.Configure(cfg.Session, tfrt.WithoutGraphRewrites()); err != nil {
		return fmt.Errorf("strategy: Config.Session: %w", err)
	}
	if err := tfrt.EnableOpDeterminism(); err != nil {
		return fmt.Errorf("strategy: deterministic with %d virtual shards: %w", cfg.VirtualShards, err)
	}
	return nil
}

// VirtualDevices returns devices with each one repeated k times in place:
// the devices of k virtual shards per replica, in shard order.
func VirtualDevices(devices []string, k int) []string {
	out := make([]string, 0, len(devices)*k)
	for _, d := range devices {
		for range k {
			out = append(out, d)
		}
	}
	return out
}

// statefulRandom are TensorFlow's ops whose numbers come from a generator
// with state: the process's seed when unseeded, and the op's runs so far.
var statefulRandom = map[string]bool{
	"RandomUniform": true, "RandomUniformInt": true, "RandomStandardNormal": true, "TruncatedNormal": true,
	"ParameterizedTruncatedNormal": true, "RandomGamma": true, "RandomPoisson": true, "RandomPoissonV2": true,
	"Multinomial": true, "RandomShuffle": true, "RandomCrop": true, "StatefulUniform": true,
	"StatefulUniformInt": true, "StatefulUniformFullInt": true, "StatefulStandardNormal": true,
	"StatefulStandardNormalV2": true, "StatefulTruncatedNormal": true, "StatefulRandomBinomial": true,
	"StatefulMultinomial": true, "SampleDistortedBoundingBox": true, "SampleDistortedBoundingBoxV2": true,
	"UniformCandidateSampler": true, "LogUniformCandidateSampler": true, "LearnedUnigramCandidateSampler": true,
	"ThreadUnsafeUnigramCandidateSampler": true, "FixedUnigramCandidateSampler": true,
	"RandomShuffleQueue": true, "RandomShuffleQueueV2": true,
}

// noDeterministicGPUKernel are the ops whose GPU kernels, in TensorFlow
// 2.18, have no deterministic implementation and fail under op
// determinism (some only for the attributes the function accepts), each
// with what would make the step work.
var noDeterministicGPUKernel = map[string]struct {
	when func(*tf.Operation) bool
	fix  string
}{
	"SoftmaxCrossEntropyWithLogits":       {fix: "compute the loss with nn.SoftmaxCrossEntropy, which uses log_softmax there"},
	"SparseSoftmaxCrossEntropyWithLogits": {fix: "compute the loss with nn.SparseSoftmaxCrossEntropy, which uses log_softmax there"},
	"SparseTensorDenseMatMul":             {},
	"Bincount":                            {},
	"DenseBincount":                       {},
	"ResizeNearestNeighborGrad":           {fix: "resize bilinearly, whose gradient is deterministic"},
	"AdjustContrastv2":                    {},
	"CropAndResizeGradImage":              {},
	"FusedBatchNormGrad":                  {when: notTraining},
	"FusedBatchNormGradV2":                {when: notTraining},
	"FusedBatchNormGradV3":                {when: notTraining},
	"DebugNumericSummaryV2": {when: func(o *tf.Operation) bool {
		mode, err := o.Attr("tensor_debug_mode")
		return err == nil && (mode == int64(3) || mode == int64(4)) // CONCISE_HEALTH, FULL_HEALTH
	}},
}

// notTraining reports whether o, a batch normalisation's gradient, is
// for inference (is_training false), the case without a deterministic
// GPU kernel.
func notTraining(o *tf.Operation) bool {
	training, err := o.Attr("is_training")
	return err == nil && training == false
}

// irreproducible returns why op o cannot give the same bits on every run
// and topology, and what would, or "" when it can.
func irreproducible(o *tf.Operation) string {
	switch t := o.Type(); {
	case statefulRandom[t]:
		return "draws from a stateful random generator, whose numbers depend on the process and on the op's runs so far, " +
			"which no checkpoint holds; draw them with a stateless random op keyed by a seed, the step and the replica " +
			"(StatelessRandomUniformV2 and the like, as nn.Dropout does)"
	case t == "Timestamp":
		return "returns the clock's time, another on every run; feed the time as an input instead"
	case t == "NonDeterministicInts":
		return "draws from the system's entropy, other numbers on every run; draw them with a stateless random op keyed by a seed"
	case tfrt.IsGPU(o.Device()):
		k, ok := noDeterministicGPUKernel[t]
		if !ok || (k.when != nil && !k.when(o)) {
			return ""
		}
		why := "has no deterministic GPU kernel in TensorFlow 2.18 and would fail when it runs; place it on a CPU, whose kernel is deterministic"
		if k.fix != "" {
			why += ", or " + k.fix
		}
		return why
	}
	return ""
}

// refuseIrreproducible returns an error naming the first of the graph's
// ops from the first'th on that cannot give the same bits on every run,
// topology and resume, why, and what would.
func (e *Engine) refuseIrreproducible(first int) error {
	ops := e.graph.Operations()[first:]
	for i := range ops {
		if o, why := &ops[i], irreproducible(&ops[i]); why != "" {
			return fmt.Errorf("deterministic with %d virtual shards: op %q (%s) %s", e.cfg.VirtualShards, o.Name(), o.Type(), why)
		}
	}
	return nil
}

// firstOnDevice returns, for each of devices, the index of its first
// occurrence: the virtual shard whose copies of OnWrite variables the
// device's shards share.
func firstOnDevice(devices []string) []int {
	first := make(map[string]int, len(devices))
	out := make([]int, len(devices))
	for r, d := range devices {
		if _, ok := first[d]; !ok {
			first[d] = r
		}
		out[r] = first[d]
	}
	return out
}

// holder returns the local replica that holds the copy of v that replica
// r uses: r itself, or under virtual shards, for an OnWrite variable, the
// first shard of r's device. The shards of a device share its one copy,
// written once a step, after they all read it; an OnRead variable keeps a
// copy per shard (a shard's BatchNorm statistics, say).
func (e *Engine) holder(v *variable, r int) int {
	if v.sync == strategy.OnWrite {
		return e.shared[r]
	}
	return r
}

// TreeSumOn adds parts along the binary tree over their indices that
// splits [lo, hi) at lo + (hi−lo)/2 (collective.InTreeOrder's), pairwise;
// one part is returned as it is. With devices nil every addition runs on
// s's device. Else devices[r] holds parts[r], and an addition of parts of
// one device runs on that device, one across devices on cross, or when
// cross is "" on the device of its first part. Under virtual shards a
// device's parts are contiguous and a power of two, a subtree, so each
// device sums its own shards and only one sum a device is copied (one a
// GPU to the host, rather than every shard's value). Where the additions
// run does not change them, nor the bits.
func TreeSumOn(s *op.Scope, parts []tf.Output, devices []string, cross string) tf.Output {
	if len(parts) == 1 {
		return parts[0]
	}
	mid := len(parts) / 2
	var left, right []string
	if devices != nil {
		left, right = devices[:mid], devices[mid:]
		s = s.WithDevice(additionDevice(devices, cross))
	}
	return op.AddV2(s, TreeSumOn(s.SubScope("left"), parts[:mid], left, cross), TreeSumOn(s.SubScope("right"), parts[mid:], right, cross))
}

// additionDevice is where TreeSumOn adds parts that lie on devices.
func additionDevice(devices []string, cross string) string {
	for _, d := range devices[1:] {
		if d != devices[0] {
			return cmp.Or(cross, devices[0])
		}
	}
	return devices[0]
}
