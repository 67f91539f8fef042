package main

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkMultiWorkerSteps runs the classifier through tfdist launch with
// 1, 2 and 3 worker processes (one replica each, global batch 96) and
// reports each one's steps/s and its ratio to one worker, measured in one
// run. Run with -benchtime 1x: each iteration starts the processes.
func BenchmarkMultiWorkerSteps(b *testing.B) {
	if bins.err != nil {
		b.Fatal(bins.err)
	}
	const gb, steps = 96, 300
	for range b.N {
		rates := map[int]float64{}
		for _, workers := range []int{1, 2, 3} {
			out, err := launch(b, 5*time.Minute, []string{"--workers", fmt.Sprint(workers)},
				"-strategy", "multiworker", "-devices", "1", "-steps", fmt.Sprint(steps),
				"-global-batch", fmt.Sprint(gb), "-json", "-log-every", "0")
			if err != nil {
				b.Fatalf("%d workers: %v\n%s", workers, err, out)
			}
			res := results(b, out)
			r, ok := res["worker:0"]
			if !ok {
				b.Fatalf("%d workers: no result\n%s", workers, out)
			}
			rates[workers] = r.ExamplesPerSec / gb
			b.ReportMetric(rates[workers], fmt.Sprintf("%dw_steps/s", workers))
		}
		for _, w := range []int{2, 3} {
			b.ReportMetric(rates[w]/rates[1], fmt.Sprintf("%dw/1w", w))
		}
	}
}
