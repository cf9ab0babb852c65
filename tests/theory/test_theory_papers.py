"""CSE-FSL Propositions 1-2, lightweight FedSL Theorem 1 and HIST Theorems 1-2 as computable bounds."""

from __future__ import annotations

import math

import pytest

from fedge.errors import ConfigError
from fedge.theory import cse_fsl, hist, light_fedsl

# ---- CSE-FSL (Propositions 1-2) ----


def test_cse_fsl_prop1_coefficients_fall_from_4L_and_2_towards_2L_and_1():
    def coefficients(h: int) -> tuple[float, float]:
        terms = cse_fsl.prop1(L=3.0, G1_sq=1.0, h=h, T=1, delta_F=1.0).terms
        return terms["optimisation"], terms["second_moment"]

    assert coefficients(1) == pytest.approx((12.0, 2.0))
    assert coefficients(10**6) == pytest.approx((6.0, 1.0), rel=1e-5)
    assert coefficients(2)[0] < coefficients(1)[0] and coefficients(5)[1] < coefficients(2)[1]


def test_cse_fsl_bounds_decay_like_one_over_sqrt_T_except_the_drift_term():
    p1 = [cse_fsl.prop1(L=1.0, G1_sq=2.0, h=5, T=T, delta_F=3.0).value for T in (100, 400)]
    assert p1[0] / p1[1] == pytest.approx(2.0)
    # a drift sum that grows linearly with T (features never settle) leaves a constant floor
    p2 = [cse_fsl.prop2(L=1.0, G2_sq=2.0, n=4, T=T, delta_F=3.0, drift_sum=0.5 * T) for T in (10**4, 10**10)]
    assert p2[0].terms["feature_drift"] == pytest.approx(p2[1].terms["feature_drift"])
    assert p2[0].terms["feature_drift"] == pytest.approx(4 * 2.0 * 0.5 / 7)
    assert p2[1].value == pytest.approx(p2[1].terms["feature_drift"], rel=1e-3)


def test_cse_fsl_bounds_hold_only_at_their_prescribed_steps():
    eta = cse_fsl.client_step(2.0, 5, 100)
    assert eta == pytest.approx(1 / (2.0 * 5 * 10))
    assert not cse_fsl.prop1(L=2.0, G1_sq=1.0, h=5, T=100, delta_F=1.0, eta=eta).vacuous
    other = cse_fsl.prop1(L=2.0, G1_sq=1.0, h=5, T=100, delta_F=1.0, eta=2 * eta)
    assert other.vacuous and "prescribed" in other.reason
    assert cse_fsl.prop2(L=2.0, G2_sq=1.0, n=4, T=100, delta_F=1.0, eta=0.1).vacuous


# ---- lightweight FedSL (Theorem 1, Remark 1) ----

LAYERS = {"sigma2": [1.0, 0.5, 0.2], "G2": [2.0, 1.0, 0.5], "W2": [3.0, 2.0, 1.0]}


def light(**changes) -> float:
    settings = {
        "beta": 1.0,
        "eta": 0.1,
        "T": 100,
        "K": 5,
        "I": 2,
        "Lc": 2,
        "rho_f": 0.3,
        "J2": [0.1, 0.1],
        "theta": 2.0,
        **LAYERS,
        **changes,
    }
    if "J2" not in changes:
        settings["J2"] = [0.1] * settings["Lc"]
    return light_fedsl.thm1(**settings).value


def test_light_fedsl_bound_grows_with_I_rho_and_the_cut():
    assert light(I=1) < light(I=5) < light(I=10)
    assert light(rho_f=0.0) < light(rho_f=0.35) < light(rho_f=0.9)
    assert light(Lc=1) < light(Lc=2) < light(Lc=3)


def test_light_fedsl_bound_falls_with_more_quantization_bits():
    def with_bits(bits: int | None) -> float:
        j2 = [light_fedsl.quantization_error(1000, 0.5, -0.5, bits)] * 2
        return light(J2=j2)

    assert with_bits(2) > with_bits(4) > with_bits(8) > with_bits(None)
    ratio = light_fedsl.quantization_error(100, 1, 0, 4) / light_fedsl.quantization_error(100, 1, 0, 5)
    assert ratio == pytest.approx((31 / 15) ** 2)  # ~4x per bit


def test_light_fedsl_without_pruning_or_quantization_keeps_only_the_sgd_terms():
    bound = light_fedsl.thm1(
        beta=1.0, eta=0.1, T=100, K=5, I=1, Lc=2, rho_f=0.0, J2=[0.0, 0.0], theta=2.0, **LAYERS
    )
    assert bound.terms["pruning"] == 0 and bound.terms["quantization"] == 0
    assert bound.terms["noise"] == pytest.approx(1.0 * 0.1 / 5 * (1.7 + 1.5))
    assert bound.terms["aggregation"] == pytest.approx(5 * (8 * 0.01 * 4 + 1) / 0.1 * 3.0)


def test_light_fedsl_step_condition_and_layer_checks():
    assert not light_fedsl.thm1(
        beta=1.0, eta=0.5, T=1, K=1, I=1, Lc=1, rho_f=0, J2=[0], theta=1, **LAYERS
    ).vacuous
    over = light_fedsl.thm1(beta=1.0, eta=0.6, T=1, K=1, I=1, Lc=1, rho_f=0, J2=[0], theta=1, **LAYERS)
    assert over.vacuous and "1/(2 beta)" in over.reason
    with pytest.raises(ConfigError) as error:
        light_fedsl.thm1(
            beta=1, eta=0.1, T=1, K=1, I=1, Lc=1, rho_f=0, J2=[0], theta=1, **{**LAYERS, "G2": [1.0]}
        )
    assert error.value.key == "G2"
    with pytest.raises(ConfigError) as error:
        light_fedsl.thm1(beta=1, eta=0.1, T=1, K=1, I=1, Lc=4, rho_f=0, J2=[0] * 4, theta=1, **LAYERS)
    assert error.value.key == "Lc"


# ---- HIST (Theorems 1-2) ----

HIST = {
    "L": 1.0,
    "T": 100,
    "E": 2,
    "H": 3,
    "sigma2": 1.0,
    "delta1_sq": 0.5,
    "delta2_sq": 0.25,
    "d": 1000,
    "model_sq_avg": 0.0,
    "delta_f": 2.0,
}


def test_hist_gamma_max_is_the_smallest_of_eq13():
    nt = hist.n_tilde([10, 10])
    assert nt == pytest.approx(0.2)
    expected = min(1 / (45 * math.sqrt(2) * 6), 0.2 / 6, 1 / 18, 1 / (6 * 4 * 9))
    assert hist.gamma_max(2, 2, 3, 1.0, nt) == pytest.approx(expected)
    assert hist.corollary_gamma(100, 2, 3, nt) == pytest.approx((100 * 2 * 3 * 0.2) ** -0.5)


def test_hist_mask_term_is_smallest_for_equal_mask_sizes():
    gamma = hist.gamma_max(4, 2, 3, 1.0, hist.n_tilde([5] * 4))
    equal = hist.thm1(gamma=gamma, clients_per_cell=[5] * 4, d_max_avg=250, **HIST)
    unequal = hist.thm1(gamma=gamma, clients_per_cell=[5] * 4, d_max_avg=400, **HIST)
    assert equal.terms["mask"] == pytest.approx(6 * 4 / 1000 * 250 * 0.5)
    assert equal.value < unequal.value and not equal.vacuous


def test_hist_thm2_adds_the_aircomp_term_and_N1_or_a_big_step_is_vacuous():
    gamma = 0.001
    one = hist.thm1(gamma=gamma, clients_per_cell=[5, 5], d_max_avg=500, **HIST)
    two = hist.thm1(gamma=gamma, clients_per_cell=[5, 5], d_max_avg=500, aircomp_mse=30.0, **HIST)
    assert two.name == "hist.thm2" and two.value == pytest.approx(one.value + gamma * 30.0)
    assert hist.thm1(gamma=gamma, clients_per_cell=[5], d_max_avg=1000, **HIST).vacuous
    big = hist.thm1(gamma=1.0, clients_per_cell=[5, 5], d_max_avg=500, **HIST)
    assert big.vacuous and "Eq. 13" in big.reason


def test_hist_more_clients_per_cell_lower_the_noise_term():
    terms = [hist.thm1(gamma=1e-3, clients_per_cell=[n, n], d_max_avg=500, **HIST).terms for n in (2, 20)]
    assert terms[1]["noise"] == pytest.approx(terms[0]["noise"] / 10)
    with pytest.raises(ConfigError):
        hist.thm1(gamma=1e-3, clients_per_cell=[0, 5], d_max_avg=500, **HIST)
