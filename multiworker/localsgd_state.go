package multiworker

import (
	"strings"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/engineops"
	"github.com/tfdist/tfdist/strategy"
)

// localSGDPrefix prefixes the names of local SGD's own variables: the
// count of training steps, the anchors and the outer update's slots, the
// same on every worker.
const localSGDPrefix = "tfdist_local_sgd/"

// workerCopiesState is a local SGD job's checkpoint state. Between two
// synchronisations each worker holds its own parameters, optimizer slots
// and statistics, so a checkpoint saves, besides the saving worker's value
// of each variable, every worker's copy (strategy.Saveable.Copies: one row
// per worker, or per replica of every worker for a variable each replica
// holds its own copy of), gathered at the save, which every worker runs.
// A restore into as many workers gives each its own copy back, so the job
// goes on as if never stopped; into another number of workers, or into a
// job without local SGD, every worker takes the saved value. Right after a
// synchronisation the parameters it synchronised are alike on every
// worker, and a checkpoint then saves their value alone.
type workerCopiesState struct {
	strategy.State
	s *Strategy
}

func (ws workerCopiesState) Saveables() []strategy.Saveable {
	out := ws.State.Saveables()
	synced := ws.s.localSGD.synced()
	for i, v := range out {
		if v.Variable == nil || len(v.Slices) != 1 || strings.HasPrefix(v.Name, localSGDPrefix) || synced[v.Variable] {
			continue
		}
		if _, ok := engineops.CollectiveDType(v.DType); !ok {
			continue
		}
		out[i].Copies = ws.s.workerCopies(v)
	}
	return out
}

// workerCopies returns the copies of v that a local SGD job saves: every
// worker's value, or, where the engine saves each local replica's copy,
// every replica's in global order, gathered across the workers.
func (s *Strategy) workerCopies(v strategy.Saveable) *strategy.ReplicaCopies {
	workers := len(s.workers)
	if c := v.Copies; c != nil {
		return &strategy.ReplicaCopies{Replicas: c.Replicas * workers, SaveSlice: strategy.SaveSlice{
			Device:   c.Device,
			Read:     s.gatherRows(v.Name, c.Read),
			Write:    c.Write, // takes its replicas' rows by their global ids
			Restored: c.Restored,
		}}
	}
	sl := v.Slices[0]
	one := func(sc *op.Scope) (tf.Output, error) {
		x, err := sl.Read(sc)
		if err != nil {
			return x, err
		}
		return op.ExpandDims(sc.SubScope("row"), x, op.Const(sc.SubScope("axis"), int32(0))), sc.Err()
	}
	return &strategy.ReplicaCopies{Replicas: workers, SaveSlice: strategy.SaveSlice{
		Device: sl.Device,
		Read:   s.gatherRows(v.Name, one),
		Write: func(sc *op.Scope, rows tf.Output) ([]*tf.Operation, error) {
			own := op.Gather(sc.SubScope("own"), rows, op.Const(sc.SubScope("worker"), int32(s.workerID)))
			return sl.Write(sc, own)
		},
		Restored: sl.Restored,
	}}
}

// gatherRows returns a Read that concatenates the rows read on every
// worker, in worker order.
func (s *Strategy) gatherRows(name string, read func(*op.Scope) (tf.Output, error)) func(*op.Scope) (tf.Output, error) {
	return func(sc *op.Scope) (tf.Output, error) {
		rows, err := read(sc)
		if err != nil {
			return rows, err
		}
		return engineops.AllGather(sc.SubScope("workers"), rows, s.localSGD.group, "save/workers/"+name), sc.Err()
	}
}

// synced returns the variables alike on every worker now: those of the
// fragments the last training step this process ran synchronised (none
// before its first, which may follow a restore).
func (l *localSGD) synced() map[strategy.Variable]bool {
	n := l.trained.Load()
	if n <= 0 || l.cfg.Overlap > 0 || l.cfg.Mix > 0 { // what lands is mixed with each worker's own
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[strategy.Variable]bool{}
	for _, f := range l.due(n) {
		for _, i := range l.frags[f] {
			out[l.vars[i]] = true
		}
	}
	return out
}
