"""The privacy ledger's epsilon is dp-accounting's, and a second library agrees within what their methods
allow: Microsoft's prv-accountant (privacy random variables, tight like PLD) and Opacus's RDP analysis.

The eight settings of (sampling probability, noise multiplier, steps, delta) span the regimes runs meet:
client-level DP-FedAvg (q near 0.01-0.1, hundreds of rounds), DP-SGD (q near 0.001-0.02, thousands of
steps), and full participation (q = 1).
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
from dp_accounting import pld, rdp
from opacus.accountants.analysis import rdp as opacus_rdp
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism
from tiers import parametrize_first_by_default

from benchmarks.accountants import SETTINGS
from fedge.privacy import AccountingError, PrivacyLedger, Release, calibrate, epsilon
from fedge.privacy.accountant import DEFAULT_ORDERS


def poisson(q: float, sigma: float, steps: int, unit: str = "sample") -> dict:
    sampling = "none" if q == 1.0 else "poisson"
    release = Release(1, "gradient", unit, "gaussian", sigma, sampling=sampling, probability=q)
    return {release.shape(): steps}


def direct(q: float, sigma: float, steps: int, delta: float, accountant: dpa.PrivacyAccountant) -> float:
    event = (
        dpa.GaussianDpEvent(sigma) if q == 1.0 else dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
    )
    accountant.compose(event, steps)
    return float(accountant.get_epsilon(delta))


@parametrize_first_by_default(("q", "sigma", "steps", "delta"), SETTINGS)
def test_fedge_epsilon_is_dp_accountings_and_a_second_library_agrees(q, sigma, steps, delta):
    ours_rdp = epsilon(poisson(q, sigma, steps), delta, "rdp")
    assert ours_rdp == pytest.approx(direct(q, sigma, steps, delta, rdp.RdpAccountant()), rel=1e-12)
    ours_pld = epsilon(poisson(q, sigma, steps), delta, "pld")
    assert ours_pld == pytest.approx(direct(q, sigma, steps, delta, pld.PLDAccountant()), rel=1e-12)
    # Opacus's RDP analysis (its own code) at the same orders: the same bound to rounding
    curve = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(DEFAULT_ORDERS))
    theirs_rdp, _ = opacus_rdp.get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=curve, delta=delta)
    assert ours_rdp == pytest.approx(
        theirs_rdp, rel=0.05
    )  # conversions differ (Balle et al. 2020 vs Mironov)
    # prv-accountant: tight like PLD, an upper bound within its stated error
    prv = PRVAccountant(
        prvs=[PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)],
        max_self_compositions=[steps],
        eps_error=0.01,
        delta_error=delta / 1000,
    )
    _, _, upper = prv.compute_epsilon(delta=delta, num_self_compositions=[steps])
    assert ours_pld == pytest.approx(upper, rel=0.03, abs=0.02)
    assert ours_pld <= ours_rdp * 1.001  # PLD is tight; RDP an upper bound


def test_an_empty_history_spends_nothing_and_a_noise_free_release_everything():
    assert epsilon({}, 1e-5) == 0.0
    assert math.isinf(epsilon(poisson(0.1, 0.0, 3), 1e-5))


def test_sampling_without_replacement_is_accounted_under_replace_one_with_the_multiplier_halved():
    release = Release(
        1, "update", "client", "gaussian", 2.0, sampling="without_replacement", population=100, sample_size=10
    )
    ours = epsilon({release.shape(): 50}, 1e-5, "rdp")
    accountant = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.0)), 50)
    assert ours == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    with pytest.raises(AccountingError, match="pld accountant cannot account without_replacement"):
        epsilon({release.shape(): 50}, 1e-5, "pld")


def test_randomized_response_spends_its_pure_epsilon():
    k, eps = 10, 1.5
    p = k / (math.exp(eps) + k - 1)
    release = Release(1, "label", "label", "randomized_response", p, buckets=k)
    assert epsilon({release.shape(): 1}, 1e-5, "pld") == pytest.approx(eps, abs=1e-3)
    assert epsilon({release.shape(): 1}, 1e-5, "rdp") >= eps - 1e-6  # RDP's conversion is looser


def test_calibration_finds_the_multiplier_that_meets_the_target():
    q, steps, delta, target = 0.02, 500, 1e-5, 2.0
    sigma = calibrate(lambda z: poisson(q, z, steps), target, delta, "rdp")
    assert epsilon(poisson(q, sigma, steps), delta) <= target
    assert epsilon(poisson(q, sigma * 0.98, steps), delta) > target  # and no much smaller one does
    with pytest.raises(AccountingError, match="no noise multiplier"):
        calibrate(lambda z: poisson(q, 0.0, steps), target, delta)


def test_the_ledger_accounts_each_client_its_own_releases_and_the_worst_is_the_headline():
    ledger = PrivacyLedger(3, 1e-5)
    for t in (1, 2):
        ledger.record(Release(t, "gradient", "sample", "gaussian", 1.0, count=2, clients=(0,)))
        ledger.record(Release(t, "gradient", "sample", "gaussian", 1.0, count=1, clients=(1,)))
    own = [epsilon({ledger.releases[0].shape(): n}, 1e-5) for n in (4, 2)]
    fields = ledger.round_fields(2)
    assert fields["epsilon"] == pytest.approx(own[0]) and fields["epsilon_sample"] == pytest.approx(own[0])
    assert fields["epsilon_round"] == pytest.approx(epsilon({ledger.releases[0].shape(): 2}, 1e-5))
    assert fields["epsilon_next"] == pytest.approx(epsilon({ledger.releases[0].shape(): 6}, 1e-5))
    summary = ledger.summary()
    assert summary["epsilon_per_client"]["sample"] == pytest.approx([own[0], own[1], 0.0])
    restored = PrivacyLedger(3, 1e-5)
    restored.load_state_dict(ledger.state_dict())
    assert restored.summary() == summary
