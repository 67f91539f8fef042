package train

import (
	"context"
	"fmt"

	"github.com/tfdist/tfdist/dataset"
)

// scaledBatches checks what PerReplicaBatch(b) needs — a synchronous
// strategy, an Adjustable learning rate, a dataset of single examples —
// and returns ds batched by the global batch, b × the replicas in sync,
// and that batch.
func (t *Trainer) scaledBatches(ctx context.Context, ds dataset.Dataset, b int) (dataset.Dataset, int, error) {
	e, ok := t.eng.(*syncEngine)
	if !ok {
		return nil, 0, fmt.Errorf("PerReplicaBatch(%d) under the parameter-server strategy: its workers step asynchronously, a batch each, with no global batch to scale the learning rate by; batch the data by the per-worker batch instead", b)
	}
	if _, _, err := t.adjustable(); err != nil {
		return nil, 0, fmt.Errorf("PerReplicaBatch(%d) scales the learning rate: %w", b, err)
	}
	el, err := firstElement(ctx, ds)
	if err != nil {
		return nil, 0, fmt.Errorf("training data: %w", err)
	}
	if k, err := t.keysFor(el, false); err == nil {
		in := t.model.Inputs()[0]
		return nil, 0, fmt.Errorf("PerReplicaBatch(%d): the training data's %q is of shape %v, a batch of input %q of shape %v; expected single examples, which Fit batches itself (drop the dataset's Batched)",
			b, k.inputs[0], el[k.inputs[0]].Shape(), in.Name, in.Shape)
	}
	global := b * e.s.NumReplicasInSync()
	return dataset.Batched(ds, global, false), global, nil
}

// scaleRate, under PerReplicaBatch, scales the learning rate to r's
// replicas from the replicas it was scaled for: those of the progress or
// backup resumed from, else of the Trainer's last such Fit, else one (the
// rate compiled or set is one replica's).
func (t *Trainer) scaleRate(ctx context.Context, r *Run) error {
	if r.replicas == 0 {
		return nil
	}
	from := t.rateReplicas
	if r.resumed {
		from = r.resumeReplicas
	}
	from = max(from, 1)
	if from != r.replicas {
		lr, err := t.LearningRate(ctx)
		if err != nil {
			return err
		}
		if err := t.SetLearningRate(ctx, lr*float64(r.replicas)/float64(from)); err != nil {
			return err
		}
	}
	t.rateReplicas = r.replicas
	return nil
}

// exampleFeed is the input of PerReplicaBatch: a dataset of single
// examples batched by the global batch, which resumes in examples, so that
// a job resumed on another number of replicas skips exactly the examples
// of the epoch it trained.
type exampleFeed struct {
	main     *syncFeed // every epoch but a resumed one
	resumed  *syncFeed // the resumed epoch's, until it ends
	replay   int       // the passes main replays before its next epoch
	examples dataset.Dataset
	global   int
}

func (e *syncEngine) exampleFeed(examples, batches dataset.Dataset, global int) (*exampleFeed, error) {
	main, err := e.syncFeed(batches, 0)
	if err != nil {
		return nil, err
	}
	return &exampleFeed{main: main, examples: examples, global: global}, nil
}

func (f *exampleFeed) chunk() int { return 1 }

func (f *exampleFeed) startEpoch(ctx context.Context) error {
	if f.resumed == nil {
		return f.main.startEpoch(ctx)
	}
	err := f.resumed.close()
	f.resumed = nil
	if err != nil {
		return err
	}
	return f.main.skip(ctx, f.replay, position{})
}

func (f *exampleFeed) run(ctx context.Context, step any, n int, each func([]float64) error) (int, error) {
	if f.resumed != nil {
		return f.resumed.run(ctx, step, n, each)
	}
	return f.main.run(ctx, step, n, each)
}

// skip resumes the epoch after epochs passes at.examples examples in: its
// batches are those of the examples after them, from a pass opened after
// as many passes (so that a reshuffling pipeline has the same order), and
// main, replaying one pass more, gives the epochs after it.
func (f *exampleFeed) skip(ctx context.Context, epochs int, at position) error {
	if at.examples == 0 {
		return f.main.skip(ctx, epochs, position{})
	}
	r, err := f.main.e.syncFeed(dataset.Batched(dataset.Skip(f.examples, at.examples), f.global, false), 0)
	if err != nil {
		return err
	}
	if r.dist.Policy() == dataset.ShardFile {
		r.close()
		return fmt.Errorf("resuming after %d examples of an epoch: the workers read their own files (FILE sharding), so the examples trained on cannot be skipped; use data sharded by DATA", at.examples)
	}
	if err := r.skip(ctx, epochs, position{}); err != nil {
		r.close()
		return err
	}
	f.resumed, f.replay = r, epochs+1
	return nil
}

func (f *exampleFeed) close() error {
	if f.resumed != nil {
		f.resumed.close()
	}
	return f.main.close()
}
