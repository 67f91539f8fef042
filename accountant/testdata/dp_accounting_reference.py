"""Computes, with dp_accounting, what tfdist's accountant is compared with.

Reads JSON from stdin: {"epsilon": [[q, noise, steps, delta], ...],
"noise": [[q, steps, delta, target_epsilon], ...]} and prints
{"epsilon": [[eps, order], ...], "noise": [sigma, ...]}; an infinite
epsilon is printed as null.
"""

import json
import logging
import math
import sys

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

logging.disable(logging.WARNING)  # orders that do not converge are reported on stderr


def event(q, noise, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise)), steps)


_one_step = {}


def epsilon(q, noise, steps, delta):
    # RDP composes linearly: one step's RDP, computed once per (q, noise),
    # times steps, converted as RdpAccountant.get_epsilon_and_optimal_order
    # converts it.
    if (q, noise) not in _one_step:
        acc = rdp_privacy_accountant.RdpAccountant()
        acc.compose(event(q, noise, 1))
        _one_step[(q, noise)] = (acc.orders, acc.rdp)
    orders, rdp = _one_step[(q, noise)]
    eps, order = rdp_privacy_accountant.compute_epsilon(orders, rdp * int(steps), delta)
    return [None if math.isinf(eps) else float(eps), float(order)]


def noise(q, steps, delta, target):
    return float(dp_accounting.calibrate_dp_mechanism(
        rdp_privacy_accountant.RdpAccountant, lambda s: event(q, s, int(steps)), target, delta))


def main():
    req = json.load(sys.stdin)
    json.dump({"epsilon": [epsilon(*c) for c in req["epsilon"]],
               "noise": [noise(*c) for c in req["noise"]]}, sys.stdout)


main()
