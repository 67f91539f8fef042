package multiworker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"

	"github.com/tfdist/tfdist/multiworker"
	"github.com/tfdist/tfdist/strategy"
)

// Gather concatenates every worker's values along axis 0 in replica order,
// on both backends, and refuses a scalar on every worker alike, before any
// collective runs, so that no worker waits for a peer that failed.
func TestGatherAcrossWorkers(t *testing.T) {
	for _, comm := range backends {
		t.Run(comm.String(), func(t *testing.T) {
			got := make([][2]any, 2)
			errs := onTwoWorkers(t, comm, 20*time.Second, func(w int, s *multiworker.Strategy) error {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				scalar, err := tf.NewTensor(float32(w))
				if err != nil {
					return err
				}
				_, err = s.Gather(ctx, strategy.PerReplica{scalar})
				if assert.Error(t, err) {
					assert.Contains(t, err.Error(), "replica 0's value is a scalar of float32")
					assert.Contains(t, err.Error(), "rank 1 or more")
				}
				for i, v := range []any{[]float32{float32(w), float32(w) + 0.5}, [][]int32{{int32(w)}, {int32(w + 10)}}} {
					x, err := tf.NewTensor(v)
					if err != nil {
						return err
					}
					g, err := s.Gather(ctx, strategy.PerReplica{x})
					if err != nil {
						return err
					}
					got[w][i] = g.Value()
				}
				return nil
			})
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			for w := range got {
				assert.Equal(t, []float32{0, 0.5, 1, 1.5}, got[w][0], "worker %d", w)
				assert.Equal(t, [][]int32{{0}, {10}, {1}, {11}}, got[w][1], "worker %d", w)
			}
		})
	}
}
