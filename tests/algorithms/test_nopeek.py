"""NoPeek (``algorithm.nopeek``): off, it changes no number; on, both executors agree and a large weight
lowers the distance correlation between a client's inputs and its smashed data; the client steps that
do not carry the term refuse it in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from cases import check_outcome, invoke, split_case, trained_rounds

import fedge
from fedge.algorithms.split.parts import composed
from fedge.engine.bind import call_at
from fedge.engine.distance_correlation import distance_correlation
from fedge.engine.split import prefixed
from fedge.errors import ConfigError
from fedge.runner.loop import build_run

UNEVEN = {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 12}  # short and padded batches


def case(out: Path, algorithm: str, privacy: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """A small split run (:func:`cases.split_case`) on clients of unequal sizes."""
    config = split_case(out, algorithm, privacy, **options)
    config["partition"] = UNEVEN
    return config


def state(built) -> dict[str, torch.Tensor]:
    """The composed model (trunk + server) and any aux head."""
    algorithm = built.algorithm
    aux = {k: v for k, v in algorithm.client["params"].items() if k.startswith("aux.")}
    return {**composed(algorithm.client["params"], algorithm.server.params), **aux}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize(("algorithm", "options"), [("splitfed_v2", {}), ("cse_fsl", {"h": 2})])
def test_nopeek_zero_changes_no_number(tmp_path, algorithm, options, executor):
    plain, plain_metrics = trained_rounds(case(tmp_path, algorithm, **options), executor=executor)
    zero, zero_metrics = trained_rounds(case(tmp_path, algorithm, nopeek=0.0, **options), executor=executor)
    assert max_diff(state(plain), state(zero)) == 0.0
    assert [m.row() for m in plain_metrics] == [m.row() for m in zero_metrics]
    assert plain.algorithm.evaluate() == zero.algorithm.evaluate()


ON = {
    "splitfed_v2": ("splitfed_v2", {}, None),
    "splitfed_v1-cut-clip": ("splitfed_v1", {}, {"cut": {"clip": 1.0, "noise_multiplier": 0.5}}),
    "cse_fsl": ("cse_fsl", {"h": 2}, None),
    "fsl_an-cut-clip": ("fsl_an", {}, {"cut": {"clip": 1.0, "noise_multiplier": 0.5}}),
    "cse_fsl-server-backprop": (
        "cse_fsl",
        {"server_trigger": "every_l_rounds", "zb_step": "server_backprop", "local_steps": 3},
        None,
    ),
}


@pytest.mark.parametrize("name", list(ON), ids=list(ON))
def test_both_executors_agree_with_nopeek_on(tmp_path, name):
    algorithm, options, privacy = ON[name]
    raw = case(tmp_path, algorithm, privacy, nopeek=1.0, **options)
    (seq, seq_metrics), (bat, bat_metrics) = (
        trained_rounds(raw, rounds=3, executor=executor) for executor in ("sequential", "batched")
    )
    plain, _ = trained_rounds(case(tmp_path, algorithm, privacy, **options), rounds=3)
    assert max_diff(state(seq), state(plain)) > 1e-3  # the term moved the client models
    assert max_diff(state(seq), state(bat)) < 1e-5
    assert seq.context.ledger.totals() == bat.context.ledger.totals()
    for a, b in zip(seq_metrics, bat_metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)


def digits(algorithm: dict[str, Any], nopeek: float) -> dict[str, Any]:
    """Digits on 4 iid clients, an MLP 64-32 cut after its first layer (64 smashed values per sample)."""
    return {
        "seed": 0,
        "rounds": 3,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 4},
        "model": {"name": "mlp", "cut": 1, "options": {"hidden": [64, 32]}},
        "algorithm": {"batch_size": 16, "optimizer": {"lr": 0.05}, "nopeek": nopeek, **algorithm},
        "output": {"plots": False},
    }


def held_out_dcor(built) -> float:
    """DCor between 256 test images and the trained client model's smashed data of them."""
    algorithm, x = built.algorithm, built.context.data.x_test[:256]
    with torch.no_grad():
        z = call_at(algorithm.parts.trunk, prefixed(algorithm.client["params"], "trunk."), (x,))
    return float(distance_correlation(x, z, torch.ones(len(x))))


@pytest.mark.parametrize("algorithm", [{"name": "splitfed_v2"}, {"name": "cse_fsl", "h": 2}])
def test_a_large_weight_lowers_the_distance_correlation_at_the_cut(algorithm):
    """Measured: SplitFed v2 0.94 -> 0.72, CSE-FSL 0.95 -> 0.68 after 3 rounds at alpha 5."""
    plain, _ = trained_rounds(digits(algorithm, 0.0), rounds=3)
    private, _ = trained_rounds(digits(algorithm, 5.0), rounds=3)
    assert held_out_dcor(private) < held_out_dcor(plain) - 0.15


def test_fsl_sage_refuses_nopeek_in_one_line(tmp_path):
    raw = case(tmp_path / "out", "fsl_sage", nopeek=1.0, h=2)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(raw))
    outcome = invoke(["run", str(path), "-q"])
    assert check_outcome(outcome, tmp_path / "out") == "refused"
    assert outcome.lines[0].startswith("error: algorithm.nopeek: ")


def test_lightweight_fedsl_has_no_such_key(tmp_path):
    raw = case(tmp_path / "out", "light_fedsl")
    raw["algorithm"]["nopeek"] = 1.0
    path = tmp_path / "run.json"
    path.write_text(json.dumps(raw))
    outcome = invoke(["run", str(path), "-q"])
    assert check_outcome(outcome, tmp_path / "out") == "refused"
    assert "nopeek" in outcome.lines[0]


def test_dp_sgd_with_nopeek_is_refused(tmp_path):
    raw = case(tmp_path, "splitfed_v2", {"sample": {"clip": 1.0, "noise_multiplier": 1.0}}, nopeek=1.0)
    with pytest.raises(ConfigError, match=r"algorithm\.nopeek: .*privacy\.sample"):
        build_run(fedge.resolve_config(raw))


@pytest.mark.ci
def test_token_ids_are_refused(tmp_path):
    """A language model's inputs are token ids, between which a distance means nothing."""
    pytest.importorskip("transformers")
    from llm_cases import lm_config, write_corpus

    raw = lm_config(write_corpus(tmp_path), {"name": "splitfed_v2", "nopeek": 1.0})
    with pytest.raises(ConfigError, match=r"algorithm\.nopeek: needs real-valued inputs"):
        build_run(fedge.resolve_config(raw))
