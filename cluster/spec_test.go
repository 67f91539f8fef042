package cluster_test

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
)

func psSpec(t *testing.T) cluster.ClusterSpec {
	t.Helper()
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief:  {"127.0.0.1:5000"},
		cluster.Worker: {"127.0.0.1:5001", "127.0.0.1:5002"},
		cluster.PS:     {"127.0.0.1:5003", "127.0.0.1:5004"},
	})
	require.NoError(t, err)
	return spec
}

func TestNewClusterSpecRejectsWhatTFConfigRejects(t *testing.T) {
	cases := map[string]map[cluster.TaskType][]string{
		"unknown job":  {"master": {"127.0.0.1:1"}},
		"empty job":    {cluster.Worker: {}},
		"bad address":  {cluster.Worker: {"127.0.0.1"}},
		"duplicate":    {cluster.Worker: {"127.0.0.1:1"}, cluster.PS: {"127.0.0.1:1"}},
		"two chiefs":   {cluster.Chief: {"127.0.0.1:1", "127.0.0.1:2"}},
		"out of range": {cluster.Worker: {"127.0.0.1:65536"}},
	}
	for name, jobs := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := cluster.NewClusterSpec(jobs)
			assert.ErrorIs(t, err, cluster.ErrInvalid)
			assert.Contains(t, err.Error(), "invalid cluster spec")
		})
	}
	_, err := cluster.NewSparseClusterSpec(map[cluster.TaskType]map[int]string{cluster.Worker: {-1: "127.0.0.1:1"}})
	assert.ErrorIs(t, err, cluster.ErrInvalid, "negative index")
}

func TestClusterSpecIsImmutable(t *testing.T) {
	addrs := []string{"127.0.0.1:1", "127.0.0.1:2"}
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: addrs})
	require.NoError(t, err)
	addrs[0] = "127.0.0.1:9"
	m := spec.AsMap()
	m[cluster.Worker][1] = "127.0.0.1:9"
	a, err := spec.TaskAddress(cluster.Worker, 0)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:1", a)
	a, err = spec.TaskAddress(cluster.Worker, 1)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:2", a)
}

func TestTasksInCanonicalOrder(t *testing.T) {
	spec := psSpec(t)
	var got []string
	for _, task := range spec.Tasks() {
		got = append(got, task.String())
	}
	assert.Equal(t, []string{"chief:0", "worker:0", "worker:1", "ps:0", "ps:1"}, got)
	assert.Equal(t, `{"chief":["127.0.0.1:5000"],"worker":["127.0.0.1:5001","127.0.0.1:5002"],"ps":["127.0.0.1:5003","127.0.0.1:5004"]}`, spec.String())
}

func TestTaskAddressNamesWhatExists(t *testing.T) {
	spec := psSpec(t)
	_, err := spec.TaskAddress(cluster.Worker, 2)
	assert.ErrorIs(t, err, cluster.ErrNoSuchTask)
	assert.Contains(t, err.Error(), "0..1")
	_, err = spec.TaskAddress(cluster.Evaluator, 0)
	assert.ErrorIs(t, err, cluster.ErrNoSuchTask)
	assert.Contains(t, err.Error(), `"chief", "worker", "ps"`)
}

// IsChief follows tf.distribute's multi_worker_util.is_chief.
func TestIsChief(t *testing.T) {
	withChief := psSpec(t)
	noChief, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Worker: {"127.0.0.1:1", "127.0.0.1:2"}, cluster.Evaluator: {"127.0.0.1:3"},
	})
	require.NoError(t, err)
	cases := []struct {
		spec cluster.ClusterSpec
		task cluster.Task
		want bool
	}{
		{withChief, cluster.Task{Type: cluster.Chief}, true},
		{withChief, cluster.Task{Type: cluster.Worker, Index: 0}, false},
		{withChief, cluster.Task{Type: cluster.PS, Index: 0}, false},
		{noChief, cluster.Task{Type: cluster.Worker, Index: 0}, true},
		{noChief, cluster.Task{Type: cluster.Worker, Index: 1}, false},
		{noChief, cluster.Task{Type: cluster.Evaluator}, true},
		{withChief, cluster.Task{Type: cluster.Evaluator}, true}, // an evaluator may be outside the cluster
		{noChief, cluster.Task{Type: cluster.Worker, Index: 7}, false},
		{cluster.ClusterSpec{}, cluster.Task{}, true},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, c.spec.IsChief(c.task), "%s in %s", c.task, c.spec)
	}
}

func TestMultiWorkerHelpers(t *testing.T) {
	spec := psSpec(t)
	assert.Equal(t, 3, spec.WorkerCount())
	assert.Equal(t, "/job:chief/replica:0/task:0", spec.CollectiveLeader())
	id, err := spec.IDInCluster(cluster.Task{Type: cluster.Worker, Index: 1})
	require.NoError(t, err)
	assert.Equal(t, 2, id, "the chief is id 0, so worker 1 is id 2")
	_, err = spec.IDInCluster(cluster.Task{Type: cluster.PS, Index: 0})
	assert.Error(t, err)
	_, err = spec.IDInCluster(cluster.Task{Type: cluster.Worker, Index: 5})
	assert.ErrorIs(t, err, cluster.ErrNoSuchTask)

	workers, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: {"127.0.0.1:1", "127.0.0.1:2"}})
	require.NoError(t, err)
	assert.Equal(t, "/job:worker/replica:0/task:0", workers.CollectiveLeader())
	assert.Equal(t, "", cluster.ClusterSpec{}.CollectiveLeader())
}

func TestSplitEvaluator(t *testing.T) {
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {"127.0.0.1:1"}, cluster.Worker: {"127.0.0.1:2"}, cluster.Evaluator: {"127.0.0.1:3"},
	})
	require.NoError(t, err)
	assert.Equal(t, []cluster.TaskType{cluster.Evaluator}, spec.SplitEvaluator(cluster.Evaluator).Jobs())
	assert.Equal(t, []cluster.TaskType{cluster.Chief, cluster.Worker}, spec.SplitEvaluator(cluster.Worker).Jobs())
	assert.Equal(t, 3, len(spec.Tasks()), "splitting leaves the spec alone")
	training := psSpec(t)
	assert.True(t, training.SplitEvaluator(cluster.Worker).Equal(training))
}

func TestFingerprintDependsOnlyOnTheCluster(t *testing.T) {
	a, err := cluster.ParseTFConfig([]byte(`{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, "task": {"type": "worker", "index": 0}}`))
	require.NoError(t, err)
	// Same cluster, other task, other key order, dict form.
	b, err := cluster.ParseTFConfig([]byte(`{"task": {"type": "ps", "index": 0}, "cluster": {"ps": {"0": "127.0.0.1:3"}, "worker": {"1": "127.0.0.1:2", "0": "127.0.0.1:1"}}}`))
	require.NoError(t, err)
	assert.Equal(t, a.Cluster.Fingerprint(), b.Cluster.Fingerprint())
	assert.Len(t, a.Cluster.Fingerprint().String(), 16)

	// Swapping two workers is a different cluster.
	c, err := cluster.ParseTFConfig([]byte(`{"cluster": {"worker": ["127.0.0.1:2", "127.0.0.1:1"], "ps": ["127.0.0.1:3"]}, "task": {"type": "worker", "index": 0}}`))
	require.NoError(t, err)
	assert.NotEqual(t, a.Cluster.Fingerprint(), c.Cluster.Fingerprint())

	// The encoding is part of the API (sha256 of "job\x00index\x00address\n"
	// lines, checked with Python), so tasks built from other versions agree.
	assert.Equal(t, "1536cee26e752e4c", a.Cluster.Fingerprint().String())
}

func TestCheckFingerprintsNamesTheTaskThatDisagrees(t *testing.T) {
	spec := psSpec(t)
	want := spec.Fingerprint()
	other, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: {"127.0.0.1:9"}})
	require.NoError(t, err)
	got := map[cluster.Task]cluster.Fingerprint{
		{Type: cluster.Chief}:            want,
		{Type: cluster.Worker, Index: 1}: other.Fingerprint(),
		{Type: cluster.Worker, Index: 0}: want,
		{Type: cluster.PS, Index: 1}:     other.Fingerprint() + 1,
	}
	err = cluster.CheckFingerprints(want, got)
	var me *cluster.MismatchError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, []cluster.Task{{Type: cluster.Worker, Index: 1}, {Type: cluster.PS, Index: 1}}, me.Tasks)
	assert.Contains(t, err.Error(), "worker:1 has "+other.Fingerprint().String())
	assert.Contains(t, err.Error(), "ps:1")
	assert.NotContains(t, err.Error(), "worker:0")

	assert.NoError(t, cluster.CheckFingerprints(want, map[cluster.Task]cluster.Fingerprint{{Type: cluster.Chief}: want}))
}

func TestServerDef(t *testing.T) {
	spec := psSpec(t)
	def, err := spec.ServerDef(cluster.PS, 1, nil)
	require.NoError(t, err)
	assert.Equal(t, "ps", def.GetJobName())
	assert.Equal(t, int32(1), def.GetTaskIndex())
	assert.Equal(t, "grpc", def.GetProtocol())
	var jobs []string
	for _, j := range def.GetCluster().GetJob() {
		jobs = append(jobs, j.GetName())
	}
	assert.Equal(t, []string{"chief", "worker", "ps"}, jobs)
	assert.Equal(t, map[int32]string{0: "127.0.0.1:5003", 1: "127.0.0.1:5004"}, def.GetCluster().GetJob()[2].GetTasks())

	_, err = spec.ServerDef(cluster.Worker, 2, nil)
	assert.ErrorIs(t, err, cluster.ErrNoSuchTask)
	_, err = spec.ServerDef(cluster.Evaluator, 0, nil)
	assert.ErrorIs(t, err, cluster.ErrNoSuchTask)
}

func TestClusterSpecJSON(t *testing.T) {
	var spec cluster.ClusterSpec
	require.NoError(t, json.Unmarshal([]byte(`{"worker": ["127.0.0.1:1"], "ps": {"2": "127.0.0.1:2"}}`), &spec))
	assert.Equal(t, []int{2}, spec.TaskIndices(cluster.PS))
	out, err := json.Marshal(spec)
	require.NoError(t, err)
	assert.JSONEq(t, `{"worker": ["127.0.0.1:1"], "ps": {"2": "127.0.0.1:2"}}`, string(out))
	err = json.Unmarshal([]byte(`{"worker": ["nope"]}`), &spec)
	assert.ErrorIs(t, err, cluster.ErrInvalid)

	var holder struct{ Cluster cluster.ClusterSpec }
	require.NoError(t, json.Unmarshal([]byte(`{"Cluster": null}`), &holder))
	assert.True(t, holder.Cluster.IsEmpty())
}

func TestDeviceNames(t *testing.T) {
	assert.Equal(t, "/job:worker/replica:0/task:1", cluster.TaskDevice("worker", 1))
	assert.Equal(t, "/job:worker/replica:0/task:1/device:CPU:0", cluster.DeviceName("worker", 1, "cpu", 0))
	assert.Equal(t, "/job:localhost/replica:0/task:0/device:GPU:1", cluster.LocalDevice("GPU", 1))
	assert.Equal(t, "/job:ps/replica:0/task:2", cluster.Task{Type: cluster.PS, Index: 2}.Device())
	assert.Equal(t, "/job:localhost/replica:0/task:0", cluster.Task{}.Device())
}

func TestParseTask(t *testing.T) {
	task, err := cluster.ParseTask("worker:3")
	require.NoError(t, err)
	assert.Equal(t, cluster.Task{Type: cluster.Worker, Index: 3}, task)
	assert.Equal(t, "worker:3", task.String())
	for _, bad := range []string{"worker", "master:0", "worker:-1", "worker:x", ""} {
		_, err := cluster.ParseTask(bad)
		assert.Error(t, err, bad)
	}
}

func TestWaitForTasks(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer up.Close()
	down, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	downAddr := down.Addr().String()
	require.NoError(t, down.Close()) // nothing listens there any more

	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: {up.Addr().String(), downAddr}})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // ample on a loaded machine
	defer cancel()
	require.NoError(t, cluster.WaitForTasks(ctx, spec, cluster.Task{Type: cluster.Worker, Index: 0}))

	// A peer that never comes up: a bounded wait, then an error naming it.
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- cluster.WaitForTasks(ctx, spec) }()
	select {
	case err = <-waited:
	case <-time.After(30 * time.Second): // unbounded by its context, the wait never ends
		t.Fatal("WaitForTasks still waits 30 s after its 300 ms context ended")
	}
	var ue *cluster.UnreachableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, []cluster.Task{{Type: cluster.Worker, Index: 1}}, ue.Tasks)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "worker:1 at "+downAddr)

	// A peer that comes up late is waited for.
	late, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lateAddr := late.Addr().String()
	require.NoError(t, late.Close())
	spec, err = cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: {lateAddr}})
	require.NoError(t, err)
	go func() {
		time.Sleep(200 * time.Millisecond)
		if l, err := net.Listen("tcp", lateAddr); err == nil {
			t.Cleanup(func() { l.Close() })
		}
	}()
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	assert.NoError(t, cluster.WaitForTasks(ctx, spec))
}
