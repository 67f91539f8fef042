package classifier

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"time"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tfdist/tfdist/internal/tensorutil"
)

// sumAll sums every element of x into a scalar.
func sumAll(s *op.Scope, x tf.Output) tf.Output {
	return op.Sum(s.SubScope("sum"), x, op.Range(s.SubScope("axes"), op.Const(s.SubScope("zero"), int32(0)),
		op.Rank(s.SubScope("rank"), x), op.Const(s.SubScope("one"), int32(1))))
}

// paramL2 returns the L2 norm over the values of every variable in vars, as
// value reads them: the figure the equivalence checks compare.
func paramL2[V any](ctx context.Context, vars []V, value func(context.Context, V) (*tf.Tensor, error)) (float64, error) {
	var l2 float64
	for _, v := range vars {
		t, err := value(ctx, v)
		if err != nil {
			return 0, err
		}
		for _, f := range tensorutil.Float32s(t) {
			l2 += float64(f) * float64(f)
		}
	}
	return math.Sqrt(l2), nil
}

// reportStats writes "stats goroutines=N heap=BYTES" to w every interval
// until the returned stop is called: what a soak run cannot see of the
// process from outside (the Go heap's live bytes, apart from TensorFlow's
// C++ allocations in the resident memory).
func reportStats(w io.Writer, every time.Duration) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				fmt.Fprintf(w, "stats goroutines=%d heap=%d\n", runtime.NumGoroutine(), ms.HeapAlloc)
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-finished }
}
