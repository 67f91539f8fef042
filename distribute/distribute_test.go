package distribute_test

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/cluster"
	"github.com/tfdist/tfdist/distribute"
	"github.com/tfdist/tfdist/elastic"
	"github.com/tfdist/tfdist/multiworker"
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
		{distribute.Config{Strategy: "tpu"}, `strategy "tpu", expected one of [default mirrored multiworker ps] (or elastic, which Run makes)`},
		{distribute.Config{Strategy: "ps"}, "make it with Open and train with package train"},
		{distribute.Config{Strategy: "elastic"}, "strategy elastic makes a strategy for each membership of the job: train with Run"},
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
	for args, want := range map[string][]string{
		`-diloco "0": expected a number of training steps, 1 or more`:                                                         {"-diloco", "0"},
		"-diloco: give -local-sgd or -diloco, once":                                                                           {"-local-sgd", "5", "-diloco", "5"},
		`local SGD (-local-sgd, -diloco) under strategy "mirrored": expected multiworker`:                                     {"-strategy", "mirrored", "-local-sgd", "5"},
		`compression "int4": expected none, fp16, bf16, int8 or topk(ratio)`:                                                  {"-strategy", "multiworker", "-compression", "int4"},
		`Compression fp16 (-compression) under strategy "mirrored": expected multiworker`:                                     {"-strategy", "mirrored", "-compression", "fp16"},
		`-local-sgd-warmup "-1": expected a whole number, 0 or more`:                                                          {"-strategy", "multiworker", "-diloco", "5", "-local-sgd-warmup", "-1"},
		"-local-sgd-warmup 5 without -local-sgd or -diloco":                                                                   {"-strategy", "multiworker", "-local-sgd-warmup", "5"},
		"-overlap 2 without -local-sgd or -diloco":                                                                            {"-strategy", "multiworker", "-overlap", "2"},
		`ZeRO 1 (-zero) under strategy "mirrored": the optimizer state is sharded across the worker processes of multiworker`: {"-strategy", "mirrored", "-zero", "1"},
		`ZeRO 2 (-zero) under strategy "elastic"`:                                                                             {"-strategy", "elastic", "-zero", "2"},
		"WithZeRO(3): expected stage 1 (optimizer state sharded) or 2":                                                        {"-strategy", "multiworker", "-zero", "3"},
		"WithZeRO(2) on one worker":                                                                                           {"-strategy", "multiworker", "-zero", "2"},
		// The flags reach WithLocalSGD's checks.
		"WithLocalSGD: Fragments 3: expected 0, 1 or a divisor of Steps 10": {"-strategy", "multiworker", "-fragments", "3", "-diloco", "10"},
		// With local SGD the compression is the outer gradient's.
		"WithLocalSGD: Compression topk(0.1): expected none, fp16, bf16 or int8": {"-strategy", "multiworker", "-diloco", "5", "-compression", "topk(0.1)"},
	} {
		var c distribute.Config
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		err := fs.Parse(want)
		if err == nil {
			_, err = distribute.New(context.Background(), c)
		}
		assert.ErrorContains(t, err, args)
	}
}

// -diloco H trains a multiworker strategy with DiLoCo's outer update every
// H steps, -local-sgd H with the parameters averaged.
func TestLocalSGDFlags(t *testing.T) {
	for args, want := range map[string]multiworker.LocalSGD{
		"-diloco 50":    {Steps: 50, OuterRate: 0.7, OuterMomentum: 0.9, Nesterov: true},
		"-local-sgd 10": {Steps: 10},
	} {
		var c distribute.Config
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c.RegisterFlags(fs)
		require.NoError(t, fs.Parse(append([]string{"-strategy", "multiworker"}, strings.Fields(args)...)))
		require.NotNil(t, c.LocalSGD, args)
		assert.Equal(t, want, *c.LocalSGD, args)
		s, err := distribute.New(context.Background(), c)
		require.NoError(t, err, args)
		require.NoError(t, s.Close())
	}
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

// Run calls train once with the strategy the config names, and returns
// its error.
func TestRunCallsTrainOnce(t *testing.T) {
	calls := 0
	boom := errors.New("boom")
	err := distribute.Run(context.Background(), distribute.Config{Strategy: "mirrored", Devices: 2}, func(_ context.Context, s distribute.Strategy) error {
		calls++
		assert.Equal(t, 2, distribute.NumReplicas(s))
		return boom
	})
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, 1, calls)
	err = distribute.Run(context.Background(), distribute.Config{Strategy: "tpu"}, func(context.Context, distribute.Strategy) error {
		t.Error("train called on a bad config")
		return nil
	})
	assert.ErrorContains(t, err, `strategy "tpu"`)
}

// Under "elastic" Run joins the rendezvous the environment names and
// calls train with each membership's elastic strategy; a worker whose
// Leave is closed leaves at the next step boundary, and Run returns nil.
func TestRunElastic(t *testing.T) {
	t.Setenv(elastic.EnvRendezvous, "")
	err := distribute.Run(context.Background(), distribute.Config{Strategy: "elastic"}, nil)
	assert.ErrorContains(t, err, elastic.EnvRendezvous+" is not set")

	srv, err := elastic.Listen("127.0.0.1:0", elastic.WithJob("run-test"), elastic.WithSettle(0))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	served := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(served) }()
	defer func() { cancel(); <-served }()
	t.Setenv(elastic.EnvRendezvous, srv.Addr())
	t.Setenv(elastic.EnvJob, "run-test")
	t.Setenv(elastic.EnvName, "worker:0")
	leave := make(chan struct{})
	steps := 0
	err = distribute.Run(ctx, distribute.Config{Strategy: "elastic", Leave: leave}, func(ctx context.Context, s distribute.Strategy) error {
		mw, ok := s.(*multiworker.Strategy)
		require.True(t, ok, "%T", s)
		require.True(t, mw.Elastic())
		if _, err := mw.Resume(ctx); err != nil {
			return err
		}
		for ; ; steps++ {
			if steps == 3 {
				close(leave)
				time.Sleep(100 * time.Millisecond) // for the leave to reach the member
			}
			if err := mw.StepDone(ctx); err != nil {
				return err
			}
		}
	})
	require.NoError(t, err)
	assert.Equal(t, 3, steps, "left at the step boundary after Leave closed")
}
