// Package strategy is tfdist's contract: the Strategy interface that every
// distribution strategy implements, and the pieces a training program
// touches — Scope and Variable, Replica, Optimizer and ApplyContext,
// PerReplica values, ReduceOp, the compiled Step and CrossDeviceOps — with
// tf.distribute's meaning. Model code written against Scope, Variable and
// Replica (package nn's layers, say) runs unchanged under every strategy,
// the parameter-server strategy included.
//
// A program creates its variables inside Strategy.Scope, builds a replica
// function into a Step with Strategy.Build (the function is traced once per
// replica into one TensorFlow graph, never per step), and runs the Step once
// per global batch with Strategy.Run. A value the loop needs combined
// across replicas (the loss) is declared with Replica.ReduceOutput and
// comes back reduced from the step's own run:
//
//	err := s.Scope(func(sc strategy.Scope) error { m, err = NewModel(sc); return err })
//	step, err := s.Build(spec, func(r strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
//		loss := r.AverageLoss(m.PerExampleLoss(r, in["x"], in["y"]))
//		if err := r.ReduceOutput("loss", strategy.Sum, loss); err != nil {
//			return nil, err
//		}
//		return nil, r.Minimize(opt, loss, m.Vars())
//	})
//	for batch, err := range dist.All(ctx) {
//		res, err := s.Run(ctx, step, batch)
//		loss := res.Reduced("loss") // the global mean loss
//	}
//
// Outputs a step function returns come back per replica (PerReplica), for
// Strategy.Reduce or Gather to combine in a run of their own.
//
// Minimize with WithAccumulation(k) makes every run a micro-step: the
// in-graph engine adds each replica's gradients to accumulators without
// communicating for k-1 runs and all-reduces and applies them in the k-th,
// which alone returns the reduced outputs, averaged over all k runs.
//
// The strategies implement this contract in their own packages: the
// in-graph replication engine (internal) behind onedevice.Strategy,
// mirrored.Strategy and, with collective ops as its CrossDeviceOps,
// multiworker.Strategy; and paramserver. All compute runs in TensorFlow's
// runtime; the strategies only build and run graphs. State is the one
// extension point through which other packages (checkpoint) extend a
// strategy's graph and run it.
//
// Graph construction follows graft's op.Scope rules: an op without a name
// takes its type as its name, so give each op its own sub-scope
// (s.SubScope("dense")) to keep names unique.
package strategy
