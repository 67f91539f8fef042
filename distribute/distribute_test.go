package distribute_test

import (
	"context"
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/distribute"
)

// The flags name the strategy and its devices; New makes it, with as many
// replicas as asked, and a strategy of one process is its own chief.
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
		{distribute.Config{Strategy: "tpu"}, `strategy "tpu", expected one of [default mirrored multiworker]`},
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
