package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/tfdist/tfdist/internal/classifier"
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

// BenchmarkDeterministic measures the cost of topology-invariant training:
// the classifier's steps/s with -deterministic V over its steps/s without,
// for the MLP and LeNet with batch normalisation, with 8 virtual shards on
// 1 device and on Mirrored's 2 (4 and 8 shards a device), and with 2 on 2
// devices (one a device: the tree's cost alone), in 3 pairs run in turn;
// it reports the median ratio of each. Run with -benchtime 1x.
func BenchmarkDeterministic(b *testing.B) {
	for range b.N {
		for _, model := range []string{"mlp", "lenet-bn"} {
			for _, c := range []struct{ strategy, devices, shards string }{{"default", "1", "8"}, {"mirrored", "2", "8"}, {"mirrored", "2", "2"}} {
				var ratios []float64
				for range 3 {
					rate := map[bool]float64{}
					for _, det := range []bool{false, true} {
						args := []string{"-model", model, "-strategy", c.strategy, "-devices", c.devices, "-steps", "400", "-log-every", "0"}
						if det {
							args = append(args, "-deterministic", c.shards)
						}
						res, err := classifier.Run(context.Background(), options(b, args...), io.Discard)
						if err != nil {
							b.Fatal(err)
						}
						rate[det] = res.ExamplesPerSec
					}
					ratios = append(ratios, rate[true]/rate[false])
				}
				slices.Sort(ratios)
				b.ReportMetric(ratios[1], fmt.Sprintf("%s_%s%s_V%s_det/plain", model, c.strategy, c.devices, c.shards))
			}
		}
	}
}
