package multiworker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/reducedtest"
	"github.com/tfdist/tfdist/multiworker"
)

// On 2 workers of 2 replicas, on tfdist's engine and on TensorFlow's ring
// collectives, a step's reduced outputs sum (or average over all 4
// replicas) every worker's values in the step's own run, and equal Reduce
// of the per-replica outputs on both workers.
func TestReducedOutputsSpanWorkers(t *testing.T) {
	for _, comm := range []multiworker.Communication{multiworker.Engine, multiworker.Ring} {
		t.Run(comm.String(), func(t *testing.T) {
			got := make([]map[string]reducedtest.Values, 2)
			errs := onTwoWorkers(t, comm, 30*time.Second, func(w int, s *multiworker.Strategy) error {
				var err error
				got[w], err = reducedtest.Run(context.Background(), s, 2*w, 3)
				return err
			}, multiworker.WithLogicalCPUs(2))
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			for w := range 2 {
				require.Len(t, got[w], len(reducedtest.Reduced))
				for name, v := range got[w] {
					assert.InDeltaSlice(t, v.Reduce, v.InRun, 1e-3, "worker %d, %s: in the run vs Reduce", w, name)
					assert.InDeltaSlice(t, v.Want, v.InRun, 1e-3, "worker %d, %s: in the run vs computed in Go", w, name)
				}
			}
		})
	}
}
