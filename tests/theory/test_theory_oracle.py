"""P1, the oracle problem: exact constants, the reference simulator, P1 through a registered algorithm,
and the bounds holding on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from tiers import parametrize_first_by_default

from fedge.config import parse_config
from fedge.empirical.harness import measured_run, p1_built, p1_trace
from fedge.theory import oracle, sfl, validate


@pytest.fixture(scope="module")
def p1() -> oracle.P1Problem:
    return oracle.make_p1()


@pytest.mark.parametrize("sigma_G2", [0.0, 0.3, 1.0, 4.0])
def test_p1_has_exactly_the_requested_constants(sigma_G2):
    problem = oracle.make_p1(sigma_G2=sigma_G2, h_max=2.0, beta=0.7)
    assert problem.client.sigma_G2 == pytest.approx(sigma_G2, abs=1e-12)
    assert abs(problem.client.L - 2.7) < 1e-12
    assert problem.server.sigma_L2 == 1.0
    x = np.random.default_rng(0).normal(size=(5, 10))
    per_client = problem.client.client_grad(x[:, None], np.arange(20)[None])
    assert np.allclose(per_client.mean(axis=1), problem.client.grad(x))
    spread = ((per_client - problem.client.grad(x)[:, None]) ** 2).sum(-1)
    assert spread.max() == pytest.approx(sigma_G2, abs=1e-9)


@pytest.mark.ci
def test_p1_gradient_and_infimum(p1):
    side = p1.client
    x = np.random.default_rng(1).normal(size=10)
    step = 1e-6
    numeric = [(side.value(x + step * e) - side.value(x - step * e)) / (2 * step) for e in np.eye(10)]
    assert np.allclose(numeric, side.grad(x), atol=1e-6)
    starts = np.random.default_rng(2).uniform(-6, 6, size=(40, 10))
    found = min(minimize(side.value, s, jac=side.grad, method="L-BFGS-B").fun for s in starts)
    assert side.infimum() <= found < side.infimum() + 1e-5
    assert p1.delta_F_client == pytest.approx(float(side.value(p1.x0_client)) - side.infimum())


def test_noise_free_single_step_rounds_are_gradient_descent():
    problem = oracle.make_p1(sigma_L2=0.0)
    trace = oracle.simulate(problem, oracle.P1Run(T=5, K=1, l=1, mu_L=0.1, mu=0.01), replicates=1)
    x = problem.x0_client.copy()
    for t in range(5):
        assert trace.G_c[0, t] == pytest.approx(problem.client.grad_sq(x))
        x = x - 0.1 * problem.client.grad(x)


def test_simulation_is_seeded():
    problem = oracle.make_p1()
    run = oracle.P1Run(T=20, K=2, l=2, mu_L=0.05, mu=0.01, n=4)
    first, again = (oracle.simulate(problem, run, replicates=3, seed=5) for _ in range(2))
    other = oracle.simulate(problem, run, replicates=3, seed=6)
    assert np.array_equal(first.G_c, again.G_c) and np.array_equal(first.G_s, again.G_s)
    assert not np.array_equal(first.G_c, other.G_c)
    assert list(first.server_rounds) == list(range(2, 20, 2))


@parametrize_first_by_default("executor", ["sequential", "batched"])
def test_fedavg_on_p1_reproduces_the_simulator_without_noise(executor):
    problem = oracle.make_p1(sigma_L2=0.0)
    K, B, T, a = 5, 4, 12, 0.05
    config = parse_config(
        {
            "rounds": T,
            "partition": {"num_clients": 20},
            "engine": {"executor": executor},
            "algorithm": {"name": "fedavg", "batch_size": B, "optimizer": {"lr": a}},
        }
    )
    measured = p1_trace(p1_built(problem.client, problem.x0_client, config, K * B), problem.client)
    trace = oracle.simulate(problem, oracle.P1Run(T=T, K=K, l=1, mu_L=a, mu=1e-3), replicates=1)
    assert np.allclose(measured, trace.G_c[0], rtol=1e-5)


@pytest.mark.ci
def test_the_p1_model_draws_minibatch_noise_of_variance_sigma_L2(p1):
    config = parse_config({"rounds": 1, "partition": {"num_clients": 20}})
    built = p1_built(p1.client, p1.x0_client, config, 8)
    model, data = built.algorithm.model, built.context.data
    model.train()
    torch.manual_seed(0)
    x = data.x_train[:8]
    grads = []
    for _ in range(2000):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), data.y_train[:8]).backward()
        grads.append(model.p1.w.grad.double().numpy().copy())
    grads = np.array(grads)
    exact = p1.client.client_grad(p1.x0_client, np.array(0))
    assert np.abs(grads.mean(0) - exact).max() < 0.05
    assert ((grads - exact) ** 2).sum(1).mean() == pytest.approx(1.0, rel=0.08)


def test_every_nonvacuous_sfl_bound_holds_on_p1_and_the_lemmas_too(p1):
    L, m = p1.client.L, p1.client.m
    runs = [
        oracle.P1Run(T=300, K=5, l=2, mu_L=sfl.a_max(L, 5, 2), mu=sfl.thm3_step_cap(L, m)),
        oracle.P1Run(T=300, K=1, l=1, mu_L=sfl.a_max(L, 1, 1), mu=sfl.thm3_step_cap(L, m)),
        oracle.P1Run(T=300, K=5, l=2, mu_L=sfl.a_max(L, 5, 2), mu=sfl.thm4_step_cap(L, m), n=5),
    ]
    checked = 0
    for run in runs:
        trace = oracle.simulate(p1, run, replicates=8)
        for check in validate.sfl_checks(p1, run, trace):
            assert check.holds in (True, None), (check.bound.name, check.measured, check.bound.value)
            checked += check.holds is True
        ratios = validate.drift_ratios(p1, run, trace)
        assert ratios["client_drift"] <= 1 and ratios["server_drift"] <= 1
    assert checked == 7  # Thm 1 at l = 1, K = 1 is vacuous (D <= 0); the other seven are not


def test_thm4_as_stated_fails_on_p1_with_two_draws_per_round(p1):
    """The substitution of n by m in Theorem 4's last step is not an upper bound: at n = 2 of m = 20
    the measured server gradient norm exceeds Theorem 4 as stated, while the n-substituted form (which
    needs n >= 3) promises nothing."""
    L, m = p1.server.L, p1.server.m
    run = oracle.P1Run(T=1000, K=1, l=2, mu_L=0.01, mu=sfl.thm4_step_cap(L, m), n=2)
    checks = {c.bound.name: c for c in validate.sfl_checks(p1, run, oracle.simulate(p1, run, replicates=8))}
    assert checks["sfl.thm4.stated"].holds is False
    assert checks["sfl.thm4.n_substituted"].holds is None


def test_cse_fsl_propositions_hold_on_iid_p1():
    problem = oracle.make_p1(sigma_G2=0.0)
    for check in validate.cse_fsl_checks(problem, h=3, T=200, replicates=8):
        assert check.holds is True and check.margin > 1


def test_measured_run_records_the_start_and_every_round(p1):
    config = parse_config({"rounds": 3, "partition": {"num_clients": 20}, "algorithm": {"batch_size": 4}})
    rows = measured_run(p1_built(p1.client, p1.x0_client, config, 8), evaluate=False)
    assert [r["round"] for r in rows] == [0, 1, 2, 3] and all("grad_sq" in r for r in rows)
    assert rows[0]["grad_sq"] == pytest.approx(p1.client.grad_sq(p1.x0_client), rel=1e-5)
