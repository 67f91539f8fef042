package dataset

import "testing"

// PoisonLoans has the pipelines of the test overwrite every buffer they
// give back to a parser (see giveBack), so that a stage that gives one back
// while it still holds its values fails the test at once.
func PoisonLoans(t testing.TB) {
	poisonLoans.Store(true)
	t.Cleanup(func() { poisonLoans.Store(false) })
}
