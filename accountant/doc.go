// Package accountant measures the privacy that DP-SGD spends: the Rényi
// differential privacy (RDP) of the Poisson-subsampled Gaussian mechanism
// (Mironov, Talwar and Zhang, 2019), composed over steps and converted to
// (ε, δ)-differential privacy, as Google's dp_accounting library's
// RdpAccountant computes it (same default orders, same conversion).
//
// A step of DP-SGD takes each example with probability q (Poisson
// sampling), clips each example's gradient to L2 norm C, sums them and
// adds Gaussian noise of standard deviation σ·C; σ is the noise
// multiplier. Epsilon gives the ε after a number of such steps for a δ;
// NoiseMultiplier gives the σ that reaches a target ε. The guarantee
// assumes Poisson sampling: fixed-size shuffled batches are a different
// mechanism, which this accounting does not cover.
//
// Every quantity is computed in log space, so large orders and many steps
// neither overflow nor lose precision.
package accountant
