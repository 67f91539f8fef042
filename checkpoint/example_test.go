package checkpoint_test

import (
	"context"
	"fmt"
	"os"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/onedevice"
	"github.com/tfdist/tfdist/strategy"
)

// A training program calls RestoreLatest on start and resumes from the step
// it returns; it saves every so many steps, with the metadata it needs to
// resume its input where it stopped. Here a "step" adds 1 to w.
func ExampleManager() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "example-ckpt-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	train := func(until int64) error {
		s, err := onedevice.New()
		if err != nil {
			return err
		}
		defer s.Close()
		var w strategy.Variable
		if err := s.Scope(func(sc strategy.Scope) error {
			w, err = sc.Variable("w", tf.Float, nil, strategy.Zeros())
			return err
		}); err != nil {
			return err
		}
		m, err := checkpoint.NewManager(s, dir, checkpoint.WithMaxToKeep(3))
		if err != nil {
			return err
		}
		step, md, err := m.RestoreLatest(ctx)
		if err != nil {
			return err
		}
		pos, _ := md.Int64("input_position")
		fmt.Printf("resumed at step %d, input position %d\n", step, pos)
		for ; step < until; step++ {
			// A step of training: here, w counts the steps.
			next, err := tf.NewTensor(float32(step + 1))
			if err != nil {
				return err
			}
			if err := s.Assign(ctx, w, next); err != nil {
				return err
			}
			if (step+1)%50 == 0 {
				if _, err := m.Save(ctx, step+1, checkpoint.Metadata{"input_position": (step + 1) * 32}); err != nil {
					return err
				}
			}
		}
		v, err := s.Value(ctx, w)
		if err != nil {
			return err
		}
		fmt.Printf("w = %v after step %d\n", v.Value(), step)
		return nil
	}
	if err := train(100); err != nil {
		panic(err)
	}
	if err := train(200); err != nil { // a new process, say, after a failure
		panic(err)
	}
	// Output:
	// resumed at step 0, input position 0
	// w = 100 after step 100
	// resumed at step 100, input position 3200
	// w = 200 after step 200
}
