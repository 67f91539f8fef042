package accountant

import (
	"fmt"
	"math"
	"slices"
)

// DefaultOrders returns the RDP orders an Accountant tracks unless told
// otherwise, those of dp_accounting's RdpAccountant: 1.1 to 10.9 in steps
// of 0.1, 11 to 63, and 128, 256, 512 and 1024.
func DefaultOrders() []float64 {
	var orders []float64
	for x := 1; x < 100; x++ {
		orders = append(orders, 1+float64(x)/10)
	}
	for a := 11; a < 64; a++ {
		orders = append(orders, float64(a))
	}
	return append(orders, 128, 256, 512, 1024)
}

// Accountant composes the RDP of the steps of a training run. The zero
// value is not usable; make one with New.
type Accountant struct {
	orders []float64
	rdp    []float64
}

// New returns an accountant that has spent nothing, tracking orders
// (DefaultOrders if none), each greater than 1.
func New(orders ...float64) (*Accountant, error) {
	if len(orders) == 0 {
		orders = DefaultOrders()
	}
	for _, a := range orders {
		if !(a > 1) {
			return nil, fmt.Errorf("accountant: RDP order %v: expected an order greater than 1", a)
		}
	}
	return &Accountant{orders: slices.Clone(orders), rdp: make([]float64, len(orders))}, nil
}

// Orders returns the orders the accountant tracks.
func (a *Accountant) Orders() []float64 { return slices.Clone(a.orders) }

// RDP returns the RDP spent so far at each order of Orders.
func (a *Accountant) RDP() []float64 { return slices.Clone(a.rdp) }

// ComposePoissonGaussian adds steps steps of the Gaussian mechanism with
// noise multiplier noise on Poisson samples of rate q.
func (a *Accountant) ComposePoissonGaussian(q, noise float64, steps int) error {
	if err := checkStep(q, noise, steps); err != nil {
		return err
	}
	for i, alpha := range a.orders {
		a.rdp[i] += float64(steps) * rdpPoissonGaussian(q, noise, alpha)
	}
	return nil
}

// Epsilon returns the ε spent so far for δ, and the order that gives it:
// the smallest over the orders of the conversion of Canonne, Kamath and
// Steinke (2020, proposition 12), or 0 where the bound through the KL
// divergence already gives δ. An order whose RDP is infinite gives +Inf.
func (a *Accountant) Epsilon(delta float64) (eps, order float64, err error) {
	if err := checkDelta(delta); err != nil {
		return 0, 0, err
	}
	best, bestOrder := math.Inf(1), a.orders[0]
	for i, alpha := range a.orders {
		if e := epsilonAt(alpha, a.rdp[i], delta); e < best {
			best, bestOrder = e, alpha
		}
	}
	return max(0, best), bestOrder, nil
}

// epsilonAt converts the RDP r at order alpha to ε for delta.
func epsilonAt(alpha, r, delta float64) float64 {
	switch {
	case r < 0: // numerical noise of an extreme case
		return 0
	case delta*delta+math.Expm1(-r) > 0: // δ ≥ sqrt(1 - exp(-KL))
		return 0
	case alpha > 1.01: // unstable as alpha approaches 1
		return r + math.Log1p(-1/alpha) - math.Log(delta*alpha)/(alpha-1)
	}
	return math.Inf(1)
}

// Epsilon returns the ε of steps steps of DP-SGD with sampling rate q and
// noise multiplier noise, for δ, and the order that gives it, over
// DefaultOrders.
func Epsilon(q, noise float64, steps int, delta float64) (eps, order float64, err error) {
	a, _ := New()
	if err := a.ComposePoissonGaussian(q, noise, steps); err != nil {
		return 0, 0, err
	}
	return a.Epsilon(delta)
}

func checkStep(q, noise float64, steps int) error {
	switch {
	case !(q > 0 && q <= 1):
		return fmt.Errorf("accountant: sampling rate %v: expected a rate in (0, 1]", q)
	case !(noise >= 0) || math.IsInf(noise, 1):
		return fmt.Errorf("accountant: noise multiplier %v: expected a finite value >= 0", noise)
	case steps < 0:
		return fmt.Errorf("accountant: %d steps: expected 0 or more", steps)
	}
	return nil
}

func checkDelta(delta float64) error {
	if !(delta > 0 && delta < 1) {
		return fmt.Errorf("accountant: delta %v: expected a value in (0, 1)", delta)
	}
	return nil
}
