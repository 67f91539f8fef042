package multiworker_test

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"go.uber.org/goleak"

	"github.com/tfdist/tfdist/checkpoint"
	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/strategy"
)

// A step blocked in a collective, because a peer never runs it, returns
// when its context's deadline passes or it is cancelled, wrapping the
// context's error, rather than at the collective timeout, and the strategy
// then refuses further steps.
func TestRunHonoursItsContext(t *testing.T) {
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Second)
		},
			context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(time.Second, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan struct{})
			var took time.Duration
			errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithStartupTimeout(30 * time.Second),
				multiworker.WithCollectiveTimeout(collectiveTimeout)},
				func(w int, s *multiworker.Strategy) error {
					_, step, err := mlpStep(s)
					if err != nil {
						return err
					}
					if w == 1 {
						<-done // never runs the step
						return nil
					}
					defer close(done)
					ctx, cancel := c.ctx()
					defer cancel()
					start := time.Now()
					_, err = s.Run(ctx, step, oneExample(t))
					took = time.Since(start)
					require.ErrorIs(t, err, c.want)
					assert.ErrorIs(t, err, strategy.ErrCannotContinue)
					_, err = s.Run(context.Background(), step, oneExample(t))
					assert.ErrorIs(t, err, strategy.ErrCannotContinue, "the strategy refuses further steps")
					return nil
				})
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			assert.Less(t, took, collectiveTimeout/2, "the step returns when its context ends, 1 s in, not at the %v collective timeout", collectiveTimeout)
		})
	}
}

func oneExample(t *testing.T) *dataset.Batch {
	b, err := exampleBatch()
	require.NoError(t, err)
	return b
}

// collectiveTimeout is the collective timeout of the tests that check a
// call ends with its context rather than at this timeout: long, so that
// they can take up to half of it, however loaded the machine, and still
// tell the two apart.
const collectiveTimeout = 2 * time.Minute

// backends are the two collective implementations of the tests that run
// on both.
var backends = []multiworker.Communication{multiworker.Auto, multiworker.Ring}

// noLeaks returns a check, for the end of a test, that every goroutine
// started since is gone (the collective ops' queue, started once per
// process, aside).
func noLeaks(t *testing.T) func() {
	base := goleak.IgnoreCurrent()
	return func() {
		t.Helper()
		goleak.VerifyNone(t, base, goleak.IgnoreAnyFunction("github.com/tfdist/tfdist/internal/tfrt.serveQueue.func1"))
	}
}

// endingContext is a context that ends by deadline after d, or by
// cancellation after d, and reports when it ended.
func endingContext(t *testing.T, deadline bool, d time.Duration) (context.Context, func() time.Time) {
	if deadline {
		end := time.Now().Add(d)
		ctx, cancel := context.WithDeadline(context.Background(), end)
		t.Cleanup(cancel)
		return ctx, func() time.Time { return end }
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ended := make(chan time.Time, 1)
	time.AfterFunc(d, func() { ended <- time.Now(); cancel() })
	return ctx, func() time.Time { return <-ended }
}

// A call blocked in a collective because its peer process is stopped
// (SIGSTOP: its connections stay open) returns at its context's deadline,
// wrapping context.DeadlineExceeded; one whose peer is alive but never
// joins returns at its cancellation, wrapping context.Canceled; on both
// backends, and whether the call is a step or a Reduce: not at the
// collective timeout. The strategy then refuses every call at once, saying
// why, rather than waiting for the peer again, and, once closed, leaves no
// goroutine behind.
func TestBlockedCallEndsWithItsContext(t *testing.T) {
	for _, comm := range backends {
		for _, c := range []struct {
			name     string
			stop     bool // SIGSTOP the peer; else it is idle
			deadline bool // a deadline; else a cancellation
			reduce   bool // Reduce; else Run
		}{
			{"step, stopped peer, deadline", true, true, false},
			{"step, idle peer, cancel", false, false, false},
			{"reduce, stopped peer, deadline", true, true, true},
		} {
			t.Run(comm.String()+"/"+c.name, func(t *testing.T) {
				leaks := noLeaks(t)
				s, step, p := withPeer(t, comm, peerIdle, multiworker.WithCollectiveTimeout(collectiveTimeout))
				if c.stop {
					p.signal(t, syscall.SIGSTOP)
				}
				ctx, ended := endingContext(t, c.deadline, time.Second)
				call := func(ctx context.Context) error {
					if c.reduce {
						x, err := tf.NewTensor(float32(1))
						require.NoError(t, err)
						_, err = s.Reduce(ctx, strategy.Sum, strategy.PerReplica{x})
						return err
					}
					_, err := s.Run(ctx, step, oneExample(t))
					return err
				}
				err := call(ctx)
				late := time.Since(ended())
				if c.deadline {
					require.ErrorIs(t, err, context.DeadlineExceeded)
				} else {
					require.ErrorIs(t, err, context.Canceled)
				}
				require.ErrorIs(t, err, strategy.ErrCannotContinue)
				assert.Less(t, late, collectiveTimeout/2, "returned %v after its context ended; the collective timeout is %v", late, collectiveTimeout)
				t.Logf("returned %v after its context ended", late)

				start := time.Now()
				err = call(context.Background())
				require.ErrorIs(t, err, strategy.ErrCannotContinue, "the strategy refuses further calls")
				assert.ErrorContains(t, err, "run stopped by its context")
				assert.Less(t, time.Since(start), collectiveTimeout/2, "at once, not at the %v collective timeout", collectiveTimeout)
				p.kill()
				require.NoError(t, s.Close())
				leaks()
			})
		}
	}
}

// A checkpoint's save waits in a collective for a peer that never saves
// (an OnRead variable is saved as the sum over every worker's replicas);
// it returns at its context's deadline, wrapping it, not at the collective
// timeout.
func TestCheckpointSaveEndsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	done := make(chan struct{})
	errs := onWorkers(loopbackSpec(t, 2), []multiworker.Option{multiworker.WithStartupTimeout(30 * time.Second),
		multiworker.WithCollectiveTimeout(collectiveTimeout)},
		func(w int, s *multiworker.Strategy) error {
			if err := s.Scope(func(sc strategy.Scope) error {
				_, err := sc.Variable("seen", tf.Float, nil, strategy.Zeros(),
					strategy.WithSynchronization(strategy.OnRead), strategy.WithAggregation(strategy.AggregationSum))
				return err
			}); err != nil {
				return err
			}
			if w == 1 {
				<-done // never saves
				return nil
			}
			defer close(done)
			saver, err := checkpoint.NewSaver(s)
			require.NoError(t, err)
			ctx, ended := endingContext(t, true, time.Second)
			err = saver.Save(ctx, filepath.Join(dir, "ckpt"), nil)
			late := time.Since(ended())
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorIs(t, err, strategy.ErrCannotContinue)
			assert.Less(t, late, collectiveTimeout/2, "returned %v after its deadline; the collective timeout is %v", late, collectiveTimeout)
			t.Logf("returned %v after its deadline", late)
			return nil
		})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
}

// New waits for a peer that never comes up until its context is
// cancelled, then returns, wrapping context.Canceled, rather than at its
// startup timeout, on both backends, and leaves no goroutine behind.
func TestStartupEndsWithItsContext(t *testing.T) {
	for _, comm := range backends {
		t.Run(comm.String(), func(t *testing.T) {
			leaks := noLeaks(t)
			r, err := cluster.NewSimpleResolver(loopbackSpec(t, 2), cluster.Task{Type: cluster.Worker, Index: 0})
			require.NoError(t, err)
			const startup = 2 * time.Minute
			ctx, ended := endingContext(t, false, time.Second)
			_, err = multiworker.New(ctx, multiworker.WithResolver(r), multiworker.WithCommunication(comm),
				multiworker.WithStartupTimeout(startup))
			late := time.Since(ended())
			require.ErrorIs(t, err, context.Canceled)
			assert.Less(t, late, startup/2, "returned %v after its context ended; the startup timeout is %v", late, startup)
			t.Logf("returned %v after its context ended", late)
			leaks()
		})
	}
}

// Scope and Build build ops only, so a worker gets past them before any
// peer has built its model: worker 0's initial values reach the peers by
// the first step, which waits for them within its context. The workers
// then hold the same model.
func TestScopeWaitsForNoPeer(t *testing.T) {
	for _, comm := range backends {
		t.Run(comm.String(), func(t *testing.T) {
			built := make(chan struct{})
			params := make([]map[string][]float32, 2)
			errs := onTwoWorkers(t, comm, 30*time.Second, func(w int, s *multiworker.Strategy) error {
				if w == 1 {
					select {
					case <-built:
					case <-time.After(20 * time.Second):
						return errors.New("worker 0's Scope and Build waited for worker 1's")
					}
				}
				m, step, err := mlpStep(s)
				if w == 0 {
					close(built)
				}
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if _, err := s.Run(ctx, step, oneExample(t)); err != nil {
					return err
				}
				params[w], err = values(ctx, s, m.Vars())
				return err
			})
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			assert.Equal(t, params[0], params[1], "both workers hold worker 0's model, trained by one step")
		})
	}
}

// Workers whose first calls after Scope differ (worker 0 reads a variable,
// worker 1 starts with a Reduce) both initialise the variables first, so
// they meet in the same broadcast, and then in the Reduce.
func TestWorkersWhoseFirstCallsDifferMeet(t *testing.T) {
	for _, comm := range backends {
		t.Run(comm.String(), func(t *testing.T) {
			sums := make([]float32, 2)
			errs := onTwoWorkers(t, comm, 20*time.Second, func(w int, s *multiworker.Strategy) error {
				m, _, err := mlpStep(s)
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if w == 0 {
					if _, err := s.Value(ctx, m.Vars()[0]); err != nil {
						return err
					}
				}
				x, err := tf.NewTensor(float32(w + 1))
				if err != nil {
					return err
				}
				sum, err := s.Reduce(ctx, strategy.Sum, strategy.PerReplica{x})
				if err != nil {
					return err
				}
				sums[w] = strategy.TensorValue(sum).(float32)
				return nil
			})
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			assert.Equal(t, []float32{3, 3}, sums)
		})
	}
}
