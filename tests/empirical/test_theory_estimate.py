"""Estimators of L, sigma_L^2, sigma_G^2 and the gradient-norm run metrics, against direct computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedge.config import parse_config
from fedge.empirical.estimate import estimate_constants, local_variance, smoothness, worst_case
from fedge.empirical.metrics import global_grad_norms, grad_sq_norm, split_grad_norms
from fedge.empirical.objective import SplitState, model_objective, probe_indices
from fedge.engine import buffers_of, parameters_of
from fedge.models import aux_head, output_shape, split
from fedge.runner.loop import build_run


@pytest.fixture(scope="module")
def built():
    config = {
        "seed": 1,
        "rounds": 2,
        "data": {"name": "synthetic", "num_train": 120, "num_test": 40, "shape": [1, 3, 3], "num_classes": 3},
        "partition": {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 10},
        "model": {"name": "mlp", "options": {"hidden": [4]}},
        "algorithm": {"name": "fedavg", "batch_size": 8, "optimizer": {"lr": 0.2}},
    }
    return build_run(parse_config(config))


def flat_params(params):
    return torch.cat([p.reshape(-1) for p in params.values()]).double()


def unflatten(vector, like):
    out, start = {}, 0
    for name, p in like.items():
        out[name] = vector[start : start + p.numel()].reshape(p.shape)
        start += p.numel()
    return out


def client_loss(model, like, x, y):
    return lambda v: F.cross_entropy(functional_call(model, unflatten(v, like), (x,)), y)


def client_data(built, c):
    data = built.context.data
    ix = torch.as_tensor(data.client_train[c])
    return data.x_train[ix].double(), data.y_train[ix]


def test_smoothness_matches_the_largest_hessian_eigenvalue(built):
    model = built.context.build_model().double()
    params = {k: v.double() for k, v in parameters_of(model).items()}
    expected = 0.0
    for c in range(4):
        x, y = client_data(built, c)
        hessian = torch.autograd.functional.hessian(client_loss(model, params, x, y), flat_params(params))
        expected = max(expected, float(torch.linalg.eigvalsh(hessian).abs().max()))
    objective = model_objective(model, {}, built.context.data)
    objective = type(objective)(
        objective.loss, objective.x.double(), objective.y, objective.clients, (model,)
    )
    assert smoothness(objective, params, iters=300) == pytest.approx(expected, rel=1e-2)


@pytest.mark.ci
def test_local_variance_is_the_without_replacement_minibatch_variance(built):
    model = built.context.build_model()
    params = parameters_of(model)
    objective = model_objective(model, buffers_of(model), built.context.data)
    batch = 8
    worst = 0.0
    rng = np.random.default_rng(0)
    for c in range(4):
        x, y = client_data(built, c)
        x = x.float()
        n = len(y)
        full = torch.func.grad(lambda p, x=x, y=y: F.cross_entropy(functional_call(model, p, (x,)), y))(
            params
        )
        draws = []
        for _ in range(600):
            pick = torch.as_tensor(rng.choice(n, batch, replace=False))

            def loss(p, pick=pick, x=x, y=y):
                return F.cross_entropy(functional_call(model, p, (x[pick],)), y[pick])

            g = torch.func.grad(loss)(params)
            draws.append(float(sum(((g[k] - full[k]) ** 2).sum() for k in g)))
        worst = max(worst, float(np.mean(draws)))
    assert local_variance(objective, params, batch) == pytest.approx(worst, rel=0.12)


def test_heterogeneity_and_grad_norm_match_per_client_autograd(built):
    algorithm = built.algorithm
    params = algorithm.params
    grads = []
    for c in range(4):
        x, y = client_data(built, c)
        g = torch.func.grad(
            lambda p, x=x, y=y: F.cross_entropy(functional_call(algorithm.model, p, (x.float(),)), y)
        )(params)
        grads.append(torch.cat([t.reshape(-1) for t in g.values()]).double())
    grads = torch.stack(grads)
    mean = grads.mean(0)
    objective = model_objective(algorithm.model, algorithm.buffers, built.context.data)
    constants = estimate_constants(objective, params, batch_size=8, power_iters=5)
    assert constants.sigma_G2 == pytest.approx(float(((grads - mean) ** 2).sum(1).max()), rel=1e-4)
    assert constants.sigma_G2_mean == pytest.approx(float(((grads - mean) ** 2).sum(1).mean()), rel=1e-4)
    assert constants.grad_sq == pytest.approx(float((mean**2).sum()), rel=1e-4)
    assert global_grad_norms(algorithm)["grad_sq"] == pytest.approx(float((mean**2).sum()), rel=1e-4)
    worse = worst_case([constants, constants.__class__(**{**constants.as_dict(), "L": 99.0, "value": 7.0})])
    assert worse.L == 99.0 and worse.value == constants.value


def test_grad_norm_falls_as_fedavg_trains(built):
    config = built.config.model_copy(update={"rounds": 1})
    fresh = build_run(config)
    before = global_grad_norms(fresh.algorithm)["grad_sq"]
    late = []
    for t in range(1, 26):
        fresh.algorithm.run_round(t)
        if t > 20:
            late.append(global_grad_norms(fresh.algorithm)["grad_sq"])
    assert np.mean(late) < 0.6 * before


def test_split_grad_norms_match_direct_autograd(built):
    data = built.context.data
    model = built.context.build_model()
    trunk, server = split(model, 1)
    torch.manual_seed(0)
    aux = aux_head("linear", output_shape(trunk, data.input_shape), 3)
    tp, sp, ap = parameters_of(trunk), parameters_of(server), parameters_of(aux)
    norms = split_grad_norms(SplitState(trunk, server, tp, sp, aux, ap), data)

    def objective(loss):
        values = []
        for c in range(4):
            x, y = client_data(built, c)
            values.append(loss(x.float(), y))
        return torch.stack(values).mean()

    def aux_loss(p_trunk, x, y):
        return F.cross_entropy(functional_call(aux, ap, (functional_call(trunk, p_trunk, (x,)),)), y)

    def server_loss(p_server, x, y):
        return F.cross_entropy(functional_call(server, p_server, (functional_call(trunk, tp, (x,)),)), y)

    g_c = torch.func.grad(lambda p: objective(lambda x, y: aux_loss(p, x, y)))(tp)
    g_s = torch.func.grad(lambda p: objective(lambda x, y: server_loss(p, x, y)))(sp)
    assert norms["grad_sq_client"] == pytest.approx(float(sum((g**2).sum() for g in g_c.values())), rel=1e-4)
    assert norms["grad_sq_server"] == pytest.approx(float(sum((g**2).sum() for g in g_s.values())), rel=1e-4)
    joint = norms["grad_sq_client_joint"]
    assert joint > norms["grad_sq_client"]
    whole = model_objective(model, {}, data)
    assert norms["grad_sq_end_to_end"] == pytest.approx(grad_sq_norm(whole, parameters_of(model)), rel=1e-4)
    without_aux = split_grad_norms(SplitState(trunk, server, tp, sp), data)
    assert set(without_aux) == {"grad_sq_server", "grad_sq_end_to_end"}


def test_probe_subsets_are_fixed_and_bounded(built):
    data = built.context.data
    first, second = probe_indices(data, 10, seed=3), probe_indices(data, 10, seed=3)
    assert all(len(ix) == min(10, len(full)) for ix, full in zip(first, data.client_train, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert all(np.isin(ix, full).all() for ix, full in zip(first, data.client_train, strict=True))
