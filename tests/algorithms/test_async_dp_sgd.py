"""DP-SGD (``privacy.sample``) in FedBuff, FedAsync and deadline FedAvg: a huge clip without noise trains
as the non-private run, both executors and a resumed run add the same noise, each job records its
releases, the planned bound calibrates ``privacy.target_epsilon`` and ``stop.max_epsilon`` stops the run
before the budget is crossed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from async_cases import HETEROGENEOUS, interrupted_and_resumed
from cases import tiny

import fedge
from fedge.algorithms.asynchronous.work import ANCHOR, ProximalLoss
from fedge.engine import classification_loss, parameters_of
from fedge.engine.private_step import Penalized
from fedge.errors import ConfigError
from fedge.files import results
from fedge.models import build_model
from fedge.privacy import Release, epsilon
from fedge.runner.loop import build_run

NOISY = {"clip": 0.5, "noise_multiplier": 1.0}
EXACT = {"clip": 1e9, "noise_multiplier": 0.0}
KNOBS: dict[str, dict[str, Any]] = {
    "fedbuff": {"buffer_size": 2},
    "fedasync": {"proximal_mu": 0.5},  # a pull large enough to matter: added outside the clipping
    "fedavg_deadline": {"deadline_s": 0.13, "late": "partial"},
}


def config(out: Path, algorithm: str, sample: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """Six clients of 40 samples in full batches of 10, half of them at work, on a mixed fleet."""
    raw = tiny(algorithm, out, rounds=4)
    raw["partition"]["num_clients"] = 6
    raw["algorithm"].update(fraction=0.5, batch_size=10, **KNOBS[algorithm])
    raw["system"] = HETEROGENEOUS
    if algorithm == "fedavg_deadline":  # slow clients finish part of their steps in time
        raw["system"] = {"devices": {"cpu_hz": [[1e9, 1e9], [1e6, 1e6]]}}
    raw["engine"] = {"threads": 1}
    if sample is not None:
        raw["privacy"] = {"sample": sample, **extra}
    return raw


def trained(raw: dict[str, Any], executor: str = "batched", rounds: int = 4):
    """The built run after ``rounds`` rounds, and their training losses."""
    built = build_run(fedge.resolve_config({**raw, "engine": {**raw["engine"], "executor": executor}}))
    losses = []
    for t in range(1, rounds + 1):
        built.context.start("train", t)
        losses.append(built.algorithm.run_round(t)["train_loss"])
    return built, losses


def model_of(built) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in built.algorithm.params.items()}


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedasync", "fedavg_deadline"])
def test_a_huge_clip_without_noise_trains_as_the_non_private_run(tmp_path, algorithm):
    plain, plain_losses = trained(config(tmp_path, algorithm))
    private, losses = trained(config(tmp_path, algorithm, EXACT))
    assert losses == pytest.approx(plain_losses, abs=1e-6)
    for k, v in model_of(plain).items():
        torch.testing.assert_close(model_of(private)[k], v, rtol=0, atol=1e-6)
    assert private.context.privacy.ledger.active


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedasync", "fedavg_deadline"])
def test_both_executors_agree_with_seeded_noise(tmp_path, algorithm):
    raw = config(tmp_path, algorithm, NOISY)
    (seq, seq_losses), (bat, bat_losses) = (trained(raw, ex) for ex in ("sequential", "batched"))
    assert seq_losses == pytest.approx(bat_losses, abs=1e-5)
    for k, v in model_of(seq).items():
        torch.testing.assert_close(model_of(bat)[k], v, rtol=0, atol=1e-5)
    assert seq.context.privacy.ledger.releases == bat.context.privacy.ledger.releases
    _, plain_losses = trained(config(tmp_path, algorithm))
    assert max(abs(a - b) for a, b in zip(bat_losses, plain_losses, strict=True)) > 1e-4  # the noise


def test_each_job_releases_its_epochs_once_per_round_and_client(tmp_path):
    raw = config(tmp_path, "fedbuff", NOISY)
    raw["algorithm"].update(local_epochs=3)
    built, _ = trained(raw, rounds=5)
    releases = built.context.privacy.ledger.releases
    assert len(releases) == built.algorithm.engine.next_seq  # one release per job dispatched
    assert {r.count for r in releases} == {3}  # 40 samples in 4 batches, 3 epochs: each sample 3 times
    per_round = [(r.round, r.clients) for r in releases]
    assert len(set(per_round)) == len(per_round)  # a client is dispatched at most once a round
    assert {r.round for r in releases} == set(range(1, 6))


def test_a_job_cut_short_releases_only_the_steps_it_ran(tmp_path):
    raw = config(tmp_path, "fedavg_deadline", NOISY)
    raw["algorithm"].update(local_epochs=2, batch_size=20)  # two steps an epoch, four a job
    raw["algorithm"]["deadline_s"] = 0.2
    built, _ = trained(raw)
    counts = [r.count for r in built.context.privacy.ledger.releases]
    assert 2 in counts and 1 in counts  # whole jobs use every sample twice; cut ones at most once


def test_the_summary_reports_the_epsilon_of_the_jobs_made(tmp_path):
    raw = config(tmp_path, "fedbuff", NOISY)
    raw["output"] = {**raw["output"], "name": "buff"}
    result = fedge.run(raw)
    built, _ = trained(raw)  # the same run, its ledger at hand
    jobs = [0] * 6
    for release in built.context.privacy.ledger.releases:
        jobs[release.clients[0]] += release.count
    shape = Release(1, "gradient", "sample", "gaussian", 1.0, 0.5).shape()
    assert result.summary["privacy"]["epsilon"] == pytest.approx(epsilon({shape: max(jobs)}, 1e-5))
    assert result.summary["epsilon"] == result.summary["privacy"]["epsilon"]
    assert result.summary["privacy"]["releases_by_kind"] == {"gradient": sum(jobs)}
    assert min(jobs) < max(jobs)  # the fast clients trained more jobs and spent more
    assert all("epsilon_next" in row for row in result.metrics)


def test_target_epsilon_calibrates_for_a_job_every_round(tmp_path):
    raw = config(tmp_path, "fedbuff", {"clip": 1.0}, target_epsilon=4.0)
    built, _ = trained(raw)
    multiplier = built.context.privacy.calibrated
    shape = Release(1, "gradient", "sample", "gaussian", multiplier, 1.0).shape()
    assert epsilon({shape: 4}, 1e-5) == pytest.approx(4.0, rel=1e-3)  # the plan: 4 rounds, one job each
    assert built.context.privacy.ledger.summary()["epsilon"] <= 4.0 * (1 + 1e-9)


def test_max_epsilon_stops_before_a_round_at_its_most_would_cross_it(tmp_path):
    shape = Release(1, "gradient", "sample", "gaussian", 1.0, 0.5).shape()
    budget = epsilon({shape: 3}, 1e-5) * 1.001  # three jobs of one epoch fit, four do not
    raw = config(tmp_path, "fedasync", NOISY)
    raw["rounds"], raw["stop"] = 12, {"max_epsilon": budget}
    raw["output"] = {**raw["output"], "name": "stop"}
    result = fedge.run(raw)
    assert result.summary["stopped_by"] == "max_epsilon"
    assert result.summary["privacy"]["epsilon"] <= budget
    assert result.metrics[-1]["epsilon_next"] > budget >= result.metrics[-2]["epsilon_next"]


def test_an_interrupted_private_run_resumes_with_the_same_noise_and_releases(tmp_path):
    raw = config(tmp_path / "ref", "fedbuff", NOISY)
    raw["rounds"], raw["output"] = 6, {**raw["output"], "name": "run", "checkpoint_every": 2}
    reference, saved, resumed = interrupted_and_resumed(raw, tmp_path, after=3)
    assert saved["engine"]["events"]  # jobs in flight, their releases already recorded
    ref = reference.run_dir / results.PRIVACY
    assert (resumed.run_dir / results.PRIVACY).read_bytes() == ref.read_bytes()
    assert resumed.summary["privacy"] == reference.summary["privacy"]


def test_the_proximal_pull_is_a_penalty_outside_the_clipping():
    model = build_model("mlp", (1, 6, 6), 4, hidden=(8,))
    params = parameters_of(model)
    loss = ProximalLoss(classification_loss(model), 0.5)
    assert isinstance(loss, Penalized)
    anchors = {ANCHOR + k: torch.zeros_like(v) for k, v in params.items()}
    x, y, w = torch.randn(3, 1, 6, 6), torch.randint(0, 4, (3,)), torch.ones(3)
    whole, _ = loss(params, anchors, x, y, w)
    data, new = loss.data(params, anchors, x, y, w)
    assert float(whole) == float(data + loss.penalty(params, anchors))
    assert set(anchors) <= set(new)


def test_an_unset_multiplier_without_a_target_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="privacy.sample.noise_multiplier"):
        build_run(fedge.resolve_config(config(tmp_path, "fedbuff", {"clip": 1.0})))


def test_a_budget_one_job_already_spends_is_refused_naming_the_key(tmp_path):
    raw = config(tmp_path, "fedbuff", NOISY)
    raw["stop"] = {"max_epsilon": 0.5}
    with pytest.raises(ConfigError, match="stop.max_epsilon"):
        build_run(fedge.resolve_config(raw))
