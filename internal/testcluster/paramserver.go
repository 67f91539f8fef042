package testcluster

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/paramserver"
)

// ParameterServers starts a parameter-server cluster of workers and ps
// tasks in this process, each task on one intra-op and two inter-op
// threads, and returns its chief's strategy, which fails a step a worker
// does not finish in 30 s. The caller closes it.
func ParameterServers(t testing.TB, ctx context.Context, workers, ps int) *paramserver.Strategy {
	t.Helper()
	cl, err := paramserver.StartInProcessCluster(workers, ps, paramserver.WithThreads(1, 2))
	require.NoError(t, err)
	s, err := paramserver.New(ctx, cl.Resolver(), paramserver.WithStepTimeout(30*time.Second), paramserver.WithThreads(1, 2))
	require.NoError(t, err)
	return s
}
