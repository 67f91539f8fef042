package paramserver

import (
	"context"

	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/nn"
	"github.com/tfdist/tfdist/optimizer"
	"github.com/tfdist/tfdist/strategy"
)

// BenchmarkClassifier trains the digits classifier (64-64-10 MLP, batch 64,
// SGD) with scheduled steps on a cluster of one ps process and one, then
// two, worker processes, and reports, measured in one run:
//
//   - steps/s at 1 and 2 workers and their ratio (speedup@2w);
//   - the coordinator's overhead: the median time from Schedule to the
//     start of the step's run on an idle worker (Go queue, wake-up and
//     feeds), as a fraction of the median run of a step (overhead/step).
//
// Run it with: go test -run '^$' -bench Classifier -benchtime 1x ./paramserver
func BenchmarkClassifier(b *testing.B) {
	for range b.N {
		sps1, over1 := measureClassifier(b, 1)
		sps2, over2 := measureClassifier(b, 2)
		b.ReportMetric(sps1, "steps/s@1w")
		b.ReportMetric(sps2, "steps/s@2w")
		b.ReportMetric(sps2/sps1, "speedup@2w")
		b.ReportMetric(over1, "overhead/step@1w")
		b.ReportMetric(over2, "overhead/step@2w")
	}
}

func measureClassifier(b *testing.B, workers int) (stepsPerSec, overhead float64) {
	b.Helper()
	b.StopTimer()
	spec, _ := childCluster(b, workers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := New(ctx, chiefResolver(b, spec), WithStartupTimeout(time.Minute), WithThreads(1, 2))
	require.NoError(b, err)
	defer s.Close()
	var m *nn.Sequential
	require.NoError(b, s.Scope(func(sc strategy.Scope) (err error) { m, err = newMLP(sc, 64); return err }))
	train, _ := buildDigits(b, s, m, optimizer.NewSGD(optimizer.Constant(0.1)))
	c, err := NewCoordinator(s)
	require.NoError(b, err)
	defer c.Done(ctx)
	trainData, _ := digitsData(b)
	input := perWorkerDigits(b, c, trainData, 64)
	schedule := func(n int, in Input) []*RemoteValue {
		rvs := make([]*RemoteValue, n)
		for i := range rvs {
			rvs[i], err = c.Schedule(train, in)
			require.NoError(b, err)
		}
		require.NoError(b, c.Join(ctx))
		return rvs
	}
	schedule(20*workers, input) // connect and warm up every worker

	const steps = 300
	b.StartTimer()
	start := time.Now()
	schedule(steps, input)
	stepsPerSec = steps / time.Since(start).Seconds()
	b.StopTimer()

	// One step at a time, so that a worker is idle when each is scheduled.
	batch := dataset.Element{"x": tensor(b, trainData.X[:64]), "y": tensor(b, trainData.Y[:64])}
	var queued, ran []time.Duration
	for range 50 {
		rv := schedule(1, Feed(batch))[0]
		info := rv.Info()
		queued, ran = append(queued, info.Queued), append(ran, info.Ran)
	}
	slices.Sort(queued)
	slices.Sort(ran)
	q, r := queued[len(queued)/2], ran[len(ran)/2]
	b.Logf("%d worker(s): %.0f steps/s; median schedule-to-start %v, median step %v", workers, stepsPerSec, q, r)
	return stepsPerSec, float64(q) / float64(r)
}
