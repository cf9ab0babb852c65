"""SplitFed bounds (Theorems 1-4): golden values, the vacuity cases, the leading-order claims."""

from __future__ import annotations

import math

import pytest

from fedge.errors import ConfigError
from fedge.theory import sfl

UNIT = {"L": 1.0, "sigma_L2": 1.0, "sigma_G2": 1.0, "delta_F": 1.0}


def at_max(K: int, l: int, T: int = 1000, **extra) -> dict:  # noqa: E741
    return {**UNIT, "a": sfl.a_max(1.0, K, l), "K": K, "l": l, "T": T, **extra}


@pytest.mark.parametrize(
    ("K", "l", "a", "gamma_lam2", "value"),
    [
        (8, 1, 0.015625, 0.998047, 887.692),
        (16, 1, 0.0078125, 0.983398, 103.993),
        (1, 2, 0.0281641, 0.428071, 0.997248),
        (5, 2, 0.00563282, 0.421424, 0.978984),
        (5, 4, 0.000571908, 0.176746, 0.962017),
    ],
)
def test_thm1_golden_values(K, l, a, gamma_lam2, value):  # noqa: E741
    bound = sfl.thm1(**at_max(K, l))
    assert sfl.a_max(1.0, K, l) == pytest.approx(a, rel=1e-5)
    assert bound.conditions["Gamma*lam2"] == pytest.approx(gamma_lam2, abs=1e-6)
    assert bound.value == pytest.approx(value, rel=1e-5)
    assert not bound.vacuous and bound.value == pytest.approx(sum(bound.terms.values()))


@pytest.mark.parametrize(
    ("T", "K", "l", "value"),
    [
        (1000, 1, 1, 0.547053),
        (1000, 5, 1, 0.546985),
        (1000, 5, 2, 2.2845),
        (1000, 5, 4, 22.241),
        (10000, 5, 1, 0.170911),
        (10000, 5, 4, 7.00707),
    ],
)
def test_thm1_golden_values_at_the_corollary_step(T, K, l, value):  # noqa: E741
    a = sfl.corollary_client_step(1.0, K, l, T)
    bound = sfl.thm1(**{**UNIT, "a": a, "K": K, "l": l, "T": T})
    assert bound.value == pytest.approx(value, rel=1e-5) and not bound.vacuous


@pytest.mark.parametrize(
    ("n", "K", "l", "stated", "corrected"),
    [
        (5, 1, 2, 0.218217, 0.280899),
        (5, 5, 2, 0.210225, 0.270471),
        (5, 5, 4, 0.709412, 0.737317),
        (20, 5, 2, 0.209380, 0.269382),
    ],
)
def test_thm2_golden_values(n, K, l, stated, corrected):  # noqa: E741
    assert sfl.thm2(**at_max(K, l, n=n), variant="stated").value == pytest.approx(stated, rel=1e-5)
    assert sfl.thm2(**at_max(K, l, n=n)).value == pytest.approx(corrected, rel=1e-5)


@pytest.mark.parametrize(
    ("m", "l", "thm3", "thm4"),
    [(4, 1, 0.6112, 0.939), (4, 4, 0.7648, 1.131), (10, 1, 0.258824, 0.31875), (20, 1, 0.248649, 0.275)],
)
def test_thm3_thm4_golden_values_at_their_cap(m, l, thm3, thm4):  # noqa: E741
    mu = 1 / (8 * m * m)
    server = {**UNIT, "mu": mu, "m": m, "l": l, "T": 1000}
    assert sfl.thm3(**server).value == pytest.approx(thm3, rel=1e-5)
    assert sfl.thm4(**server, n=m).value == pytest.approx(thm4, rel=1e-5)


def test_thm3_thm4_golden_values_m20_l4():
    server = {**UNIT, "mu": 1 / 3200, "m": 20, "l": 4, "T": 1000}
    assert sfl.thm3(**server).value == pytest.approx(0.767568, rel=1e-5)
    assert sfl.thm4(**server, n=20).value == pytest.approx(0.808333, rel=1e-5)


@pytest.mark.parametrize(("K", "gamma_lam2"), [(1, 1.203), (2, 1.086), (4, 1.027), (8, 0.998)])
def test_thm1_at_l1_is_vacuous_below_K8_at_the_maximal_step(K, gamma_lam2):
    bound = sfl.thm1(**at_max(K, 1))
    assert bound.conditions["Gamma*lam2"] == pytest.approx(gamma_lam2, abs=1e-3)
    assert bound.vacuous == (K < 8)
    if K < 8:
        assert math.isinf(bound.value) and "D = 1 - Gamma*lam2" in bound.reason


@pytest.mark.parametrize("K", [1, 2, 5, 10, 20])
def test_thm2_is_vacuous_at_l1_for_every_K_and_fine_at_l2(K):
    at_l1 = sfl.thm2(**at_max(K, 1, n=5))
    assert at_l1.vacuous and math.isinf(at_l1.value)
    assert 1.08 <= at_l1.conditions["Gamma'*lam2"] <= 1.112  # about 1.08-1.11 for every K
    assert not sfl.thm2(**at_max(K, 2, n=5)).vacuous


def test_golden_thm2_vacuity_case():
    bound = sfl.thm2(**at_max(5, 1, n=5))
    assert bound.conditions["Gamma'*lam2"] == pytest.approx(1.087891, abs=1e-6)
    assert "D' = 1 - Gamma'*lam2" in bound.reason


def test_corollary_steps_make_thm1_valid_at_l1_for_every_K():
    for K in (1, 2, 4):
        assert not sfl.thm1(
            **{**UNIT, "a": sfl.corollary_client_step(1, K, 1, 2), "K": K, "l": 1, "T": 2}
        ).vacuous


def test_thm1_depends_on_K_only_through_eta():
    values = [sfl.thm1(**{**UNIT, "a": 1e-3 / K, "K": K, "l": 2, "T": 10**6}).value for K in (1, 5, 20)]
    assert values == pytest.approx([0.018272, 0.018268, 0.018268], abs=1e-6)
    lead = sfl.thm1_leading(**{**UNIT, "a": 1e-3 / 5, "K": 5, "l": 2, "T": 10**6})
    assert lead == pytest.approx(0.018) and lead <= min(values)


def test_a_step_over_its_cap_keeps_a_finite_value_but_is_vacuous():
    bound = sfl.thm1(**{**UNIT, "a": 0.04, "K": 1, "l": 2, "T": 1000})
    assert bound.vacuous and math.isfinite(bound.value) and "exceeds a_max" in bound.reason
    server = sfl.thm3(**{**UNIT, "mu": 0.01, "m": 10, "l": 1, "T": 1000})
    assert server.vacuous and "appendix cap" in server.reason
    assert not sfl.thm3(**{**UNIT, "mu": 0.01, "m": 10, "l": 1, "T": 1000}, cap="main_text").vacuous


@pytest.mark.parametrize(
    ("theorem", "kwargs", "needle"),
    [
        (sfl.thm3, {"m": 1, "l": 1}, "m >= 2"),
        (sfl.thm4, {"m": 2, "n": 2, "l": 1}, "m >= 3"),
        (sfl.thm4, {"m": 20, "n": 2, "l": 1, "variant": "n_substituted"}, "n >= 3"),
    ],
)
def test_too_few_clients_make_the_server_bounds_infinite(theorem, kwargs, needle):
    bound = theorem(**UNIT, mu=1e-4, T=100, **kwargs)
    assert bound.vacuous and math.isinf(bound.value) and needle in bound.reason


def test_thm4_stated_has_no_n_and_the_substituted_variant_grows_as_n_shrinks():
    server = {**UNIT, "mu": 1 / (8 * 400), "m": 20, "l": 1, "T": 1000}
    stated = {n: sfl.thm4(**server, n=n).value for n in (3, 5, 20)}
    substituted = [sfl.thm4(**server, n=n, variant="n_substituted").value for n in (3, 5, 20)]
    assert len(set(stated.values())) == 1
    assert substituted[0] > substituted[1] > substituted[2] == pytest.approx(stated[20])


def test_a_negative_gap_gives_a_negative_vacuous_bound():
    bound = sfl.thm3(**{**UNIT, "delta_F": -100.0}, mu=1e-3, m=4, l=1, T=10)
    assert bound.vacuous and bound.value < 0 and "negative" in bound.reason


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"L": 0.0}, "L"), ({"sigma_L2": -1.0}, "sigma_L2"), ({"K": 0}, "K"), ({"T": 2.5}, "T")],
)
def test_impossible_inputs_name_their_key(kwargs, key):
    with pytest.raises(ConfigError) as error:
        sfl.thm1(**{**at_max(5, 2), **kwargs})
    assert error.value.key == key


def test_drift_lemma_bounds():
    assert sfl.client_drift_bound(a=0.1, K=2, sigma_L2=1, sigma_G2=0, grad_sq=0) == pytest.approx(0.1)
    assert sfl.client_drift_bound(a=0.1, K=2, sigma_L2=0, sigma_G2=0, grad_sq=1) == pytest.approx(1.2)
    assert sfl.server_drift_bound(mu=0.1, m=2, sigma_L2=1, sigma_G2=1, grad_sq=1) == pytest.approx(4.8)
