package aggregate_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tfdist/tfdist/aggregate"
)

// Parse reads back what String writes, as an equal rule, and ignores
// spaces around names and parameters.
func TestParseRoundTrips(t *testing.T) {
	rules := append(allRules(),
		aggregate.TrimmedMean(0), aggregate.Krum(0), aggregate.MultiKrum(2, 1),
		aggregate.CenteredClip(0.1, 5), aggregate.CenteredClip(1e-7, 1), aggregate.CenteredClip(3e38, 100))
	for _, r := range rules {
		got, err := aggregate.Parse(r.String())
		require.NoError(t, err, r)
		assert.Equal(t, r, got)
		assert.Equal(t, r.String(), got.String())
	}
	for text, want := range map[string]aggregate.Rule{
		" median ":                aggregate.Median(),
		"trimmed_mean( 2 )":       aggregate.TrimmedMean(2),
		"multi_krum (1, 3)":       aggregate.MultiKrum(1, 3),
		"centered_clip(1e1,\t3 )": aggregate.CenteredClip(10, 3),
	} {
		got, err := aggregate.Parse(text)
		require.NoError(t, err, text)
		assert.Equal(t, want, got, text)
	}
	for want, r := range map[string]aggregate.Rule{
		"mean": aggregate.Mean(), "median": aggregate.Median(), "trimmed_mean(1)": aggregate.TrimmedMean(1),
		"krum(1)": aggregate.Krum(1), "multi_krum(1,3)": aggregate.MultiKrum(1, 3), "centered_clip(10,3)": aggregate.CenteredClip(10, 3),
	} {
		assert.Equal(t, want, r.String())
	}
}

// Parse rejects text that names no rule with an error naming the text
// and listing the accepted forms, and parameters out of range with the
// error the rule's Check gives.
func TestParseRejectsBadInput(t *testing.T) {
	const forms = "accepted forms: mean, median, trimmed_mean(f), krum(f), multi_krum(f,m), centered_clip(tau,iterations)"
	for text, reason := range map[string]string{
		"krum":                   "want krum(f)",
		"krum(x)":                `f "x" is not an integer`,
		"krum(1":                 "parameters must end with ')'",
		"krum(1.5)":              `f "1.5" is not an integer`,
		"multi_krum(1)":          "want multi_krum(f,m)",
		"mean()":                 "want mean",
		"bogus":                  `unknown rule "bogus"`,
		"":                       `unknown rule ""`,
		"Krum(1)":                `unknown rule "Krum"`,
		"centered_clip(ten,3)":   `tau "ten" is not a number`,
		"centered_clip(1,3,4)":   "want centered_clip(tau,iterations)",
		"centered_clip(1,three)": `iterations "three" is not an integer`,
	} {
		r, err := aggregate.Parse(text)
		assert.Nil(t, r, text)
		assert.EqualError(t, err, `aggregate: cannot parse rule "`+text+`": `+reason+"; "+forms)
	}
	for text, want := range map[string]string{
		"centered_clip(0,3)":   "aggregate: centered_clip(0,3): tau must be > 0 and finite",
		"centered_clip(inf,3)": "aggregate: centered_clip(+Inf,3): tau must be > 0 and finite",
		"centered_clip(1,0)":   "aggregate: centered_clip(1,0): iterations must be >= 1",
		"trimmed_mean(-1)":     "aggregate: trimmed_mean(-1): f must be >= 0",
		"multi_krum(1,0)":      "aggregate: multi_krum(1,0): m must be >= 1",
	} {
		r, err := aggregate.Parse(text)
		assert.Nil(t, r, text)
		assert.EqualError(t, err, want)
	}
}
