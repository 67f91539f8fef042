package classifier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/multiworker"
)

// runElastic trains as a worker of an elastic job (tfdist launch
// --elastic): on each membership, the model and its steps are built on
// the membership's strategy and training goes on from the step Resume
// gives, the input skipping the global batches before it, as a resumed
// run's does.
func runElastic(ctx context.Context, o Options, train, test digits.Data, res *Result, log io.Writer) error {
	m, err := elastic.JoinFromEnv(ctx, 0)
	if errors.Is(err, elastic.ErrJobFinished) {
		fmt.Fprintln(log, "the elastic job has finished without this worker")
		return errNoResult
	}
	if err != nil {
		return err
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	defer signal.Stop(term)
	go func() {
		if _, ok := <-term; ok {
			m.LeaveSoon() // leave at the next step boundary
		}
	}()
	logger, err := o.logger()
	if err != nil {
		return errors.Join(err, m.Close())
	}
	opts, err := o.multiworkerOptions(logger)
	if err != nil {
		return errors.Join(err, m.Close())
	}
	err = multiworker.RunElastic(ctx, m, "127.0.0.1", func(ctx context.Context, s *multiworker.Strategy) error {
		g := &elasticSession{inGraph: &inGraph{o: o, s: s}, s: s}
		g.afterStep = s.StepDone
		res.Replicas, res.Workers, res.Chief = s.NumReplicasInSync(), s.NumWorkers(), s.IsChief()
		if err := g.build(train, res.Chief); err != nil {
			return err
		}
		defer g.inGraph.closeInput()
		return trainAndScore(ctx, o, g, test, res, log)
	}, opts...)
	switch {
	case err != nil:
		return err
	case m.Leaving():
		fmt.Fprintln(log, "left the elastic job")
		return errNoResult
	case res.ParamsSHA256 == "":
		fmt.Fprintln(log, "the elastic job has finished without this worker")
		return errNoResult
	}
	return nil
}

// errNoResult ends the run of a worker of an elastic job that has no
// model to report: it left, or the job finished while it waited to join.
var errNoResult = errors.New("classifier: this worker of the elastic job has no result")

// elasticSession is an in-graph session on a membership's strategy,
// which resumes from the state Resume gives rather than a checkpoint.
type elasticSession struct {
	*inGraph
	s *multiworker.Strategy
}

func (g *elasticSession) restore(ctx context.Context) (int, error) {
	n, err := g.s.Resume(ctx)
	return int(n), err
}
