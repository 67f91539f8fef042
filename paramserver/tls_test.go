package paramserver_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/paramserver"
)

// A program that requires TLS refuses to run the parameter-server
// strategy, whose traffic TensorFlow's gRPC server carries in plaintext,
// on every task, before it starts a server.
func TestTLSRequiredIsRefused(t *testing.T) {
	t.Setenv(mtls.EnvRequire, "1")
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {"127.0.0.1:1"}, cluster.Worker: {"127.0.0.1:2"}, cluster.PS: {"127.0.0.1:3"}})
	require.NoError(t, err)
	for _, task := range spec.Tasks() {
		r, err := cluster.NewSimpleResolver(spec, task)
		require.NoError(t, err)
		_, err = paramserver.New(context.Background(), r)
		require.ErrorIs(t, err, mtls.ErrUnavailable, task)
		require.ErrorContains(t, err, "the parameter-server strategy runs over TensorFlow's gRPC server", task)
	}
}
