"""The cut's pure mechanisms (fedge.privacy.cut): per-sample clipping, keyed Gaussian noise on the sent
entries, k-ary randomized response, release counting and the planners."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedge.config import PrivacyConfig, RunConfig
from fedge.privacy import epsilon
from fedge.privacy.cut import (
    add_row_noise,
    clip_rows,
    keep_probability,
    label_release,
    most_sends,
    plan_cut,
    plan_labels,
    planned_sends,
    randomized_response,
    replace_probability,
)
from fedge.privacy.run import RunPrivacy
from fedge.runner.privacy import calibrated, worst_epsilon


def run_privacy(seed: int = 0) -> RunPrivacy:
    return RunPrivacy(PrivacyConfig(), num_clients=2, seed=seed)


def test_each_sample_is_clipped_and_samples_within_the_bound_pass_unchanged():
    z = torch.randn(3, 7, 2, 4, generator=torch.Generator().manual_seed(0)) * 5
    z[1, 2] = z[1, 2] / torch.linalg.vector_norm(z[1, 2]) * 0.5  # already inside the bound
    clipped = clip_rows(z, 1.5, lead=2)
    norms = torch.linalg.vector_norm(clipped.flatten(2), dim=-1)
    assert norms.max() <= 1.5 * (1 + 1e-6)
    assert torch.equal(clipped[1, 2], z[1, 2])
    big = norms.ne(norms[1, 2])
    assert torch.allclose(norms[big], torch.full_like(norms[big], 1.5))
    assert torch.equal(clip_rows(z, 1e9, lead=2), z)  # a huge bound is an exact identity


def test_the_gradient_goes_through_the_clip():
    z = torch.tensor([[3.0, 4.0], [0.3, 0.4]], requires_grad=True)
    (clip_rows(z, 1.0)[:, 0]).sum().backward()
    # d(z0 / ||z||)/dz at (3, 4): (||z||^2 - z0 z) / ||z||^3 = (16, -12) / 125; inside the bound: (1, 0)
    assert torch.allclose(z.grad, torch.tensor([[16 / 125, -12 / 125], [1.0, 0.0]]))


def test_noise_has_std_multiplier_times_clip_and_only_on_the_sent_entries():
    z = torch.zeros(2, 50_000, 2)
    noisy = add_row_noise(
        z, torch.tensor([40_000, 0]), 0.7, run_privacy(), "smashed", [(1, 0, 0, 0), (1, 1, 0, 0)]
    )
    sent = noisy[0, :40_000]
    assert float(sent.std()) == pytest.approx(0.7, rel=0.02)
    assert abs(float(sent.mean())) < 0.02
    assert torch.equal(noisy[0, 40_000:], z[0, 40_000:]) and torch.equal(noisy[1], z[1])


def test_noise_is_keyed_not_sequenced():
    z = torch.zeros(2, 4, 3)
    privacy = run_privacy(seed=5)
    both = add_row_noise(z, torch.tensor([4, 4]), 1.0, privacy, "smashed", [(1, 0, 0, 2), (1, 1, 0, 2)])
    alone = add_row_noise(z[1:], torch.tensor([4]), 1.0, privacy, "smashed", [(1, 1, 0, 2)])
    assert torch.equal(both[1], alone[0])  # a row's noise does not depend on the other rows
    assert not torch.equal(both[0], both[1])
    other = add_row_noise(z, torch.tensor([4, 4]), 1.0, run_privacy(seed=6), "smashed", [(1, 0, 0, 2)] * 2)
    assert not torch.equal(other[0], both[0])


@pytest.mark.parametrize(("eps", "classes"), [(1.0, 10), (0.3, 2), (2.5, 4)])
def test_randomized_response_keeps_labels_at_the_rate_epsilon_allows(eps, classes):
    n = 200_000
    labels = torch.arange(n) % classes
    noisy = randomized_response(labels, eps, classes, torch.Generator().manual_seed(1))
    q = math.exp(eps) / (math.exp(eps) + classes - 1)
    assert keep_probability(eps, classes) == pytest.approx(q)
    kept = float((noisy == labels).float().mean())
    assert abs(kept - q) < 4 * math.sqrt(q * (1 - q) / n)  # binomial tolerance (4 sigma)
    # changed labels are uniform over the other classes: each shift 1..k-1 equally often
    shifts = ((noisy - labels) % classes)[noisy != labels]
    freq = torch.bincount(shifts, minlength=classes)[1:].float() / len(shifts)
    assert torch.allclose(freq, torch.full_like(freq, 1 / (classes - 1)), atol=0.01)
    # the replace-by-uniform-over-all parameter says the same
    p = replace_probability(eps, classes)
    assert 1 - p + p / classes == pytest.approx(q)


@pytest.mark.parametrize(("eps", "classes"), [(1.3, 10), (0.5, 2), (3.0, 4)])
def test_the_label_release_spends_exactly_its_epsilon(eps, classes):
    shape = label_release(1, eps, classes, 0).shape()
    for delta in (1e-5, 1e-9):
        assert epsilon({shape: 1}, delta, "pld") == pytest.approx(eps, rel=1e-3)
        rdp = epsilon({shape: 1}, delta, "rdp")  # RDP's conversion to (eps, delta) is an upper bound
        assert eps * (1 - 1e-6) <= rdp <= eps + 0.02


def test_most_sends_counts_the_worst_sample_per_client_over_its_rows():
    clients = np.array([0, 1, 0])  # client 0 drawn twice
    sent = np.array([[3, 4, -1], [7, 7, 7], [3, 5, -1]])
    assert most_sends(clients, sent) == {0: 2, 1: 3}
    assert most_sends(np.array([2]), np.array([[-1, -1]])) == {}


def config(**changes) -> RunConfig:
    raw = {
        "rounds": 3,
        "data": {"name": "synthetic", "num_classes": 4},
        "model": {"name": "mlp", "cut": 1},
        "algorithm": {"name": "splitfed_v2", "batch_size": 10, "local_epochs": 2},
        "privacy": {"cut": {"clip": 2.0}},
    }
    for key, value in changes.items():
        raw[key] = {**raw[key], **value}
    return RunConfig.model_validate(raw)


def test_plan_cut_plans_every_round_for_every_client_at_the_configured_or_calibrated_multiplier():
    plan = plan_cut(config(), [40, 40, 0], 1.5)
    assert len(plan) == 3 * 2  # rounds x clients with data
    assert {r.count for r in plan} == {2} and {r.noise_multiplier for r in plan} == {1.5}
    assert {r.clip for r in plan} == {2.0} and {r.kind for r in plan} == {"smashed"}
    fixed = plan_cut(config(privacy={"cut": {"noise_multiplier": 1.0}}), [40], 1.5)
    assert len(fixed) == 3 and {r.noise_multiplier for r in fixed} == {1.0}
    assert plan_cut(config(privacy={"cut": None, "labels": {"epsilon": 1.0}}), [40], 1.5) == []


def test_planned_sends_follow_the_upload_schedule():
    assert planned_sends(config(), 40) == 2  # two epochs: each sample twice
    steps = config(algorithm={"local_epochs": 1, "local_steps": 9})
    assert planned_sends(steps, 40) == 3  # 9 batches of 10 from 40 samples: three passes
    cse = config(algorithm={"name": "cse_fsl", "h": 8})
    assert planned_sends(cse, 40) == 1  # 8 batches, one upload
    dropped = config(algorithm={"local_epochs": 1, "local_steps": 6, "drop_last": True})
    assert planned_sends(dropped, 25) == 3  # 2 full batches of 10 an epoch: 6 steps are three passes
    assert planned_sends(dropped, 9) == 0  # no full batch: the client idles
    drawn = config(algorithm={"participation": "with_replacement", "clients_per_round": 3})
    assert planned_sends(drawn, 40) == 2 * 3  # up to three independent draws of one client
    merged = config(
        algorithm={"participation": "with_replacement", "clients_per_round": 3, "duplicates": "merge"}
    )
    assert planned_sends(merged, 40) == 2


def test_plan_labels_releases_one_label_per_client():
    plan = plan_labels(config(privacy={"labels": {"epsilon": 2.0}}), [40, 40], 1.0)
    assert [r.clients for r in plan] == [(0,), (1,)] and {r.buckets for r in plan} == {4}
    assert epsilon({plan[0].shape(): 1}, 1e-5, "pld") == pytest.approx(2.0, rel=1e-3)
    assert plan_labels(config(), [40], 1.0) == []


def test_plan_cut_calibrates_to_the_target():
    cfg = config()
    found = calibrated([plan_cut], cfg, [40, 40], 4.0)
    assert worst_epsilon(plan_cut(cfg, [40, 40], found), cfg, 2) == pytest.approx(4.0, rel=1e-2)
