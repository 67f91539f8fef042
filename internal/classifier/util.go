package classifier

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"time"

	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/internal/tensorutil"
	"github.com/tfdist/tfdist/strategy"
)

// paramL2 returns the L2 norm over the values of every variable in vars, as
// value reads them: the figure the equivalence checks compare.
func paramL2(ctx context.Context, vars []strategy.Variable, value func(context.Context, strategy.Variable) (*tf.Tensor, error)) (float64, error) {
	var l2 float64
	for _, v := range vars {
		t, err := value(ctx, v)
		if err != nil {
			return 0, err
		}
		l2 += tensorutil.SumSquares(tensorutil.Float32s(t))
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
