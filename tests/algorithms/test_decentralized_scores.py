"""AFIND+ arithmetic (Eqs. 8-16): scores, threshold, Boltzmann weights, Eq. 15, proxies, DP noise,
and the mixing primitives."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedge.aggregation import Part, Updates, WeightedMean, sites
from fedge.algorithms.decentralized import proxies
from fedge.algorithms.decentralized.probes import probe_batches
from fedge.algorithms.decentralized.proxies import Prober
from fedge.algorithms.decentralized.proxy_layers import proxy_layer
from fedge.algorithms.decentralized.scores import (
    adaptive_threshold,
    boltzmann_weights,
    cosine,
    full_scores,
    gaussian_mechanism,
    partial_scores,
    smoothed_loss,
    top_k,
)
from fedge.data.dataset import Dataset
from fedge.data.federated import FederatedData
from fedge.engine import buffers_of, parameters_of
from fedge.engine.bank import stack_copies
from fedge.engine.mixing import mix, uniform_rows
from fedge.models import build_model


def random_sim(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, n, generator=gen, dtype=torch.float64) * 2 - 1


def neighbours(n: int, p: float = 0.6, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(n, n, generator=gen) < p
    a = torch.triu(a, 1)
    return a | a.T


def test_eq8_rows_sum_to_one_over_available_and_rank_by_similarity():
    sim, avail = random_sim(8), neighbours(8)
    p = full_scores(sim, avail, upsilon=0.1)
    has = avail.any(1)
    assert torch.allclose(p.sum(1)[has], torch.ones(int(has.sum()), dtype=torch.float64))
    assert (p[~avail] == 0).all()
    i = int(torch.nonzero(avail.sum(1) >= 2)[0])
    cols = torch.nonzero(avail[i]).flatten()
    order_p = torch.argsort(p[i, cols])
    order_s = torch.argsort(sim[i, cols])
    assert (order_p == order_s).all()


def test_eq9_keeps_row_sums_and_leaves_unrefreshed_scores_untouched():
    n = 9
    avail = ~torch.eye(n, dtype=torch.bool)
    p = full_scores(random_sim(n, 1), avail, 0.2)
    refreshed = avail & (torch.rand(n, n, generator=torch.Generator().manual_seed(3)) < 0.4)
    new = partial_scores(p, random_sim(n, 2), refreshed, 0.2)
    assert torch.allclose(new.sum(1), torch.ones(n, dtype=torch.float64))
    assert torch.equal(new[~refreshed], p[~refreshed])
    assert torch.allclose((new * refreshed).sum(1), (p * refreshed).sum(1))  # the coreset keeps its mass


def test_eq9_over_all_neighbours_is_eq8():
    sim, avail = random_sim(6, 4), ~torch.eye(6, dtype=torch.bool)
    uniform = avail.double() / 5
    assert torch.allclose(partial_scores(uniform, sim, avail, 0.1), full_scores(sim, avail, 0.1))


@pytest.mark.parametrize("tau", [0.1, 0.5, 1.5])
def test_threshold_in_range_and_half_tau_for_an_empty_coreset(tau):
    sim = random_sim(10, 5)
    members = neighbours(10, 0.5, 5)
    members[0] = False
    theta = adaptive_threshold(sim, members, tau)
    assert (theta > 0).all() and (theta <= tau / 2 + 1e-12).all()
    assert theta[0] == pytest.approx(tau / 2)


def test_threshold_decreases_when_a_dissimilar_member_is_added():
    sim = torch.tensor([[0.0, 0.95, 0.9, -0.2]], dtype=torch.float64)
    before = adaptive_threshold(sim, torch.tensor([[False, True, True, False]]), 0.5)
    after = adaptive_threshold(sim, torch.tensor([[False, True, True, True]]), 0.5)
    assert after[0] < before[0]


def test_threshold_matches_the_spec_table():
    # Eqs. 10-13 worked by hand: tau = 0.5, k members all at cosine s -> theta
    for k, s, expected in [(1, 0.95, 0.247), (3, 0.5, 0.172), (5, 0.8, 0.192), (10, 0.0, 0.015)]:
        sim = torch.full((1, k), s, dtype=torch.float64)
        theta = adaptive_threshold(sim, torch.ones(1, k, dtype=torch.bool), 0.5)
        assert float(theta[0]) == pytest.approx(expected, abs=1e-3)


def test_threshold_flags():
    sim = torch.full((2, 4), 0.5, dtype=torch.float64)
    members = torch.ones(2, 4, dtype=torch.bool)
    literal = adaptive_threshold(sim, members, 0.5)
    inverted = adaptive_threshold(sim, members, 0.5, direction="inverted")
    assert torch.allclose(literal + inverted, torch.full((2,), 0.5, dtype=torch.float64))
    mean = adaptive_threshold(sim, members, 0.5, reduce="mean")
    assert (mean > literal).all()  # a smaller uncertainty, a higher threshold
    z = adaptive_threshold(sim, members, 0.5, normalize="zscore")
    assert torch.allclose(z, torch.full((2,), 0.25, dtype=torch.float64))  # equal h -> z = 0 -> sigmoid 1/2


def test_boltzmann_weights_order_limits_and_sums():
    losses = torch.tensor([[0.3, 1.2, 0.7, 9.0]], dtype=torch.float64)
    members = torch.tensor([[True, True, True, False]])
    w = boltzmann_weights(losses, members, 1.0)
    assert float(w.sum()) == pytest.approx(1.0) and w[0, 3] == 0
    assert w[0, 0] > w[0, 2] > w[0, 1] > 0
    hot = boltzmann_weights(losses, members, 1e6)
    assert torch.allclose(hot[0, :3], torch.full((3,), 1 / 3, dtype=torch.float64), atol=1e-6)
    cold = boltzmann_weights(losses, members, 1e-3)
    assert torch.allclose(cold[0], torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64))


def test_eq15_gamma_one_is_the_pre_loss_and_zero_the_post_loss():
    pre, post = torch.tensor([0.4, 2.0]), torch.tensor([0.1, 0.5])
    assert torch.equal(smoothed_loss(pre, post, 1.0), pre)
    assert torch.equal(smoothed_loss(pre, post, 0.0), post)
    assert torch.allclose(smoothed_loss(pre, post, 0.9), 0.1 * post + 0.9 * pre)


def test_top_k_takes_the_best_allowed_entries():
    scores = torch.tensor([[0.0, 5.0, 3.0, 9.0], [1.0, 0.0, 2.0, 3.0]])
    allowed = torch.tensor([[False, True, True, False], [True, False, True, True]])
    chosen = top_k(scores, allowed, 1)
    assert chosen.tolist() == [[False, True, False, False], [False, False, False, True]]
    assert top_k(scores, allowed, 5).sum().item() == 5  # capped by what is allowed


def test_cosine_of_parallel_and_opposite_vectors():
    a = torch.tensor([[1.0, 2.0], [1.0, 0.0]])
    b = torch.tensor([[2.0, 4.0], [-3.0, 0.0]])
    assert torch.allclose(cosine(a, b), torch.tensor([1.0, -1.0], dtype=torch.float64))


def test_proxy_of_identical_data_at_the_same_point_has_cosine_one():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 4, 4, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    data = FederatedData(
        Dataset("t", x, y, x, y, 3), [np.arange(20), np.arange(20), np.arange(20, 40)], [np.arange(5)] * 3, 0
    )
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 3, hidden=(8, 6))
    names = proxy_layer(model, None)
    assert names == ["fc2.linear.weight", "fc2.linear.bias"]
    params, buffers = stack_copies(parameters_of(model), 3), stack_copies(buffers_of(model), 3)
    prober = Prober(model, (1, 4, 4), names, set(), "gradient")
    assert prober.dim == 8 * 6 + 6
    batches = probe_batches(data, seed=0, round_=1, size=32)
    zero = torch.zeros(3, dtype=torch.long)
    proxies, losses = prober.proxies(params, buffers, zero, zero, torch.arange(3), data, batches)
    sims = cosine(proxies[[0, 0]], proxies[[1, 2]])
    assert float(sims[0]) == pytest.approx(1.0, abs=1e-6)
    assert float(sims[1]) < 0.999
    assert losses[0] == pytest.approx(float(losses[1]))


def test_dp_proxies_are_clipped_per_example():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(30, 1, 4, 4, generator=gen) * 10, torch.randint(0, 3, (30,), generator=gen)
    data = FederatedData(Dataset("t", x, y, x, y, 3), [np.arange(30)], [np.arange(5)], 0)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 3, hidden=(8,))
    prober = Prober(model, (1, 4, 4), proxy_layer(model, None), set(), "gradient")
    params, buffers = stack_copies(parameters_of(model), 1), stack_copies(buffers_of(model), 1)
    batches = probe_batches(data, 0, 1, 16)
    zero = torch.zeros(1, dtype=torch.long)
    plain, _ = prober.proxies(params, buffers, zero, zero, zero, data, batches)
    summed, _ = prober.proxies(params, buffers, zero, zero, zero, data, batches, clip=0.01)
    assert float(summed.norm()) <= 16 * 0.01 + 1e-6 < float(plain.norm()) * 16


def test_dp_noise_has_the_requested_std():
    sigma, clip, batch = 2.0, 1.5, 8
    gen = torch.Generator().manual_seed(0)
    noisy = gaussian_mechanism(torch.zeros(4000, 50), torch.full((4000,), batch), clip, sigma, gen)
    assert float(noisy.std()) == pytest.approx(sigma * clip / batch, rel=0.02)
    assert abs(float(noisy.mean())) < 0.005
    signal = gaussian_mechanism(torch.full((2, 3), 8.0), torch.full((2,), 8), clip, 0.0, gen)
    assert torch.equal(signal, torch.ones(2, 3))


def test_mix_is_one_matrix_product_per_tensor():
    gen = torch.Generator().manual_seed(2)
    stacked = {"w": torch.randn(5, 3, 2, generator=gen), "count": torch.arange(5)}
    weights = torch.rand(4, 5, generator=gen, dtype=torch.float64)
    out = mix(stacked, weights)
    assert set(out) == {"w"}  # integer counters are not averaged
    loop = torch.stack([sum(float(weights[i, r]) * stacked["w"][r] for r in range(5)) for i in range(4)])
    assert torch.allclose(out["w"], loop, atol=1e-6)


def test_the_peer_mean_averages_each_masked_coordinate_over_its_holders():
    x = torch.tensor([[1.0, 2.0, 3.0], [5.0, 6.0, 7.0], [9.0, 10.0, 11.0]])
    m = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 0]], dtype=torch.bool)
    weights = torch.full((3, 3), 1 / 3, dtype=torch.float64)
    own = {"w": x * m + 100.0}  # what a receiver keeps where no row holds a coordinate
    masked = Updates(sites.PEER, 1, (Part({"w": x * m}, weights, {"w": m}),), own)
    out = WeightedMean().reduce(masked)["w"]
    assert out[0].tolist() == pytest.approx([3.0, 8.0, 100.0])  # nobody holds coordinate 2: own value
    plain = Updates(sites.PEER, 1, (Part({"w": x * m}, weights),), own)
    assert torch.allclose(WeightedMean().reduce(plain)["w"], weights.float() @ (x * m))


def test_uniform_rows_include_self_and_keep_lonely_clients_alone():
    chosen = torch.tensor([[False, True, True], [False, False, False], [True, False, False]])
    w = uniform_rows(chosen)
    assert torch.allclose(w.sum(1), torch.ones(3, dtype=torch.float64))
    assert w[0].tolist() == pytest.approx([1 / 3] * 3) and w[1].tolist() == [0.0, 1.0, 0.0]
    w = uniform_rows(chosen, include_self=False)
    assert w[0].tolist() == pytest.approx([0.0, 0.5, 0.5]) and w[1, 1] == 1.0
    assert math.isclose(float(w[2, 0]), 1.0)


def four_clients_with_private_heads():
    """A prober over 4 perturbed MLP rows with private heads, their data and probe batches."""
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(60, 1, 4, 4, generator=gen), torch.randint(0, 3, (60,), generator=gen)
    parts = [np.arange(i * 15, (i + 1) * 15) for i in range(4)]
    data = FederatedData(Dataset("t", x, y, x, y, 3), parts, [np.arange(5)] * 4, 0)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 3, hidden=(8, 6))
    params = {
        k: v + 0.1 * torch.randn(4, *v.shape[1:], generator=gen)
        for k, v in stack_copies(parameters_of(model), 4).items()
    }
    buffers = stack_copies(buffers_of(model), 4)
    head = {"out.linear.weight", "out.linear.bias"}
    prober = Prober(model, (1, 4, 4), proxy_layer(model, None), head, "gradient")
    batches = probe_batches(data, 0, 1, 8)
    return prober, params, buffers, data, batches


@pytest.mark.parametrize("clip", [None, 0.5])
def test_dense_and_pairwise_probes_agree_with_private_heads(clip):
    prober, params, buffers, data, batches = four_clients_with_private_heads()
    own = torch.arange(4)
    mine, _ = prober.proxies(params, buffers, own, own, own, data, batches, clip)
    dense_sim, dense_loss = prober.similarities(params, buffers, mine, data, batches, clip)
    i, k = torch.meshgrid(own, own, indexing="ij")
    i, k = i.flatten(), k.flatten()
    theirs, loss = prober.proxies(params, buffers, i, k, k, data, batches, clip)
    if clip is not None:
        theirs = theirs / batches.weight[k].sum(1, keepdim=True)
    assert torch.allclose(dense_sim.flatten(), cosine(mine[i], theirs), atol=1e-6)
    assert torch.allclose(dense_loss.flatten(), loss.double(), atol=1e-6)
    assert torch.allclose(dense_sim.diagonal(), torch.ones(4, dtype=torch.float64), atol=1e-6)


def test_linear_proxy_cosines_equal_the_formed_gradients_cosines():
    """The fast path (a linear proxy's cosine from its inputs and output gradients) against forming each
    pair's proxy gradient, on a proxy layer fed by an earlier layer, with private heads."""
    prober, params, buffers, data, batches = four_clients_with_private_heads()
    assert prober.linear is not None and prober.linear.in_features == 8
    own = torch.arange(4)
    mine, _ = prober.proxies(params, buffers, own, own, own, data, batches)
    fast = prober.similarities(params, buffers, mine, data, batches)
    linear, prober.linear = prober.linear, None
    formed = prober.similarities(params, buffers, mine, data, batches)
    prober.linear = linear
    assert not torch.allclose(fast[0], torch.ones_like(fast[0]), atol=1e-3)  # cosines that differ
    assert torch.allclose(fast[0], formed[0], atol=1e-6)
    assert torch.equal(fast[1], formed[1])


@pytest.mark.parametrize("chunk_rows", [1, 3])
def test_probe_rows_of_a_share_are_the_rows_of_one_call_noise_included(monkeypatch, chunk_rows):
    """A process's share of requesters (``requesters``) gets the rows, and the DP noise, of one call."""
    prober, params, buffers, data, batches = four_clients_with_private_heads()
    per_requester = 4 * prober.dim * (2 + batches.index.shape[1])
    monkeypatch.setattr(proxies, "CHUNK_FLOATS", per_requester * chunk_rows)
    own = torch.arange(4)
    mine, _ = prober.proxies(params, buffers, own, own, own, data, batches, 0.5)

    def similarities(rows: slice | None = None):
        part = mine if rows is None else mine[rows]
        noise = (5.0, torch.Generator().manual_seed(9))  # large: other noise would change every cosine
        return prober.similarities(params, buffers, part, data, batches, 0.5, noise, rows)

    whole = similarities()
    for cut in (1, 3):
        halves = [similarities(slice(0, cut)), similarities(slice(cut, 4))]
        for k in (0, 1):
            assert torch.allclose(torch.cat([h[k] for h in halves]), whole[k], atol=1e-6)
    assert similarities(slice(2, 2))[0].shape == (0, 4)


def test_dp_noise_of_a_share_is_that_share_of_the_whole_draw():
    summed, count = torch.randn(7, 5), torch.full((7,), 4)
    whole = gaussian_mechanism(summed, count, 1.0, 2.0, torch.Generator().manual_seed(1))
    part = gaussian_mechanism(summed[2:5], count[2:5], 1.0, 2.0, torch.Generator().manual_seed(1), 2, 7)
    assert torch.equal(part, whole[2:5])
