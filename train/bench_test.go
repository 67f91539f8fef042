package train_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tfdist/tfdist/internal/testcluster"
	"github.com/tfdist/tfdist/monitoring"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/timeline"
	"github.com/tfdist/tfdist/train"
)

// BenchmarkObservability trains the small classifier on two 2-worker
// clusters in this process, one with a timeline and served metrics on
// every worker and one without, alternately in one run: 50 steps of Fit
// on each, in turn, 60 times, the first of each pair alternating. It
// reports each one's steps/s and the median over the pairs of their ratio,
// observed / plain. Run with -benchtime 1x.
func BenchmarkObservability(b *testing.B) {
	const rounds, steps = 60, 50
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plain := startFitting(b, func(int) []multiworker.Option { return workerOptions() })
	observed := startFitting(b, func(w int) []multiworker.Option {
		m := monitoring.New(fmt.Sprintf("worker:%d", w))
		if _, err := m.Serve(ctx, "127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
		return workerOptions(multiworker.WithTimeline(timeline.New(0)), multiworker.WithMonitoring(m))
	})
	defer plain.stop(b)
	defer observed.stop(b)
	for range b.N {
		var tPlain, tObserved time.Duration
		ratios := make([]float64, rounds)
		for i := range ratios {
			var p, o time.Duration
			if i%2 == 0 {
				p, o = plain.fit(b, steps), observed.fit(b, steps)
			} else {
				o, p = observed.fit(b, steps), plain.fit(b, steps)
			}
			tPlain, tObserved, ratios[i] = tPlain+p, tObserved+o, p.Seconds()/o.Seconds()
		}
		slices.Sort(ratios)
		b.ReportMetric(rounds*steps/tPlain.Seconds(), "plain_steps/s")
		b.ReportMetric(rounds*steps/tObserved.Seconds(), "observed_steps/s")
		b.ReportMetric(ratios[rounds/2], "observed/plain")
	}
}

// fitting is a 2-worker cluster whose workers Fit the steps asked of them.
type fitting struct {
	runs  [2]chan int
	times chan time.Duration
	errs  chan []error
}

func startFitting(b *testing.B, opts func(w int) []multiworker.Option) *fitting {
	f := &fitting{runs: [2]chan int{make(chan int), make(chan int)}, times: make(chan time.Duration, 2), errs: make(chan []error, 1)}
	spec := testcluster.LoopbackSpec(b, 2)
	go func() {
		f.errs <- testcluster.OnWorkersWith(spec, opts, func(w int, s *multiworker.Strategy) error {
			tr := compiled(b, s)
			ds, _ := overfitting(b)
			for n := range f.runs[w] {
				start := time.Now()
				if _, err := tr.Fit(context.Background(), ds, train.Epochs(1), train.StepsPerEpoch(n)); err != nil {
					return err
				}
				f.times <- time.Since(start)
			}
			return nil
		})
	}()
	return f
}

// fit runs n steps on both workers and returns the slower one's time.
func (f *fitting) fit(b *testing.B, n int) time.Duration {
	for _, r := range f.runs {
		r <- n
	}
	var slowest time.Duration
	for range f.runs {
		select {
		case d := <-f.times:
			slowest = max(slowest, d)
		case errs := <-f.errs:
			f.errs <- errs // for stop
			b.Fatal(errs)
		}
	}
	return slowest
}

func (f *fitting) stop(b *testing.B) {
	for _, r := range f.runs {
		close(r)
	}
	for w, err := range <-f.errs {
		if err != nil {
			b.Errorf("worker %d: %v", w, err)
		}
	}
}
