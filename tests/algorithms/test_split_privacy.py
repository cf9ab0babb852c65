"""Privacy at split learning's cut through whole runs: smashed-data and cut-gradient noise, label
randomized response, both executors, and the releases on the ledger counted exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cases import invoke, whole_and_resumed
from cases import split_case as split
from cases import trained_rounds as trained
from llm_cases import lm_config, needs_llm, write_corpus

import fedge
from fedge.algorithms.split.exchange import ServerExchange
from fedge.errors import ConfigError
from fedge.privacy import epsilon
from fedge.runner.loop import build_run
from fedge.runner.privacy import PLANNERS, planned

NOISY = {"clip": 1.0, "noise_multiplier": 0.6, "gradient_clip": 0.05, "gradient_noise_multiplier": 0.8}


def fingerprint(built, metrics) -> tuple[list[float], float]:
    return [m["train_loss"] for m in metrics], float(built.algorithm.evaluate()["loss"])


@pytest.mark.parametrize("algorithm", ["splitfed_v2", "splitfed_v1", "cse_fsl"])
def test_zero_noise_and_a_huge_clip_train_exactly_as_without_privacy(tmp_path, algorithm):
    """A 1e9 bound scales every sample by exactly 1 and zero noise adds nothing: bit-for-bit the same
    losses and model (not merely within rounding)."""
    options = {"h": 2} if algorithm == "cse_fsl" else {}
    plain = fingerprint(*trained(split(tmp_path, algorithm, **options)))
    cut = {"clip": 1e9, "noise_multiplier": 0.0, "gradient_clip": 1e9, "gradient_noise_multiplier": 0.0}
    private = fingerprint(*trained(split(tmp_path, algorithm, {"cut": cut}, **options)))
    assert private == plain


@pytest.mark.parametrize(
    "algorithm", ["splitfed_v2", "splitfed_v1", "fsl_an", "cse_fsl", "fsl_sage", "cse_fsl_async"]
)
def test_both_executors_agree_with_noise_on(tmp_path, algorithm):
    options = {"h": 2} if algorithm in ("cse_fsl", "fsl_sage", "cse_fsl_async") else {}
    raw = split(tmp_path, algorithm, {"cut": NOISY, "labels": {"epsilon": 1.0}}, **options)
    (seq, seq_metrics), (bat, bat_metrics) = (trained(raw, executor=ex) for ex in ("sequential", "batched"))
    plain = fingerprint(*trained(split(tmp_path, algorithm, **options)))
    losses, held_out = fingerprint(seq, seq_metrics)
    assert losses == pytest.approx(fingerprint(bat, bat_metrics)[0], abs=1e-5)
    assert held_out == pytest.approx(fingerprint(bat, bat_metrics)[1], abs=1e-5)
    assert held_out != plain[1]  # the noise changed the training
    assert seq.context.privacy.ledger.releases == bat.context.privacy.ledger.releases


def test_the_server_receives_clipped_noisy_smashed_data_and_randomized_labels(tmp_path, monkeypatch):
    received: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    original = ServerExchange._upload

    def spy(self, rnd, cohort, senders, batch, lengths):
        received.append((rnd.t, batch.z.clone(), batch.y.clone(), batch.counts.clone()))
        return original(self, rnd, cohort, senders, batch, lengths)

    monkeypatch.setattr(ServerExchange, "_upload", spy)
    clip = 0.25
    built, _ = trained(split(tmp_path, "splitfed_v2", {"cut": {"clip": clip, "noise_multiplier": 0.0}}))
    for _, z, _, counts in received:
        for r, c in enumerate(counts.tolist()):
            norms = torch.linalg.vector_norm(z[r, :c].flatten(1), dim=-1)
            assert norms.max() <= clip * (1 + 1e-5)
            assert norms.min() == pytest.approx(clip, rel=1e-4)  # this model's activations exceed 0.25
    received.clear()
    noisy = split(
        tmp_path, "splitfed_v2", {"cut": {"clip": clip, "noise_multiplier": 2.0}, "labels": {"epsilon": 0.5}}
    )
    built, _ = trained(noisy)
    zs = torch.cat([z[r, :c] for _, z, _, counts in received for r, c in enumerate(counts.tolist())])
    assert float(zs.flatten(1).norm(dim=1).mean()) > 5 * clip  # noise of std 0.5 in each of 16 coordinates
    labels = torch.cat([y[r, :c] for _, _, y, counts in received for r, c in enumerate(counts.tolist())])
    data = built.context.data
    table = built.algorithm.local_steps.sent_labels
    kept = float((table == data.y_train).float().mean())
    q = np.exp(0.5) / (np.exp(0.5) + data.num_classes - 1)
    assert abs(kept - q) < 4 * np.sqrt(q * (1 - q) / len(table))
    assert set(labels.unique().tolist()) <= set(range(data.num_classes))
    assert not torch.equal(table, data.y_train) and table.dtype == data.y_train.dtype


def test_the_noisy_labels_are_drawn_once_for_the_whole_run(tmp_path, monkeypatch):
    """Every epoch sends a sample's same randomized label: one release per sample, not one per epoch."""
    seen: dict[tuple[int, int], set[int]] = {}
    from fedge.algorithms.split import steps

    original = steps.LocalSteps._step

    def spy(self, rnd, run, state, s, counts):
        for r in range(run.index.shape[0]):
            for i in run.index[r, s][run.weight[r, s] > 0].tolist():
                seen.setdefault((int(rnd.draws.clients[int(run.row_ids[r])]), i), set()).add(
                    int(self.sent_labels[i])
                )
        return original(self, rnd, run, state, s, counts)

    monkeypatch.setattr(steps.LocalSteps, "_step", spy)
    raw = split(tmp_path, "splitfed_v2", {"labels": {"epsilon": 0.2}}, local_epochs=2)
    built, _ = trained(raw, rounds=2)
    assert seen and all(len(values) == 1 for values in seen.values())
    labels = [r for r in built.context.privacy.ledger.releases if r.kind == "label"]
    assert sorted(r.clients for r in labels) == [(0,), (1,), (2,), (3,)] and {r.round for r in labels} == {1}
    assert epsilon({labels[0].shape(): 1}, 1e-5, "pld") == pytest.approx(0.2, rel=1e-3)


def smashed_counts(built) -> dict[tuple[int, int], int]:
    return {
        (r.round, r.clients[0]): r.count for r in built.context.privacy.ledger.releases if r.kind == "smashed"
    }


def test_the_ledger_counts_each_samples_sends_from_the_batch_plan(tmp_path):
    """SplitFed v2, two local epochs: every sample crosses the cut twice a round, its cut gradient comes
    back twice; 60 samples a client, batches of 16."""
    built, _ = trained(split(tmp_path, "splitfed_v2", {"cut": NOISY}, local_epochs=2))
    releases = built.context.privacy.ledger.releases
    assert smashed_counts(built) == {(t, c): 2 for t in (1, 2) for c in range(4)}
    gradients = {(r.round, r.clients[0]): r.count for r in releases if r.kind == "cut_gradient"}
    assert gradients == smashed_counts(built)
    assert {r.noise_multiplier for r in releases if r.kind == "cut_gradient"} == {0.8}
    assert not [r for r in releases if r.kind == "label"]  # labels in clear: no label guarantee recorded
    config, sizes = built.context.config, [int(s) for s in built.context.data.client_sizes()]
    assert sorted(planned(PLANNERS, config, sizes, 1.0), key=repr) == sorted(releases, key=repr)


def test_cse_fsl_releases_fewer_smashed_data_sends_than_splitfed(tmp_path):
    """Two epochs of 4 batches: SplitFed v2 sends every sample twice a round; CSE-FSL with h = 8 uploads
    one batch a round, so no sample crosses more than once: fewer sends, a smaller sample epsilon."""
    cut = {"cut": {"clip": 1.0, "noise_multiplier": 1.0}}
    v2, _ = trained(split(tmp_path, "splitfed_v2", cut, local_epochs=2))
    cse, _ = trained(split(tmp_path, "cse_fsl", cut, local_epochs=2, h=8))
    assert set(smashed_counts(cse).values()) == {1} and set(smashed_counts(v2).values()) == {2}
    summary = {name: b.context.privacy.ledger.summary() for name, b in (("v2", v2), ("cse", cse))}
    assert summary["cse"]["releases_by_kind"]["smashed"] < summary["v2"]["releases_by_kind"]["smashed"]
    assert summary["cse"]["epsilon_by_unit"]["sample"] < summary["v2"]["epsilon_by_unit"]["sample"]


def test_cse_fsl_counts_the_every_l_rounds_server_batch(tmp_path):
    raw = split(
        tmp_path, "cse_fsl", {"cut": NOISY}, server_trigger="every_l_rounds", zb_step="server_backprop"
    )
    built, _ = trained(raw, rounds=2)  # round 2 is a server round: one fresh batch a client
    releases = built.context.privacy.ledger.releases
    assert smashed_counts(built) == {(2, c): 1 for c in range(4)}
    assert {(r.round, r.clients[0]) for r in releases if r.kind == "cut_gradient"} == {
        (2, c) for c in range(4)
    }


def test_the_run_reports_the_cut_epsilon_and_runs_from_the_cli(tmp_path):
    raw = split(
        tmp_path, "splitfed_v2", {"cut": {"clip": 1.0, "noise_multiplier": 1.0}, "labels": {"epsilon": 1.0}}
    )
    result = fedge.run(raw)
    privacy = result.summary["privacy"]
    assert set(privacy["epsilon_by_unit"]) == {"sample", "label"}
    assert privacy["epsilon_by_unit"]["label"] == pytest.approx(1.0, abs=0.02)
    assert result.metrics[-1]["epsilon_sample"] > result.metrics[0]["epsilon_sample"]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps({**raw, "output": {**raw["output"], "name": "cli"}}))
    outcome = invoke(["run", str(path), "privacy.cut.noise_multiplier=2.0", "-q"])
    assert outcome.code == 0, outcome.output
    summary = json.loads(next(tmp_path.glob("cli*/summary.json")).read_text())
    assert summary["privacy"]["epsilon_by_unit"]["sample"] < privacy["epsilon_by_unit"]["sample"]


def test_an_unset_multiplier_without_a_target_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="privacy.cut.noise_multiplier"):
        trained(split(tmp_path, "splitfed_v2", {"cut": {"clip": 1.0}}))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@needs_llm
@pytest.mark.ci
def test_an_lm_split_with_lora_noises_each_sequences_hidden_state(corpus, monkeypatch):
    """GPT-2 with LoRA split after one block: each sequence's whole [T, d] hidden state is clipped; both
    executors agree with the noise on; labels (next tokens) refuse randomized response."""
    received: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = ServerExchange._upload

    def spy(self, rnd, cohort, senders, batch, lengths):
        received.append((batch.z.clone(), batch.counts.clone()))
        return original(self, rnd, cohort, senders, batch, lengths)

    monkeypatch.setattr(ServerExchange, "_upload", spy)
    clipped = lm_config(
        corpus, {"name": "splitfed_v2"}, privacy={"cut": {"clip": 0.5, "noise_multiplier": 0.0}}
    )
    trained(clipped, rounds=1)
    for z, counts in received:
        for r, c in enumerate(counts.tolist()):
            assert torch.linalg.vector_norm(z[r, :c].flatten(1), dim=-1).max() <= 0.5 * (1 + 1e-5)
    monkeypatch.undo()
    noisy = lm_config(
        corpus, {"name": "splitfed_v2"}, privacy={"cut": {"clip": 0.5, "noise_multiplier": 0.3}}
    )
    (seq, m1), (bat, m2) = (trained(noisy, executor=ex) for ex in ("sequential", "batched"))
    assert [m["train_loss"] for m in m1] == pytest.approx([m["train_loss"] for m in m2], abs=1e-5)
    assert smashed_counts(seq) == smashed_counts(bat) and set(smashed_counts(seq).values()) == {1}
    with pytest.raises(ConfigError, match="privacy.labels"):
        trained(lm_config(corpus, {"name": "splitfed_v2"}, privacy={"labels": {"epsilon": 1.0}}))


def test_a_deployed_split_run_refuses_the_cut_privacy(tmp_path):
    """A deployed node sends its smashed data and labels itself: without the noise there, refused."""
    pytest.importorskip("flwr")
    from fedge.deploy.split_rounds import DeployedCseFsl

    raw = split(tmp_path, "cse_fsl", {"cut": {"clip": 1.0, "noise_multiplier": 1.0}})
    cfg = fedge.resolve_config(raw)
    algorithm = DeployedCseFsl(build_run(cfg).context, cfg.algorithm)
    with pytest.raises(ConfigError, match=r"privacy\.cut"):
        algorithm.check_deployable()


def test_a_resumed_run_spends_what_the_uninterrupted_run_spends(tmp_path):
    """The label releases (once per client) and the per-round cut releases survive a resume exactly."""
    privacy = {"cut": {"clip": 1.0, "noise_multiplier": 1.0}, "labels": {"epsilon": 1.0}}
    whole, resumed = whole_and_resumed(lambda out: split(out, "cse_fsl", privacy, h=2), tmp_path, 3, 2)
    assert resumed.summary["privacy"] == whole.summary["privacy"]
    assert resumed.metrics[-1]["train_loss"] == whole.metrics[-1]["train_loss"]


def test_asynchronous_cse_fsl_records_every_dispatch(tmp_path):
    """Each dispatch's uploads are recorded in the round it is dispatched in: one epoch of 4 batches
    with h = 2 sends each uploaded sample once per dispatch, and every client is dispatched in round 1."""
    raw = split(tmp_path, "cse_fsl_async", {"cut": {"clip": 1.0, "noise_multiplier": 1.0}}, h=2)
    built, _ = trained(raw, rounds=3)
    releases = built.context.privacy.ledger.releases
    assert {r.kind for r in releases} == {"smashed"} and {r.count for r in releases} == {1}
    assert sorted(r.clients[0] for r in releases if r.round == 1) == [0, 1, 2, 3]
    assert {r.round for r in releases} <= {1, 2, 3}


def _distributed_helpers():
    """The two-rank launcher of tests/distributed (loaded by path: that folder is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "distributed" / "test_distributed.py"
    spec = importlib.util.spec_from_file_location("distributed_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.ci
@pytest.mark.parametrize("algorithm", ["splitfed_v2", "cse_fsl"])
def test_two_ranks_add_one_process_noise_and_record_its_releases(tmp_path, algorithm):
    helpers = _distributed_helpers()
    cfg = helpers.split_config(tmp_path, algorithm)
    cfg["privacy"] = {"cut": NOISY, "labels": {"epsilon": 1.0}}
    (tmp_path / "seen").mkdir()
    helpers.launch(2, [(cfg, "two")], tmp_path / "seen")
    fedge.run(cfg, ["output.name=one"])
    two, one = tmp_path / "runs" / "two", tmp_path / "runs" / "one"
    assert (two / "privacy.csv").read_text() == (one / "privacy.csv").read_text()
    assert np.abs(helpers.final_state(two) - helpers.final_state(one)).max() <= 1e-5
