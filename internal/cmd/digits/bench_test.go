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

// BenchmarkDeterministic measures the cost of topology-invariant training
// for the MLP and LeNet with batch normalisation, at global batches of 64
// and 2048: with 8 virtual shards on 1 device and on Mirrored's 2 (8 and 4
// shards a device), and with 2 on 2 devices (one a device: the tree's cost
// alone). Each case runs the classifier with -deterministic V and without,
// in 3 pairs run in turn, and reports two median ratios: the median step's
// time without over with ("step", the steady state), and examples/s with
// over without for the whole run, the first step's graph building included
// ("run"). Run with -benchtime 1x.
func BenchmarkDeterministic(b *testing.B) {
	type topology struct{ strategy, devices, shards string }
	for range b.N {
		for _, model := range []string{"mlp", "lenet-bn"} {
			for gb, steps := range map[int]int{64: 400, 2048: 60} {
				for _, c := range []topology{{"default", "1", "8"}, {"mirrored", "2", "8"}, {"mirrored", "2", "2"}} {
					var step, run []float64
					for range 3 {
						res := map[bool]classifier.Result{}
						for _, det := range []bool{false, true} {
							args := []string{"-model", model, "-strategy", c.strategy, "-devices", c.devices,
								"-global-batch", fmt.Sprint(gb), "-steps", fmt.Sprint(steps), "-log-every", "0"}
							if det {
								args = append(args, "-deterministic", c.shards)
							}
							r, err := classifier.Run(context.Background(), options(b, args...), io.Discard)
							if err != nil {
								b.Fatal(err)
							}
							res[det] = r
						}
						step = append(step, res[false].StepTimes.MedianMS/res[true].StepTimes.MedianMS)
						run = append(run, res[true].ExamplesPerSec/res[false].ExamplesPerSec)
					}
					name := fmt.Sprintf("%s_gb%d_%s%s_V%s", model, gb, c.strategy, c.devices, c.shards)
					b.ReportMetric(median(step), name+"_step_det/plain")
					b.ReportMetric(median(run), name+"_run_det/plain")
				}
			}
		}
	}
}

func median(x []float64) float64 {
	slices.Sort(x)
	return x[len(x)/2]
}
