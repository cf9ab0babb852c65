"""Privacy in lightweight FedSL and FedSL (privacy.cut, privacy.labels, privacy.sample): the non-private
run recovered, both executors with noise, what the server receives, DP-SGD on the unpruned weights, the
releases (one epoch's at its first round) as planned and accounted, calibration, the stop rule, a resume
and the refusals."""

from __future__ import annotations

import copy
import math
from typing import Any

import dp_accounting as dpa
import pytest
import torch
from cases import split_case as run_config
from cases import trained_rounds, whole_and_resumed
from opacus.accountants.analysis import rdp as opacus_rdp

import fedge
from fedge.algorithms.split.fedsl_privacy import make_masked_private_gradient
from fedge.algorithms.split.light_fedsl import FedSLRounds
from fedge.engine.split import make_forward
from fedge.errors import ConfigError
from fedge.privacy.accountant import DEFAULT_ORDERS
from fedge.runner.loop import build_run
from fedge.runner.privacy import PLANNERS, planned

CUT = {"clip": 1.0, "noise_multiplier": 1.0, "gradient_clip": 0.05, "gradient_noise_multiplier": 0.8}
SAMPLE = {"clip": 0.5, "noise_multiplier": 1.0}
ALL = {"cut": CUT, "sample": SAMPLE, "labels": {"epsilon": 1.0}}
ALGORITHMS = ["light_fedsl", "fedsl"]
EPOCH = 4  # 60 samples a client in batches of 16: an epoch is four rounds


def trained(raw: dict[str, Any], rounds: int = 3, executor: str = "sequential"):
    """The built run after ``rounds`` rounds and its fingerprint: the losses and the held-out loss."""
    built, metrics = trained_rounds(raw, rounds, executor)
    return built, [m["train_loss"] for m in metrics] + [float(built.algorithm.evaluate()["loss"])]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_zero_noise_and_a_huge_clip_train_as_without_privacy(tmp_path, algorithm):
    """At the cut bit for bit (a 1e9 bound scales by exactly 1); DP-SGD's per-sample sum to rounding."""
    _, plain = trained(run_config(tmp_path, algorithm))
    cut = {"clip": 1e9, "noise_multiplier": 0.0, "gradient_clip": 1e9, "gradient_noise_multiplier": 0.0}
    assert trained(run_config(tmp_path, algorithm, {"cut": cut}))[1] == plain
    exact = {"cut": cut, "sample": {"clip": 1e9, "noise_multiplier": 0.0}}
    assert trained(run_config(tmp_path, algorithm, exact))[1] == pytest.approx(plain, abs=1e-6)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_both_executors_agree_with_the_noise_on_and_the_noise_changes_the_run(tmp_path, algorithm):
    raw = run_config(tmp_path, algorithm, ALL)
    (seq, m1), (bat, m2) = (trained(raw, executor=ex) for ex in ("sequential", "batched"))
    assert m1 == pytest.approx(m2, abs=1e-5)
    assert seq.context.privacy.ledger.releases == bat.context.privacy.ledger.releases
    _, plain = trained(run_config(tmp_path, algorithm))
    _, cut_only = trained(run_config(tmp_path, algorithm, {"cut": CUT}))
    assert abs(m1[-1] - plain[-1]) > 1e-4 and abs(m1[-1] - cut_only[-1]) > 1e-4  # each noise acts


def test_the_server_receives_clipped_noisy_kept_entries_and_randomized_labels(tmp_path, monkeypatch):
    """The clip acts on the dropped activations, so each sent sample's norm is at most the clip; the
    dropped entries stay exactly zero with the noise on; the labels are the run's randomized ones."""
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    original = FedSLRounds.server_side

    def spy(self, t, dropped, y, own, keep, keys, **recorded):
        seen.append((dropped.clone(), y.clone(), own.clone(), keep.clone()))
        return original(self, t, dropped, y, own, keep, keys, **recorded)

    monkeypatch.setattr(FedSLRounds, "server_side", spy)
    clip = 0.25
    trained(run_config(tmp_path, "light_fedsl", {"cut": {"clip": clip, "noise_multiplier": 0.0}}))
    for z, _, own, keep in seen:
        for r, c in enumerate(own.tolist()):
            norms = torch.linalg.vector_norm(z[r, :c].flatten(1), dim=-1)
            assert norms.max() <= clip * (1 + 1e-5) and norms.min() == pytest.approx(clip, rel=1e-4)
        assert bool((keep == 0).any()) and torch.equal(z[keep == 0], torch.zeros_like(z[keep == 0]))
    seen.clear()
    noisy = {"cut": {"clip": clip, "noise_multiplier": 2.0}, "labels": {"epsilon": 0.5}}
    built, _ = trained(run_config(tmp_path, "light_fedsl", noisy), rounds=1)
    z, y, own, keep = seen[0]
    assert torch.equal(z[keep == 0], torch.zeros_like(z[keep == 0]))
    sent = z[keep > 0]
    assert float(sent.std()) == pytest.approx(2.0 * clip, rel=0.15)  # the noise dominates the clipped data
    algorithm = built.algorithm
    index, _ = algorithm.batches(1)
    assert torch.equal(y, algorithm.sent_labels[index])
    assert not torch.equal(algorithm.sent_labels, built.context.data.y_train)


def test_the_masked_dp_sgd_gradient_is_a_hand_loop_over_the_kept_weights(tmp_path):
    """Each sample's trunk gradient through n times its cut gradient, the pruned weights dropped, clipped
    over the kept ones, averaged: as one sample at a time; the pruned weights get no noise."""
    built = build_run(fedge.resolve_config(run_config(tmp_path, "light_fedsl", {"sample": SAMPLE})))
    parts, data = built.algorithm.parts, built.context.data
    params = {k: v[0].clone() for k, v in built.algorithm.clients["params"].items()}
    x = data.x_train[:12]
    n, clip = len(x), 0.05
    grad_z = torch.randn(parts.trunk(x).shape, generator=torch.Generator().manual_seed(0)) / n
    name = next(k for k in params if k.endswith("weight"))
    keeps = {name: (torch.rand(params[name].shape, generator=torch.Generator().manual_seed(1)) > 0.4).float()}
    params[name] = params[name] * keeps[name]
    fn = make_masked_private_gradient(make_forward(parts.trunk), clip)
    zeros = {k: torch.zeros_like(v) for k, v in params.items()}
    got = fn(zeros, params, {}, zeros, keeps, x, grad_z, torch.ones(n)).state[0]
    model = copy.deepcopy(parts.trunk)
    model.load_state_dict({k[len("trunk.") :]: v for k, v in params.items()})
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in range(n):
        model.zero_grad()
        (model(x[i : i + 1]) * grad_z[i : i + 1] * n).sum().backward()
        g = {f"trunk.{k}": p.grad.clone() for k, p in model.named_parameters()}
        g[name] = g[name] * keeps[name]
        norm = math.sqrt(sum(float(v.double().square().sum()) for v in g.values()))
        assert norm > clip  # every sample is clipped
        for k, v in g.items():
            total[k] += v * min(1.0, clip / norm)
    for k in params:
        assert torch.allclose(got[k], total[k] / n, atol=1e-7)
    noise = {k: torch.ones_like(v) * keeps.get(k, 1.0) for k, v in params.items()}
    only_noise = fn(zeros, params, {}, noise, keeps, x, torch.zeros_like(grad_z), torch.ones(n)).state[0]
    assert torch.equal(only_noise[name], keeps[name] / n)


def test_pruned_weights_stay_zero_under_dp_sgd_and_its_noise(tmp_path):
    raw = run_config(tmp_path, "light_fedsl", {"sample": {"clip": 0.5, "noise_multiplier": 3.0}, "cut": CUT},
                     final_sparsity=0.5, agg_interval=2)  # fmt: skip
    built, _ = trained(raw, rounds=5)
    clients = built.algorithm.clients
    pruned = 0
    for name, mask in clients["masks"].items():
        assert torch.equal(clients["params"][name][~mask], torch.zeros_like(clients["params"][name][~mask]))
        pruned += int((~mask).sum())
    assert pruned > 0


def sample_epsilon_by_hand(releases, client: int, delta: float) -> tuple[float, float]:
    """A client's sample-level epsilon from its releases straight through dp-accounting's RDP accountant,
    and through Opacus's RDP analysis (its own code, the same orders)."""
    accountant = dpa.rdp.RdpAccountant(list(DEFAULT_ORDERS))
    curve = 0.0
    for r in releases:
        if r.unit == "sample" and r.clients == (client,):
            accountant.compose(dpa.GaussianDpEvent(r.noise_multiplier), r.count)
            curve = curve + opacus_rdp.compute_rdp(
                q=1.0, noise_multiplier=r.noise_multiplier, steps=r.count, orders=list(DEFAULT_ORDERS)
            )
    theirs, _ = opacus_rdp.get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=curve, delta=delta)
    return float(accountant.get_epsilon(delta)), float(theirs)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_epoch_is_released_once_at_its_first_round_as_planned(tmp_path, algorithm):
    """Six rounds of four-round epochs: every client's sends, returned gradients and DP-SGD uses are one
    per sample at rounds 1 and 5; the planner foresees exactly these; the epsilon is dp-accounting's
    composition of them and Opacus's RDP analysis agrees."""
    built, _ = trained({**run_config(tmp_path, algorithm, ALL), "rounds": 6}, rounds=6)
    ledger = built.context.privacy.ledger
    recorded = ledger.releases
    by_kind = {}
    for r in recorded:
        by_kind.setdefault(r.kind, set()).add((r.round, r.clients[0], r.count))
    epochs = {(t, c, 1) for t in (1, 1 + EPOCH) for c in range(4)}
    assert by_kind == {
        "smashed": epochs, "cut_gradient": epochs, "gradient": epochs, "label": {(1, c, 1) for c in range(4)}
    }  # fmt: skip
    config, sizes = built.context.config, [int(s) for s in built.context.data.client_sizes()]
    assert sorted(planned(PLANNERS, config, sizes, 1.0), key=repr) == sorted(recorded, key=repr)
    ours = ledger.summary()["epsilon_by_unit"]["sample"]
    direct, opacus = sample_epsilon_by_hand(recorded, 0, ledger.delta)
    assert ours == pytest.approx(direct, rel=1e-12)
    assert ours == pytest.approx(opacus, rel=0.05)  # conversions differ (Balle et al. 2020 vs Mironov)
    assert ledger.summary()["epsilon_by_unit"]["label"] == pytest.approx(1.0, abs=0.02)


def test_target_epsilon_calibrates_every_unset_multiplier(tmp_path):
    privacy = {"target_epsilon": 8.0, "cut": {"clip": 1.0}, "sample": {"clip": 0.5}}
    raw = {**run_config(tmp_path, "light_fedsl", privacy), "rounds": 6}
    result = fedge.run(raw)
    assert result.summary["epsilon"] == pytest.approx(8.0, rel=1e-3)
    assert {r["epsilon"] for r in result.metrics[:EPOCH]} == {result.metrics[0]["epsilon"]}  # one epoch
    assert result.metrics[-1]["epsilon"] > result.metrics[0]["epsilon"]


def test_max_epsilon_stops_before_the_round_that_opens_an_epoch_past_it(tmp_path):
    """One epoch fits the budget, two do not: the run stops after round 4, the last of the first epoch
    (not after round 1, whose next round releases nothing)."""
    privacy = {"cut": {"clip": 1.0, "noise_multiplier": 1.0}, "sample": SAMPLE}
    one = fedge.run(run_config(tmp_path / "one", "light_fedsl", privacy), ["rounds=1"]).summary["epsilon"]
    raw = {**run_config(tmp_path, "light_fedsl", privacy), "rounds": 8, "stop": {"max_epsilon": 1.2 * one}}
    result = fedge.run(raw)
    assert result.summary["stopped_by"] == "max_epsilon" and result.summary["rounds"] == EPOCH
    assert result.summary["epsilon"] == pytest.approx(one)
    raw["stop"] = {"max_epsilon": one / 2}
    raw["output"] = {**raw["output"], "dir": str(tmp_path / "refused")}
    with pytest.raises(ConfigError, match=r"stop\.max_epsilon"):
        fedge.run(raw)


def test_a_resumed_run_adds_the_same_noise_and_spends_the_same(tmp_path):
    whole, resumed = whole_and_resumed(lambda out: run_config(out, "light_fedsl", ALL), tmp_path, 6, 5)
    assert resumed.summary["privacy"] == whole.summary["privacy"]
    assert resumed.metrics[-1]["train_loss"] == whole.metrics[-1]["train_loss"]


VGG = {"name": "vgg", "cut": 2, "options": {"depth": 11, "width": 0.125}}


@pytest.mark.parametrize(
    ("privacy", "model", "key"),
    [
        ({"sample": SAMPLE}, VGG, r"privacy\.sample: .* without BatchNorm"),
        ({"cut": {"clip": 1.0}}, None, r"privacy\.cut\.noise_multiplier"),
        ({"sample": {"clip": 1.0}, "cut": CUT}, None, r"privacy\.sample\.noise_multiplier"),
        ({"target_epsilon": 4.0, "sample": {"clip": 1.0}}, None, r"privacy\.target_epsilon: smashed data"),
    ],
)
def test_refusals_name_the_key(tmp_path, privacy, model, key):
    raw = run_config(tmp_path, "light_fedsl", privacy)
    if model is not None:
        raw["model"], raw["data"]["shape"] = model, [3, 32, 32]
    with pytest.raises(ConfigError, match=key):
        trained(raw, rounds=1)


def test_a_deployed_run_refuses_the_mechanisms(tmp_path):
    pytest.importorskip("flwr")
    from fedge.deploy.fedsl_rounds import DeployedLightFedSL

    for block, value in ALL.items():
        cfg = fedge.resolve_config(run_config(tmp_path, "light_fedsl", {block: value}))
        algorithm = DeployedLightFedSL(build_run(cfg).context, cfg.algorithm)
        with pytest.raises(ConfigError, match=rf"privacy\.{block}"):
            algorithm.check_deployable()


def test_the_trunk_with_dropout_layers_is_refused_for_dp_sgd(tmp_path):
    raw = run_config(tmp_path, "fedsl", {"sample": SAMPLE})
    raw["model"] = {"name": "fcnn", "cut": 1, "options": {"dropout": 0.2}}
    with pytest.raises(ConfigError, match=r"privacy\.sample: .* without dropout"):
        trained(raw, rounds=1)
