package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/internal/models"
	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/internal/testmodel"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// floatValues reads every float variable of s, by name.
func floatValues(ctx context.Context, s interface {
	strategy.ValueReader
	Variables() []strategy.Variable
}) (map[string][]float32, error) {
	var vars []strategy.Variable
	for _, v := range s.Variables() {
		if v.DType() == tf.Float {
			vars = append(vars, v)
		}
	}
	vals, err := strategy.ReadVariables(ctx, s, vars)
	if err != nil {
		return nil, err
	}
	out := map[string][]float32{}
	for _, v := range vals {
		out[v.Name] = v.Float32
	}
	return out, nil
}

// The two workers of a 2-worker multiworker cluster (each its own
// TensorFlow server on a loopback port) run the same program: a Manager of
// the same directory, with no WithChief, saving after each of 2 training
// steps with the worker's id as metadata. The non-chief's Manager creates
// nothing (the directory does not exist until the chief's NewManager),
// its saves return "" and leave its temporary directory empty, and the
// shared directory holds the chief's files and nothing else: its
// checkpoints restore, into another strategy, the values the chief saved,
// with the chief's metadata.
func TestMultiWorkerOnlyChiefWritesByDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "shared")
	scratch := []string{t.TempDir(), t.TempDir()}
	const steps = 2
	var (
		saved    [2][steps + 1]map[string][]float32
		paths    [2][steps + 1]string
		isChief  [2]bool
		workerUp = make(chan struct{}) // the non-chief's Manager exists
	)
	newManager := func(w int, s *multiworker.Strategy) (*checkpoint.Manager, error) {
		if w == 0 {
			select {
			case <-workerUp:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		} else {
			defer close(workerUp)
		}
		m, err := checkpoint.NewManager(s, dir, checkpoint.WithWorkerTempDir(scratch[w]))
		if err != nil {
			return nil, err
		}
		if w == 1 {
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("the non-chief's NewManager made the shared directory (stat: %v)", err)
			}
		}
		return m, nil
	}
	errs := testcluster.OnWorkers(testcluster.LoopbackSpec(t, 2), []multiworker.Option{
		multiworker.WithStartupTimeout(30 * time.Second), multiworker.WithCollectiveTimeout(30 * time.Second)},
		func(w int, s *multiworker.Strategy) error {
			var m *checkpoint.Manager
			_, err := testmodel.TrainPlan(ctx, s, optimizer.NewSGD(optimizer.Constant(0.1)), testmodel.Plan{
				Model: "mlp", Steps: steps, MicroBatches: []int{32}, FirstReplica: w,
				AfterRuns: func(done int) error {
					var err error
					if done == 0 { // after Build
						if m, err = newManager(w, s); err == nil {
							isChief[w] = m.IsChief()
						}
						return err
					}
					if saved[w][done], err = floatValues(ctx, s); err != nil {
						return err
					}
					paths[w][done], err = m.Save(ctx, int64(done), checkpoint.Metadata{"worker": w})
					return err
				},
			})
			return err
		})
	// The non-chief's error first: the chief's is then only that its peer left.
	require.NoError(t, errors.Join(errs[1], errs[0]), "worker 1, then worker 0")

	assert.Equal(t, [2]bool{true, false}, isChief)
	var want []string
	for k := 1; k <= steps; k++ {
		prefix := filepath.Join(dir, fmt.Sprintf("ckpt-%d", k))
		assert.Equal(t, prefix, paths[0][k], "the chief's save %d", k)
		assert.Empty(t, paths[1][k], "the non-chief's save %d", k)
		want = append(want, filepath.Base(checkpoint.DataFile(prefix, 0, 1)), filepath.Base(checkpoint.IndexFile(prefix)))
	}
	want = append(want, checkpoint.StateFile)
	assert.ElementsMatch(t, want, names(t, dir), "the shared directory holds the chief's files only")
	for w := range 2 {
		assert.Empty(t, names(t, scratch[w]), "worker %d's temporary directory", w)
	}

	def, err := onedevice.New()
	require.NoError(t, err)
	defer def.Close()
	var model *nn.Sequential
	require.NoError(t, def.Scope(func(sc strategy.Scope) error {
		model, err = models.New(sc, "mlp", 32, 7) // another seed: the restore must change every value
		return err
	}))
	_, err = def.Build(models.Spec, models.TrainStep(model, optimizer.NewSGD(optimizer.Constant(0.1))))
	require.NoError(t, err)
	reader, err := checkpoint.NewManager(def, dir, checkpoint.WithChief(false))
	require.NoError(t, err)
	latest, err := reader.Latest()
	require.NoError(t, err)
	assert.Equal(t, paths[0][steps], latest)
	saver, err := checkpoint.NewSaver(def)
	require.NoError(t, err)
	for k := 1; k <= steps; k++ {
		md, err := saver.Restore(ctx, paths[0][k])
		require.NoError(t, err, "ckpt-%d", k)
		worker, _ := md.Int64("worker")
		step, _ := md.Int64(checkpoint.GlobalStepKey)
		assert.Equal(t, [2]int64{0, int64(k)}, [2]int64{worker, step}, "ckpt-%d's metadata", k)
		got, err := floatValues(ctx, def)
		require.NoError(t, err)
		assert.Equal(t, saved[0][k], got, "ckpt-%d restores what the chief saved", k)
	}
	assert.NotEqual(t, saved[0][1], saved[0][2], "the steps changed the variables")
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
