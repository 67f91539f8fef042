// Package paramserver is ParameterServerStrategy with a ClusterCoordinator:
// asynchronous data-parallel training for models whose variables are too
// large for one machine, or for clusters whose workers come and go.
// Variables live on the ps tasks; workers compute steps independently, each
// applying its gradients to the variables as soon as it has them; a
// coordinator on the chief schedules the steps and survives worker
// failures.
//
// # One program, every task
//
// As in TensorFlow, the same program runs on every task of a cluster with a
// chief, one or more workers and one or more ps tasks (TF_CONFIG; tfdist
// launch --chief --workers 2 --ps 2 starts one locally). New serves on the
// ps and worker tasks, until the program's context ends, and then returns
// ErrNotChief; on the chief it returns the Strategy:
//
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
//	s, err := paramserver.New(ctx, nil) // nil: the cluster from TF_CONFIG
//	if errors.Is(err, paramserver.ErrNotChief) {
//		return nil // this task served until the job ended
//	}
//	err = s.Scope(func(sc strategy.Scope) error {
//		emb, err = sc.Variable("emb", tf.Float, []int64{1 << 20, 64}, init,
//			strategy.WithPartitioner(paramserver.MaxShardBytes(64<<20, 0)))
//		...
//	})
//	train, err := s.Build(spec, func(rc strategy.Replica, in strategy.Inputs) (strategy.Outputs, error) {
//		rows, err := rc.Lookup(emb, in["ids"])
//		...
//		loss := rc.AverageLoss(perExample)
//		return strategy.Outputs{"loss": loss}, rc.Minimize(opt, loss, vars,
//			strategy.WithSparseOptimizer(optimizer.SparseSGD{LearningRate: 0.1}))
//	})
//	c, err := paramserver.NewCoordinator(s)
//	input, err := c.CreatePerWorkerDataset(datasetFn)
//	for range steps {
//		if _, err := c.Schedule(train, input); err != nil { ... }
//	}
//	err = c.Join(ctx)
//
// tfdist server serves a ps or worker task too, for programs that only run
// on the chief.
//
// # Variables
//
// A Scope places each variable on the next ps task, round-robin. A
// Partitioner (FixedShards, MaxShardBytes; per variable with strategy.WithPartitioner,
// or for all with WithPartitioner) splits a large variable along its first
// axis into shards of consecutive rows, placed round-robin too. A step reads
// a variable whole (Replica.Read: each shard read on its ps task,
// concatenated on the worker) or looks rows of it up (Replica.Lookup:
// an embedding lookup; each id goes to its shard and only the rows looked up
// travel). Minimize gives the variables a step reads a dense update from an
// optimizer of package optimizer (its slots live with the variable, on the
// same ps task, as TensorFlow's slot creator colocates them), and the
// variables it looks up a sparse update of the looked-up rows only, from a
// strategy.SparseOptimizer (optimizer.SparseSGD is a scatter-subtract), or,
// without one, the same optimizer's update of the whole variable from the
// looked-up rows' gradients, as a Keras optimizer updates an embedding
// (only those rows' gradients travel; Adam's slots and update cover every
// row). An OnRead
// variable is one variable like any other, written by each step in turn;
// AllReduce and AllGather are errors, since workers do not run in sync.
//
// The chief and each worker have a graph of their own, whose ops are
// placed on the tasks; each task computes its part in a TensorFlow session
// of its own, the ps tasks holding the variables, and tensors pass between
// tasks over tfdist's connections, not TensorFlow's gRPC runtime: a worker
// runs its step by reading from the ps tasks, computing, and sending its
// updates to them itself. WithTLS, or the certificate files the
// environment names, makes that traffic mutual TLS (package mtls).
// docs/guide-paramserver.md in the repository describes how.
//
// # The coordinator
//
// Coordinator.Schedule queues a step and returns a RemoteValue at once; one
// loop per worker takes steps from the queue and runs them, so as many steps
// run at once as there are workers. Join waits for everything scheduled and
// returns the first error; Done also ends the coordinator. A
// PerWorkerDataset is created once per worker from that worker's
// InputContext, and a step takes its input from the dataset of the worker
// that runs it.
//
// Per-worker datasets may end, each after its own number of elements. A
// step that finds its worker's dataset ended is no failure: it goes back to
// the front of the queue and runs on a worker whose dataset still has data,
// and the coordinator gives the ended worker no more steps on that dataset
// (other steps still run there). Once the dataset has ended on every
// worker, the steps still waiting for an element resolve with ErrEndOfData
// (which wraps io.EOF), as does every later Schedule with the dataset; Join
// does not report it, and Stats.EndOfData counts those steps.
// PerWorkerDataset.Consumed reports the elements each worker's dataset gave
// and Stats.PerWorker the steps each worker completed. Since Schedule does
// not block, a loop over the data joins every so many steps and stops when
// Schedule reports the end:
//
//	for n := 1; ; n++ {
//		_, err := c.Schedule(train, input)
//		if errors.Is(err, paramserver.ErrEndOfData) {
//			break
//		}
//		if err != nil { ... }
//		if n%100 == 0 {
//			if err := c.Join(ctx); err != nil { ... }
//		}
//	}
//	err = c.Join(ctx) // nil once every element has been used
//	consumed := input.Consumed() // elements taken from each worker's dataset
//
// A step whose worker dies — found by the run's error, or by a heartbeat
// that pings the worker while the step runs — goes back to the front of the
// queue with the same input; the dead worker is probed in the background and
// used again once it answers. Each step's update is guarded so that a rerun
// does not apply it again if the first run did: an update is applied once,
// except that a worker that dies in the microseconds in which the ps tasks
// apply its update may leave part of it to be applied again (see Function).
// AppliedSteps counts the updates applied. A step that fails with an error of its own is
// reported, not retried; one that fails as if its worker died on every
// attempt is reported after WithMaxAttempts. Steps waiting while no worker is
// up fail after WithWorkerWaitTimeout. A ps task that dies, or that restarted
// and lost its variables, fails every pending and later step with a
// *PSFailureError: restart the job and restore the last checkpoint.
//
// # Checkpoints
//
// checkpoint.NewSaver and checkpoint.NewManager save and restore the
// strategy as they do every strategy (through Strategy.State), in
// TensorFlow's V2 checkpoint format: each ps task saves what it holds
// (SaveV2 on the task) and the chief merges the shards. A sharded variable, and each of its
// optimizer slots, is one tensor of its whole shape in the checkpoint, each
// shard a slice of it, as TensorFlow saves partitioned variables: Restore
// reads it into any number of shards on any number of ps tasks, and Python's
// tf.train.load_checkpoint reads it whole. The applied-steps counter is
// saved too (AppliedStepsKey).
//
// # Limits
//
// A chief that fails ends the job, as in TensorFlow: restart the job and
// restore the last checkpoint. A worker that hangs without dying is caught
// only by WithStepTimeout. Each worker runs its steps on its CPU:0. When
// the ps tasks run on several machines, checkpoints need a file system
// that they share.
package paramserver
