package mirrored_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/reducedtest"
	"github.com/tfdist/tfdist/mirrored"
)

// On 2 and 4 replicas, a step's reduced outputs (Sum and Mean, of a scalar
// and a vector, packed into one reduction) come back from the step's own
// run equal to Reduce of the per-replica outputs.
func TestReducedOutputsEqualReduce(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s, err := mirrored.New(mirrored.WithLogicalCPUs(n))
			require.NoError(t, err)
			defer s.Close()
			got, err := reducedtest.Run(ctx, s, 0, 3)
			require.NoError(t, err)
			require.Len(t, got, len(reducedtest.Reduced))
			for name, v := range got {
				assert.InDeltaSlice(t, v.Reduce, v.InRun, 1e-4, "%s: in the run vs Reduce", name)
				assert.InDeltaSlice(t, v.Want, v.InRun, 1e-4, "%s: in the run vs computed in Go", name)
			}
		})
	}
}
