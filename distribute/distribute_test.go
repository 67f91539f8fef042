package distribute_test

import (
	"context"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/paramserver"
)

// The flags name the strategy and its devices; New makes it, with as many
// replicas as asked (NumReplicas too), and a strategy of one process is
// its own chief.
func TestFlagsMakeTheStrategy(t *testing.T) {
	for args, replicas := range map[string]int{"": 1, "mirrored": 2} {
		var c distribute.Config
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c.RegisterFlags(fs)
		argv := []string{}
		if args != "" {
			argv = []string{"-strategy", args, "-devices", "2"}
		}
		require.NoError(t, fs.Parse(argv))
		s, err := distribute.New(context.Background(), c)
		require.NoError(t, err, args)
		assert.Equal(t, replicas, s.NumReplicasInSync(), args)
		assert.Equal(t, replicas, distribute.NumReplicas(s), args)
		assert.True(t, distribute.IsChief(s))
		require.NoError(t, s.Close())
	}
}

// A name or a number of devices that no strategy takes is an error
// naming it.
func TestBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  distribute.Config
		want string
	}{
		{distribute.Config{Strategy: "tpu"}, `strategy "tpu", expected one of [default mirrored multiworker ps]`},
		{distribute.Config{Strategy: "ps"}, "make it with Open and train with package train"},
		{distribute.Config{Strategy: "mirrored", Devices: -1}, "Devices -1, expected 0 or more"},
		{distribute.Config{Strategy: "default", Devices: 2}, "Devices 2 asks for more (use mirrored)"},
	} {
		s, err := distribute.New(context.Background(), c.cfg)
		assert.ErrorContains(t, err, c.want)
		assert.Nil(t, s)
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	new(distribute.Config).RegisterFlags(fs)
	assert.Error(t, fs.Parse([]string{"-devices", "two"}))
}

// Under "ps" Open joins the cluster TF_CONFIG names and returns its
// chief's parameter-server strategy, which train.Compile takes and which
// trains with a replica per worker.
func TestOpenMakesTheParameterServerChief(t *testing.T) {
	cl, err := paramserver.StartInProcessCluster(1, 1)
	require.NoError(t, err)
	tfConfig, err := cluster.Marshal(cl.Spec(), cluster.Task{Type: cluster.Chief})
	require.NoError(t, err)
	t.Setenv("TF_CONFIG", tfConfig)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := distribute.Open(ctx, distribute.Config{Strategy: "ps"})
	require.NoError(t, err)
	defer s.Close()
	ps, ok := s.(*paramserver.Strategy)
	require.True(t, ok, "%T", s)
	assert.Equal(t, 1, ps.NumWorkers())
	assert.Equal(t, 1, distribute.NumReplicas(s), "one replica per worker")

	_, err = distribute.Open(ctx, distribute.Config{Strategy: "ps", Devices: 2})
	assert.ErrorContains(t, err, "Devices 2 asks for more")
}
