// Package train is Keras's model.compile, fit, evaluate and predict for
// tfdist: a training loop written once, which trains a functional model
// (nn.Model) under the default strategy, mirrored, multiworker and
// parameter servers alike.
//
//	tr, err := train.Compile(s, model, train.SparseCategoricalCrossentropy{FromLogits: true},
//		optimizer.NewAdam(optimizer.Constant(1e-3)), train.WithMetrics(train.SparseCategoricalAccuracy{}))
//	hist, err := tr.Fit(ctx, ds, train.Epochs(5), train.ValidationData(val),
//		train.WithCallbacks(train.NewProgressBar(os.Stdout), &train.EarlyStopping{Patience: 2}))
//	logs, err := tr.Evaluate(ctx, test, 0)
//	preds, err := tr.Predict(ctx, x, 0)
//
// Data is a dataset.Dataset batched by the global batch size, whose
// elements hold the model's inputs ("x" for a model of one input, or each
// input's name), the labels "y" and, optionally, "sample_weight".
//
// The loss of a step is Keras's: each example's loss is the mean of its
// elements, weighted by its sample weight, and the step minimizes the mean
// over the examples of the global step — divided by the examples actually
// there, so a partial last batch trains N replicas exactly as one device.
// The logs Fit reports are Keras's too: an epoch's loss is the mean of its
// steps' losses weighted by their examples, and each metric adds up its
// sums over the epoch. They come from every step's own run (one reduced
// vector), so they are exact across replicas and workers and cost no
// extra communication, and under parameter servers a step the
// coordinator runs twice counts once.
//
// Under a synchronous strategy every worker runs the same Fit, Evaluate
// and Predict calls; callbacks run on every worker with the same logs and
// write only on the chief. Under parameter servers the chief runs them and
// the coordinator schedules the steps, each on whichever worker is free,
// on the workers' own shards of the data: Fit then needs StepsPerEpoch.
package train
