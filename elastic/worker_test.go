package elastic_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tfdist/tfdist/collective"
	"github.com/tfdist/tfdist/elastic"
)

// The environment of a worker process (the test binary run again).
const (
	envWorker     = "ELASTIC_TEST_WORKER"     // its name
	envRendezvous = "ELASTIC_TEST_RENDEZVOUS" // the server's address
	envSteps      = "ELASTIC_TEST_STEPS"      // steps to train
)

// globalBatch is the examples of a step, divided among 1, 2, 3 or 4
// members.
const globalBatch = 12

// line is what a worker process prints, one JSON object a line.
type line struct {
	Event string `json:"event"` // "membership", "step", "done", "error"
	Step  int64  `json:"step"`
	Epoch uint32 `json:"epoch"`
	Rank  int    `json:"rank"`
	Size  int    `json:"size"`
	Nanos int64  `json:"ns"`
	// Once (done): whether every example of every step was counted once.
	Once bool   `json:"once"`
	Err  string `json:"err,omitempty"`
}

func emit(l line) {
	l.Nanos = time.Now().UnixNano()
	b, _ := json.Marshal(l)
	fmt.Println(string(b))
}

// worker trains a model whose state has one slot an example: a step adds
// the all-reduced one-hot of the examples each member trained, so a
// finished state of all ones shows every example counted exactly once,
// whatever the memberships were.
type worker struct {
	m     *elastic.Member
	leave atomic.Bool // SIGTERM came
	steps int64
	done  int64 // steps the state has completed
	state []float32
}

func runWorker() int {
	steps, _ := strconv.ParseInt(os.Getenv(envSteps), 10, 64)
	ctx := context.Background()
	m, err := elastic.Join(ctx, os.Getenv(envRendezvous), elastic.Hello{Job: "chaos", Name: os.Getenv(envWorker), Fingerprint: 42})
	if err != nil {
		emit(line{Event: "error", Err: err.Error()})
		return 2
	}
	w := &worker{m: m, steps: steps, state: make([]float32, steps*globalBatch)}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() { <-term; w.leave.Store(true); m.LeaveSoon() }()
	left, err := w.train(ctx)
	if err != nil {
		emit(line{Event: "error", Err: err.Error()})
		_ = m.Close()
		return 3
	}
	if left {
		return 0
	}
	once := true
	for _, v := range w.state {
		once = once && v == 1
	}
	emit(line{Event: "done", Step: w.done, Once: once})
	if err := m.Leave(true); err != nil {
		return 4
	}
	return 0
}

// train runs memberships until the state has every step (false) or the
// worker left (true).
func (w *worker) train(ctx context.Context) (bool, error) {
	for w.done < w.steps {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return false, err
		}
		mb, err := w.m.Next(ctx, elastic.Report{Step: w.done, Addr: ln.Addr().String()})
		if err != nil {
			_ = ln.Close()
			return false, err
		}
		emit(line{Event: "membership", Step: mb.Step, Epoch: mb.Epoch, Rank: mb.Rank, Size: len(mb.Members)})
		g, err := collective.New(ctx, mb.Members, mb.Rank, collective.WithListener(ln),
			collective.WithEpoch(mb.Epoch), collective.WithTimeout(10*time.Second), collective.WithStartupTimeout(10*time.Second))
		if err != nil {
			continue // a member failed to come up: report again
		}
		leave, _ := w.run(ctx, g, mb)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = g.Close(cctx)
		cancel()
		if leave {
			return true, w.m.Leave(false)
		}
	}
	return false, nil
}

// run takes the state from the holder, then trains until the group
// breaks or agrees to change; it says whether this worker leaves.
func (w *worker) run(ctx context.Context, g *collective.Group, mb elastic.Membership) (bool, error) {
	if err := w.sync(ctx, g, mb); err != nil {
		return false, err
	}
	n := len(mb.Members)
	for w.done < w.steps {
		batch := make([]float32, globalBatch)
		for j := mb.Rank * globalBatch / n; j < (mb.Rank+1)*globalBatch/n; j++ {
			batch[j] = 1
		}
		buf := floats(batch)
		if err := g.AllReduce(ctx, "step", collective.Sum, collective.Float32, buf); err != nil {
			return false, err
		}
		for j, v := range unfloats(buf) {
			w.state[w.done*globalBatch+int64(j)] += v
		}
		w.done++
		emit(line{Event: "step", Step: w.done, Epoch: mb.Epoch, Rank: mb.Rank, Size: n})
		change, err := w.m.Agree(ctx, g, "agree")
		if err != nil {
			return false, err
		}
		if change {
			return w.leave.Load(), nil
		}
	}
	return false, nil
}

// sync gives every member the holder's state.
func (w *worker) sync(ctx context.Context, g *collective.Group, mb elastic.Membership) error {
	done := make([]byte, 8)
	binary.LittleEndian.PutUint64(done, uint64(w.done))
	if err := g.Broadcast(ctx, "done", mb.Holder, collective.Int64, done); err != nil {
		return err
	}
	buf := floats(w.state)
	if err := g.Broadcast(ctx, "state", mb.Holder, collective.Float32, buf); err != nil {
		return err
	}
	w.done, w.state = int64(binary.LittleEndian.Uint64(done)), unfloats(buf)
	if w.done != mb.Step {
		return errors.New("the holder's state is not at the membership's step")
	}
	return nil
}

func floats(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func unfloats(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}
