package multiworker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/dataset"
	"github.com/tfdist/tfdist/dataset/digits"
	"github.com/tfdist/tfdist/internal/freeport"
	"github.com/tfdist/tfdist/internal/syncbuf"
	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/strategy"
)

// Environment of a peer process: what it does after its first step
// (peerIdle or peerFinish), and its communication.
const (
	peerEnv     = "MULTIWORKER_TEST_PEER"
	peerCommEnv = "MULTIWORKER_TEST_PEER_COMM"
)

const (
	peerIdle   = "idle"   // it takes no further step and waits to be stopped or killed
	peerFinish = "finish" // it closes its strategy and exits, as a program that has finished
)

// runPeer plays a peer of the failure tests when peerEnv says so: worker 0
// of a cluster of two (TF_CONFIG), which runs one step of mlpStep with its
// peer, this test process, and then does what peerEnv names.
func runPeer() (int, bool) {
	behaviour, ok := os.LookupEnv(peerEnv)
	if !ok {
		return 0, false
	}
	if err := peer(behaviour); err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1, true
	}
	return 0, true
}

func peer(behaviour string) error {
	comm, err := strconv.Atoi(os.Getenv(peerCommEnv))
	if err != nil {
		return err
	}
	ctx := context.Background()
	s, err := multiworker.New(ctx, multiworker.WithCommunication(multiworker.Communication(comm)),
		multiworker.WithStartupTimeout(30*time.Second), multiworker.WithCollectiveTimeout(60*time.Second))
	if err != nil {
		return err
	}
	_, step, err := mlpStep(s)
	if err != nil {
		return err
	}
	batch, err := exampleBatch()
	if err != nil {
		return err
	}
	if _, err := s.Run(ctx, step, batch); err != nil {
		return err
	}
	fmt.Println("peer: first step done")
	switch behaviour {
	case peerFinish:
		err := s.Close()
		fmt.Println("peer: closed:", err)
		return nil
	case peerIdle:
		time.Sleep(10 * time.Minute) // the test stops or kills it
		return nil
	}
	return fmt.Errorf("%s=%q: expected %s or %s", peerEnv, behaviour, peerIdle, peerFinish)
}

// exampleBatch is one example of the digits for one replica.
func exampleBatch() (*dataset.Batch, error) {
	x, err := tf.NewTensor([][]float32{make([]float32, digits.Features)})
	if err != nil {
		return nil, err
	}
	y, err := tf.NewTensor([]int32{1})
	if err != nil {
		return nil, err
	}
	return &dataset.Batch{Replicas: []dataset.Element{{"x": x, "y": y}}, Counts: []int{1}}, nil
}

// peerProcess is worker 0 as a child process.
type peerProcess struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	addr string
	done chan struct{}
}

// signal sends sig to the peer.
func (p *peerProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// kill resumes and kills the peer and waits for it to exit.
func (p *peerProcess) kill() {
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Kill()
	<-p.done
}

// withPeer starts worker 0 as a child process that behaves as behaviour
// after its first step, joins this process to it as worker 1 on comm, and
// runs that first step: it returns this worker's strategy and step, and
// the peer. The peer is resumed and killed, and the strategy closed, when
// the test ends.
func withPeer(t *testing.T, comm multiworker.Communication, behaviour string, opts ...multiworker.Option) (*multiworker.Strategy, strategy.Step, *peerProcess) {
	t.Helper()
	ports, err := freeport.Loopback(2)
	require.NoError(t, err)
	addrs := []string{fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])}
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{cluster.Worker: addrs})
	require.NoError(t, err)
	tfc, err := cluster.Marshal(spec, cluster.Task{Type: cluster.Worker, Index: 0})
	require.NoError(t, err)
	p := &peerProcess{cmd: exec.Command(os.Args[0], "-test.run=^$"), out: &syncbuf.Buffer{}, addr: addrs[0], done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), peerEnv+"="+behaviour, peerCommEnv+"="+strconv.Itoa(int(comm)),
		"TF_CONFIG="+tfc, "TF_CPP_MIN_LOG_LEVEL=2")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, p.cmd.Start())
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.kill)

	r, err := cluster.NewSimpleResolver(spec, cluster.Task{Type: cluster.Worker, Index: 1})
	require.NoError(t, err)
	s, err := multiworker.New(context.Background(), append([]multiworker.Option{multiworker.WithResolver(r),
		multiworker.WithCommunication(comm), multiworker.WithStartupTimeout(30 * time.Second)}, opts...)...)
	require.NoError(t, err, "peer:\n%s", p.out)
	t.Cleanup(func() {
		p.kill() // first, so that Close does not wait at its barrier for it
		s.Close()
	})
	_, step, err := mlpStep(s)
	require.NoError(t, err)
	_, err = s.Run(context.Background(), step, oneExample(t))
	require.NoError(t, err, "peer:\n%s", p.out)
	return s, step, p
}

// When a step fails for want of its peer, the error says what became of
// the peer, on both backends: it finished (closed its strategy and exited,
// as a program whose last step is done), it is unresponsive (SIGSTOP: it
// accepts connections but answers nothing), or it is dead (SIGKILL: it
// exited without closing its strategy).
func TestPeerErrorsSayWhatBecameOfThePeer(t *testing.T) {
	for _, comm := range backends {
		for _, c := range []struct {
			name, behaviour string
			sig             syscall.Signal
			want            string
		}{
			{"finished", peerFinish, 0, "has finished: it closed its strategy"},
			{"stopped", peerIdle, syscall.SIGSTOP, "is unresponsive: it accepts connections but does not answer"},
			{"killed", peerIdle, syscall.SIGKILL, "is dead: it does not accept connections"},
		} {
			t.Run(comm.String()+"/"+c.name, func(t *testing.T) {
				s, step, p := withPeer(t, comm, c.behaviour, multiworker.WithCollectiveTimeout(3*time.Second))
				if c.sig != 0 {
					p.signal(t, c.sig)
				}
				if c.sig == syscall.SIGKILL {
					<-p.done
				}
				_, err := s.Run(context.Background(), step, oneExample(t))
				require.ErrorIs(t, err, strategy.ErrCannotContinue)
				require.ErrorContains(t, err, fmt.Sprintf("worker 0 (worker:0, %s) %s", p.addr, c.want), "peer:\n%s", p.out)
				for _, other := range []string{"has finished", "is unresponsive", "is dead"} {
					if !strings.Contains(c.want, other) {
						assert.NotContains(t, err.Error(), other)
					}
				}
				t.Log(err)
			})
		}
	}
}

// A peer that is alive but busy elsewhere past the collective timeout
// (here, until its peer has given up, or for twice the timeout under
// TensorFlow's ring) is reported as unresponsive, never as dead, on both
// backends, and the late worker's own error says that a peer gave up
// waiting for it.
func TestBusyPeerIsUnresponsiveNotDead(t *testing.T) {
	for _, comm := range backends {
		t.Run(comm.String(), func(t *testing.T) {
			gaveUp := make(chan struct{}) // closed when worker 0's call has returned
			errs := onTwoWorkers(t, comm, 2*time.Second, func(w int, s *multiworker.Strategy) error {
				if w == 0 {
					defer close(gaveUp)
				}
				m, _, err := mlpStep(s)
				if err != nil {
					return err
				}
				switch {
				case w == 1 && comm == multiworker.Ring:
					// Busy past the collective timeout. Under TensorFlow's
					// ring worker 0's call does not end while worker 1 is
					// away (only its context would end it), so worker 1
					// comes after a fixed delay.
					time.Sleep(4 * time.Second)
				case w == 1:
					// Busy past worker 0's collective timeout: it comes
					// once worker 0 has given up waiting for it, however
					// long each worker took to build its model.
					select {
					case <-gaveUp:
					case <-time.After(2 * time.Minute):
						return errors.New("worker 0's call, whose collective timeout is 2 s, did not return in 2 minutes")
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, err = s.Value(ctx, m.Vars()[0])
				return err
			})
			for _, err := range errs {
				require.ErrorIs(t, err, strategy.ErrCannotContinue)
				assert.NotContains(t, err.Error(), "is dead")
			}
			if comm == multiworker.Ring {
				// Its failures do not say whom they waited for; worker 1's
				// step fails as it may, once worker 0 has given up.
				assert.Contains(t, errs[0].Error(), "every peer is alive and answers, but one did not join")
				return
			}
			assert.Contains(t, errs[0].Error(), "worker 1 (worker:1, ")
			assert.Contains(t, errs[0].Error(), "is unresponsive")
			assert.Contains(t, errs[1].Error(), "a peer gave up waiting for this worker")
		})
	}
}
