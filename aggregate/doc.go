// Package aggregate combines the votes of the workers of synchronous
// data-parallel training into the one update they all apply, with rules
// that tolerate Byzantine workers: workers whose votes are arbitrary,
// through faults or malice.
//
// Each of n workers votes its gradient, flattened to d float32 values. A
// [Rule]'s Aggregate writes its estimate of the honest workers' mean vote
// and returns the indices of the votes that did not count fully, its
// discarded votes:
//
//   - [Mean] averages the votes. It needs n >= 1 and discards none; one
//     Byzantine vote can move it arbitrarily far.
//   - [Median] takes the coordinate-wise median. It needs n >= 1 and
//     discards none.
//   - [TrimmedMean](f) drops, in each coordinate, the f largest and the f
//     smallest values and averages the rest. It needs n > 2f; it discards
//     the votes dropped in more than half of the coordinates.
//   - [Krum](f) picks the vote with the least sum of squared distances
//     to its n-f-2 nearest other votes (Blanchard et al., 2017). It needs
//     n > 2f+2 and discards every other vote.
//   - [MultiKrum](f, m) averages the m votes Krum ranks best. It needs
//     n > 2f+2 and n >= f+m, and discards the other n-m.
//   - [CenteredClip](tau, iterations) starts from the median and moves
//     towards each vote, but by at most tau/n per vote and iteration
//     (Karimireddy et al., 2021). It needs n >= 1 and discards the votes
//     farther than tau from the last iteration's center, whose pull was
//     clipped.
//
// [Rule.Check] tells whether a rule can aggregate n votes; rules made with
// bad parameters fail every Check. [Parse] reads the names that
// [Rule.String] gives, such as "krum(1)", for flags and configuration.
//
// # Determinism
//
// Every worker runs the same rule on the same votes and must apply the
// same update, so Aggregate is a pure function of the votes and their
// order, the same to the bit on every platform Go supports. It uses no
// randomness, map order or goroutines, never fuses a multiply and an add,
// and adds in a fixed order.
//
// Every mean, of a coordinate's values or of the votes MultiKrum picks,
// is the exact sum rounded to float64, divided by the count and rounded
// to float32: summed in float64 where no partial sum can round, in
// math/big elsewhere. So Mean, Median and TrimmedMean depend on each
// coordinate's values alone, not on the order of the votes, and the mean
// of equal values is that value. Squared distances accumulate in float64
// in coordinate order; CenteredClip rounds its center to float32 once per
// iteration. Krum and MultiKrum break ties between scores by index, and
// TrimmedMean's discards count the lower index of equal values as the
// smaller.
package aggregate
