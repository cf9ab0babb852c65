"""output.record: what a run keeps of its transfers for the attacks, and that keeping it changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cases import invoke, killed_after, run_dirs, tiny

import fedge
from fedge.runner.transfers import recorded_rounds, round_path

CUT = ["smashed", "cut_gradients", "labels"]


def recorded(config: dict, kinds: list[str], **output) -> dict:
    config["output"].update(record=kinds, **output)
    return config


def without_wall(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in rows]


def test_recording_changes_no_number(tmp_path: Path) -> None:
    plain = fedge.run(tiny("splitfed_v2", tmp_path / "plain", rounds=3))
    kept = fedge.run(recorded(tiny("splitfed_v2", tmp_path / "kept", rounds=3), CUT))
    assert without_wall(kept.metrics) == without_wall(plain.metrics)
    assert kept.summary["recorded"]["rounds"] == 3 and "recorded" not in plain.summary


def test_a_round_keeps_a_bounded_sample_of_what_crossed_the_cut(tmp_path: Path) -> None:
    config = recorded(tiny("splitfed_v2", tmp_path, rounds=2), CUT, record_samples=50)
    config["algorithm"].update(batch_size=16)
    result = fedge.run(config)
    held = np.load(round_path(result.run_dir, 1))
    assert len(held["cut/sample"]) == 50  # 4 clients x 60 samples crossed: a sample of them is kept
    assert len(set(held["cut/client"].tolist())) > 1 and len(set(held["cut/step"].tolist())) > 1
    # no label privacy: the labels the server received are the true ones; gradients came back
    assert np.array_equal(held["cut/labels"], held["cut/true_label"])
    assert held["cut/cut_gradients"].shape == held["cut/smashed"].shape
    # step 0's smashed data is the broadcast trunk's output on the recorded input (fp32 codec)
    weight, bias = (torch.from_numpy(held[f"client_model/trunk.fc1.linear.{n}"]) for n in ("weight", "bias"))
    first = held["cut/step"] == 0
    x = torch.from_numpy(held["cut/input"][first]).flatten(1)
    expected = torch.relu(x @ weight.T + bias)
    assert torch.allclose(torch.from_numpy(held["cut/smashed"][first]), expected, atol=1e-5)
    manifest = json.loads((result.run_dir / "records" / "manifest.json").read_text())
    assert manifest["bytes"] == sum(round_path(result.run_dir, t).stat().st_size for t in (1, 2))


def test_label_privacy_shows_in_the_recorded_labels(tmp_path: Path) -> None:
    config = recorded(tiny("splitfed_v2", tmp_path), ["labels"])
    config["privacy"] = {"labels": {"epsilon": 0.1}}
    held = np.load(round_path(fedge.run(config).run_dir, 1))
    assert (held["cut/labels"] != held["cut/true_label"]).mean() > 0.5  # 4 classes, eps 0.1: mostly replaced


def test_record_every_keeps_the_first_round_every_so_many_and_the_last(tmp_path: Path) -> None:
    config = recorded(tiny("cse_fsl", tmp_path, rounds=6), ["smashed"], record_every=4)
    assert recorded_rounds(fedge.run(config).run_dir) == [1, 5, 6]


def test_a_fedavg_update_of_one_step_is_minus_lr_times_the_gradient(tmp_path: Path) -> None:
    config = recorded(tiny("fedavg", tmp_path, rounds=1), ["updates"], record_clients=2)
    config["algorithm"].update(batch_size=64, optimizer={"lr": 0.1})  # 60 samples a client: one step
    run_dir = fedge.run(config).run_dir
    held = np.load(round_path(run_dir, 1))
    assert held["updates/client"].shape == (2,) and (held["updates/steps"] == 1).all()
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(36, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
    names = ["fc1.linear.weight", "fc1.linear.bias", "out.linear.weight", "out.linear.bias"]
    for p, name in zip(model.parameters(), names, strict=True):
        p.data = torch.from_numpy(held[f"global/{name}"]).clone()
    used = held["updates/sample"][0] >= 0
    x, y = (
        torch.from_numpy(held["updates/input"][0][used]),
        torch.from_numpy(held["updates/true_label"][0][used]),
    )
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p, name in zip(model.parameters(), names, strict=True):
        assert torch.allclose(torch.from_numpy(held[f"updates/delta/{name}"][0]), -0.1 * p.grad, atol=1e-6)


def test_a_resumed_run_records_what_the_whole_run_did(tmp_path: Path) -> None:
    whole = fedge.run(recorded(tiny("splitfed_v2", tmp_path / "whole", rounds=4), CUT))
    config = recorded(tiny("splitfed_v2", tmp_path / "cut", rounds=4), CUT)
    config["output"]["name"] = "cut"
    killed_after(config, 2)
    resumed = fedge.resume(tmp_path / "cut" / "cut")
    for t in range(1, 5):
        a, b = np.load(round_path(whole.run_dir, t)), np.load(round_path(resumed.run_dir, t))
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)


@pytest.mark.parametrize(
    ("algorithm", "kinds", "said"),
    [
        ("cse_fsl", ["cut_gradients"], "cse_fsl has no cut_gradients to record"),
        ("fedavg", ["smashed"], "fedavg has no smashed to record"),
        ("fsl_sage", ["cut_gradients"], "fsl_sage has no cut_gradients to record"),
        ("cse_fsl_async", ["smashed"], "cse_fsl_async has no smashed to record"),
    ],
)
def test_a_kind_the_algorithm_does_not_send_is_refused_in_one_line(
    tmp_path: Path, algorithm: str, kinds: list[str], said: str
) -> None:
    config = recorded(tiny(algorithm, tmp_path / "runs"), kinds)
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    outcome = invoke(["run", str(path), "-q"])
    assert outcome.code == 2 and len(outcome.lines) == 1
    assert "output.record" in outcome.lines[0] and said in outcome.lines[0]
    assert not run_dirs(tmp_path / "runs")


def test_fedge_attack_refuses_a_run_that_recorded_nothing_it_needs(tmp_path: Path) -> None:
    run_dir = fedge.run(tiny("cse_fsl", tmp_path)).run_dir
    outcome = invoke(["attack", str(run_dir), "--attack", "label_direction"])
    assert outcome.code == 2 and len(outcome.lines) == 1
    assert "output.record: [cut_gradients]" in outcome.lines[0]
    assert not (run_dir / "attacks.json").exists()


def test_a_deployed_run_refuses_to_record(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from fedge.config import parse_config
    from fedge.deploy.rounds import check_stages
    from fedge.errors import ConfigError

    config = parse_config(recorded(tiny("splitfed_v2", tmp_path), CUT))
    with pytest.raises(ConfigError, match="^output.record: is kept by a simulated run"):
        check_stages(config)


def test_lightweight_fedsl_records_its_one_exchange_a_round(tmp_path: Path) -> None:
    config = recorded(tiny("light_fedsl", tmp_path, rounds=2), CUT)
    held = np.load(round_path(fedge.run(config).run_dir, 2))
    assert (held["cut/step"] == 0).all() and len(set(held["cut/client"].tolist())) == 4
    assert held["cut/cut_gradients"].shape == held["cut/smashed"].shape
    assert any(name.startswith("client_model/trunk.") for name in held.files)


def test_fsl_sage_records_what_its_clients_upload(tmp_path: Path) -> None:
    config = recorded(tiny("fsl_sage", tmp_path), ["smashed", "labels"])
    config["algorithm"].update(h=2)
    held = np.load(round_path(fedge.run(config).run_dir, 1))
    assert len(held["cut/smashed"]) > 0 and "cut/cut_gradients" not in held.files
    assert (held["cut/step"] % 2 == 0).all()  # every h-th local step uploads (the first of each block)
