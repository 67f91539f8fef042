package accountant

import "math"

// maxFracTerms bounds the series of a fractional order; an order whose
// series has not converged by then is left out of the conversion (its RDP
// is +Inf), as dp_accounting does.
const maxFracTerms = 1000

// rdpPoissonGaussian returns the RDP at order alpha of one step of the
// Gaussian mechanism with noise multiplier sigma on a Poisson sample of
// rate q.
func rdpPoissonGaussian(q, sigma, alpha float64) float64 {
	switch {
	case q == 0:
		return 0
	case math.IsInf(alpha, 1) || sigma == 0:
		return math.Inf(1)
	case q == 1:
		return alpha / (2 * sigma * sigma)
	case alpha == math.Trunc(alpha):
		return logAInt(q, sigma, int(alpha)) / (alpha - 1)
	}
	return logAFrac(q, sigma, alpha) / (alpha - 1)
}

// logAInt is log A_α for an integer order: the binomial expansion of
// E[(1 - q + q·exp((2z - 1)/(2σ²)))^α] term by term.
func logAInt(q, sigma float64, alpha int) float64 {
	logA := math.Inf(-1)
	logQ, log1mQ := math.Log(q), math.Log1p(-q)
	a := float64(alpha)
	for i := 0; i <= alpha; i++ {
		k := float64(i)
		term := logComb(a, k) + k*logQ + (a-k)*log1mQ + (k*k-k)/(2*sigma*sigma)
		logA = logAdd(logA, term)
	}
	return logA
}

// logAFrac is log A_α for a fractional order: the two halves of the
// integral, split at z0, as series in the binomial terms of α (Mironov et
// al., 2019, section 3.3), summed until both halves' terms decrease and
// fall 30 nats below the total.
func logAFrac(q, sigma, alpha float64) float64 {
	logA0, logA1 := math.Inf(-1), math.Inf(-1)
	z0 := sigma*sigma*math.Log(1/q-1) + 0.5
	logQ, log1mQ := math.Log(q), math.Log1p(-q)
	last0, last1 := math.Inf(-1), math.Inf(-1)
	scale := math.Sqrt2 * sigma
	for n := range maxFracTerms {
		i := float64(n)
		j := alpha - i
		coef := logComb(alpha, i)
		s0 := coef + i*logQ + j*log1mQ + (i*i-i)/(2*sigma*sigma) + math.Log(0.5) + logErfc((i-z0)/scale)
		s1 := coef + j*logQ + i*log1mQ + (j*j-j)/(2*sigma*sigma) + math.Log(0.5) + logErfc((z0-j)/scale)
		logA0, logA1 = logAdd(logA0, s0), logAdd(logA1, s1)
		total := logAdd(logA0, logA1)
		if s0 < last0 && s1 < last1 && max(s0, s1) < total-30 {
			return total
		}
		last0, last1 = s0, s1
	}
	return math.Inf(1)
}

// logAdd returns log(exp(x) + exp(y)).
func logAdd(x, y float64) float64 {
	a, b := min(x, y), max(x, y)
	if math.IsInf(a, -1) {
		return b
	}
	return math.Log1p(math.Exp(a-b)) + b
}

// logComb returns the log of the binomial coefficient (n k), for real n
// and k through the log-gamma function (log |Γ| where Γ is negative).
func logComb(n, k float64) float64 {
	a, _ := math.Lgamma(n + 1)
	b, _ := math.Lgamma(k + 1)
	c, _ := math.Lgamma(n - k + 1)
	return a - b - c
}

// logErfc returns log(erfc(x)), accurate where erfc(x) underflows: beyond
// x = 20 through the asymptotic series of erfc.
func logErfc(x float64) float64 {
	if x < 20 {
		return math.Log(math.Erfc(x))
	}
	// erfc(x) = exp(-x²)/(x√π) · (1 - 1/(2x²) + 3/(2x²)² - 15/(2x²)³ + 105/(2x²)⁴ - …)
	u := 1 / (2 * x * x)
	series := 1 - u + 3*u*u - 15*u*u*u + 105*u*u*u*u
	return -x*x - math.Log(x) - 0.5*math.Log(math.Pi) + math.Log(series)
}
