package distribute

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/paramserver"
)

// Run makes the strategy c names, calls train with it and closes it: one
// training program for every strategy, the elastic one included.
//
// Under "elastic" the process is a worker of an elastic job, whose
// rendezvous the environment names (tfdist launch --elastic sets it; see
// elastic.JoinFromEnv). Run calls train on each membership of the job in
// turn, with that membership's *multiworker.Strategy: train builds its
// model on it and trains, and package train's Fit goes on where the job
// was (a loop of one's own calls Resume and StepDone: see
// multiworker.RunElastic). Run returns nil once train does, and also when
// this worker left (Config.Leave) or the job finished while it waited to
// join: train's last call then returned an error, so a program that keeps
// its results only when train succeeds can tell.
//
// Under "ps", on a task other than the chief, Run serves the cluster until
// the job ends and returns nil without calling train.
func Run(ctx context.Context, c Config, train func(ctx context.Context, s Strategy) error) error {
	if c.Strategy == "elastic" {
		return runElastic(ctx, c, train)
	}
	s, err := Open(ctx, c)
	if errors.Is(err, paramserver.ErrNotChief) {
		return nil
	}
	if err != nil {
		return err
	}
	err = train(ctx, s)
	if cerr := s.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("distribute: close the strategy: %w", cerr))
	}
	return err
}

// runElastic joins the job's rendezvous and calls train on each
// membership's strategy.
func runElastic(ctx context.Context, c Config, train func(ctx context.Context, s Strategy) error) error {
	if err := c.check(); err != nil {
		return err
	}
	m, err := elastic.JoinFromEnv(ctx, 0)
	if errors.Is(err, elastic.ErrJobFinished) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("distribute: strategy elastic: %w", err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-c.Leave:
			m.LeaveSoon()
		case <-stop:
		}
	}()
	host := cmp.Or(c.Host, os.Getenv(elastic.EnvHost), "127.0.0.1")
	return multiworker.RunElastic(ctx, m, host, func(ctx context.Context, s *multiworker.Strategy) error {
		return train(ctx, s)
	}, multiworkerOptions(c)...)
}
