"""The privacy ledger's epsilon against the accountant libraries called directly: a table.

For eight settings of (sampling probability q, noise multiplier sigma, steps, delta) it prints fedge's
epsilon (its RDP and PLD methods, both dp-accounting), dp-accounting called directly, Opacus's RDP
analysis and Microsoft's prv-accountant (its upper bound). ``python -m benchmarks.accountants``.
"""

from __future__ import annotations

import dp_accounting as dpa
from dp_accounting import pld, rdp
from opacus.accountants.analysis import rdp as opacus_rdp
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

from fedge.privacy import Release, epsilon
from fedge.privacy.accountant import DEFAULT_ORDERS

SETTINGS = [  # (q, sigma, steps, delta)
    (0.01, 1.0, 1000, 1e-5),
    (0.001, 0.8, 10000, 1e-6),
    (0.02, 1.1, 2000, 1e-5),
    (0.1, 2.0, 100, 1e-5),
    (0.05, 1.5, 500, 1e-5),
    (1.0, 5.0, 50, 1e-5),
    (0.004, 1.2, 5000, 1e-7),
    (0.25, 3.0, 200, 1e-4),
]


def _direct(q: float, sigma: float, steps: int, delta: float, accountant: dpa.PrivacyAccountant) -> float:
    event = (
        dpa.GaussianDpEvent(sigma) if q == 1.0 else dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
    )
    accountant.compose(event, steps)
    return float(accountant.get_epsilon(delta))


def main() -> None:
    names = ["fedge rdp", "dp-accounting rdp", "Opacus rdp", "fedge pld", "dp-accounting pld", "prv (upper)"]
    head = "| q | sigma | steps | delta | " + " | ".join(names) + " |"
    print(head)
    print("|---" * 10 + "|")
    for q, sigma, steps, delta in SETTINGS:
        sampling = "none" if q == 1.0 else "poisson"
        shape = Release(1, "gradient", "sample", "gaussian", sigma, sampling=sampling, probability=q).shape()
        curve = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(DEFAULT_ORDERS))
        theirs, _ = opacus_rdp.get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=curve, delta=delta)
        prv = PRVAccountant(
            prvs=[PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)],
            max_self_compositions=[steps],
            eps_error=0.01,
            delta_error=delta / 1000,
        )
        upper = prv.compute_epsilon(delta=delta, num_self_compositions=[steps])[2]
        cells = [
            epsilon({shape: steps}, delta, "rdp"),
            _direct(q, sigma, steps, delta, rdp.RdpAccountant()),
            theirs,
            epsilon({shape: steps}, delta, "pld"),
            _direct(q, sigma, steps, delta, pld.PLDAccountant()),
            upper,
        ]
        print(f"| {q:g} | {sigma:g} | {steps} | {delta:g} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
