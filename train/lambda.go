package train

import "context"

// LambdaCallback is a Callback made of functions, as Keras's
// LambdaCallback: each hook calls its function, if set, and does nothing
// otherwise.
//
//	train.WithCallbacks(&train.LambdaCallback{
//		EpochEnd: func(ctx context.Context, r *train.Run, epoch int, logs train.Logs) error {
//			log.Info("epoch", zap.Int("epoch", epoch), zap.Float64("loss", logs["loss"]))
//			return nil
//		},
//	})
type LambdaCallback struct {
	// Label names the callback in errors (default "LambdaCallback").
	Label string

	TrainBegin func(ctx context.Context, r *Run) error
	TrainEnd   func(ctx context.Context, r *Run, logs Logs) error
	EpochBegin func(ctx context.Context, r *Run, epoch int) error
	EpochEnd   func(ctx context.Context, r *Run, epoch int, logs Logs) error
	BatchBegin func(ctx context.Context, r *Run, batch int) error
	BatchEnd   func(ctx context.Context, r *Run, batch int, logs Logs) error
}

// Name names the callback in errors: Label, or "LambdaCallback".
func (l *LambdaCallback) Name() string {
	if l.Label != "" {
		return l.Label
	}
	return "LambdaCallback"
}

// OnTrainBegin implements Callback.
func (l *LambdaCallback) OnTrainBegin(ctx context.Context, r *Run) error {
	if l.TrainBegin == nil {
		return nil
	}
	return l.TrainBegin(ctx, r)
}

// OnTrainEnd implements Callback.
func (l *LambdaCallback) OnTrainEnd(ctx context.Context, r *Run, logs Logs) error {
	if l.TrainEnd == nil {
		return nil
	}
	return l.TrainEnd(ctx, r, logs)
}

// OnEpochBegin implements Callback.
func (l *LambdaCallback) OnEpochBegin(ctx context.Context, r *Run, epoch int) error {
	if l.EpochBegin == nil {
		return nil
	}
	return l.EpochBegin(ctx, r, epoch)
}

// OnEpochEnd implements Callback.
func (l *LambdaCallback) OnEpochEnd(ctx context.Context, r *Run, epoch int, logs Logs) error {
	if l.EpochEnd == nil {
		return nil
	}
	return l.EpochEnd(ctx, r, epoch, logs)
}

// OnBatchBegin implements Callback.
func (l *LambdaCallback) OnBatchBegin(ctx context.Context, r *Run, batch int) error {
	if l.BatchBegin == nil {
		return nil
	}
	return l.BatchBegin(ctx, r, batch)
}

// OnBatchEnd implements Callback.
func (l *LambdaCallback) OnBatchEnd(ctx context.Context, r *Run, batch int, logs Logs) error {
	if l.BatchEnd == nil {
		return nil
	}
	return l.BatchEnd(ctx, r, batch, logs)
}
