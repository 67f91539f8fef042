package paramserver_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/mtls"
	"github.com/tfdist/tfdist/paramserver"
)

// A program that requires TLS (TFDIST_REQUIRE_TLS) but names no
// certificate is refused on every task, before it serves or connects,
// with what to set.
func TestTLSRequiredWithoutCertificates(t *testing.T) {
	t.Setenv(mtls.EnvRequire, "1")
	spec, err := cluster.NewClusterSpec(map[cluster.TaskType][]string{
		cluster.Chief: {"127.0.0.1:1"}, cluster.Worker: {"127.0.0.1:2"}, cluster.PS: {"127.0.0.1:3"}})
	require.NoError(t, err)
	for _, task := range spec.Tasks() {
		r, err := cluster.NewSimpleResolver(spec, task)
		require.NoError(t, err)
		_, err = paramserver.New(context.Background(), r)
		require.ErrorIs(t, err, mtls.ErrUnavailable, task)
		require.ErrorContains(t, err, mtls.EnvCA, task)
	}
}
