package main

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/internal/classifier"
)

// The digits program as an elastic job of four workers under tfdist
// launch --elastic (-strategy elastic, -deterministic 4, --sizes 1,2,4):
// a random worker kills itself after a random step, the launcher starts a
// replacement, and every worker that finishes ends with the default
// strategy's model bit for bit, as does the default strategy with
// -deterministic 4.
func TestElasticJobLosesNoBit(t *testing.T) {
	needBinaries(t)
	args := []string{"-steps", "600", "-global-batch", "64", "-deterministic", "4"}
	want := defaultRun(t, args...)
	crash := classifier.Faults{CrashAtStep: 50 + rand.IntN(400), CrashTask: "worker:" + strconv.Itoa(rand.IntN(4))}
	out, err := launchFaulty(t, crash, 6*time.Minute, []string{"--elastic", "--min-workers", "1", "--max-workers", "4", "--sizes", "1,2,4"},
		append(args, "-strategy", "elastic", "-json", "-log-every", "0")...)
	require.NoError(t, err, out)
	require.Contains(t, out, "crashing on purpose", "%+v", crash)
	got := results(t, out)
	require.NotEmpty(t, got, out)
	for task, r := range got {
		assert.Equal(t, want.ParamsSHA256, r.ParamsSHA256, "%s: its model differs from the default strategy's (%+v)", task, crash)
		assert.Equal(t, want.Accuracy, r.Accuracy, task)
	}
	t.Logf("%+v: %d workers finished", crash, len(got))
}
