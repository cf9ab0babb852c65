"""`fedge attack` on run directories: each attack checked on a case with a known answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cases import invoke
from llm_cases import lm_config, needs_llm, write_corpus

import fedge
from fedge.attacks.from_run import ATTACKS, Budget, attack
from fedge.cli.commands import ATTACK_NAMES

QUICK = Budget(
    aux_samples=300, decoder_epochs=10, inversion_steps=100, gradient_steps=300, gradient_clients=2
)


def digits(out: Path, algorithm: str, record: list[str], **options: Any) -> dict[str, Any]:
    """One round on the digits, one thread."""
    return {
        "seed": 0,
        "rounds": 1,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 1},
        "model": {"name": "mlp", "options": {"hidden": [64]}, "cut": 1},
        "algorithm": {"name": algorithm, "batch_size": 1, **options},
        "engine": {"threads": 1},
        "output": {"dir": str(out), "plots": False, "record": record, "record_samples": 200},
    }


def label_case(out: Path, privacy: dict[str, Any] | None = None) -> dict[str, Any]:
    """One client of SplitFed v2 in batches of 1: every cut gradient is one sample's."""
    config = digits(out, "splitfed_v2", ["cut_gradients", "labels"])
    config["data"]["train_limit"] = 200
    if privacy is not None:
        config["privacy"] = privacy
    return config


def test_the_cli_names_every_attack() -> None:
    assert set(ATTACK_NAMES) == set(ATTACKS)


def test_undefended_cut_gradients_give_the_labels_away(tmp_path: Path) -> None:
    run_dir = fedge.run(label_case(tmp_path)).run_dir
    found = attack(run_dir, ["label_direction"], budget=QUICK)["label_direction"]
    assert found["auc"] > 0.97 and found["accuracy"] > 0.8


def test_labels_replaced_by_noise_leave_nothing_to_infer(tmp_path: Path) -> None:
    run_dir = fedge.run(label_case(tmp_path, {"labels": {"epsilon": 0.01}})).run_dir
    found = attack(run_dir, ["label_direction"], budget=QUICK)["label_direction"]
    assert abs(found["auc"] - 0.5) < 0.07


@pytest.mark.ci  # a run and a trained attack: seconds; CI's ci tier runs it
def test_a_wide_first_cut_is_reconstructed_far_better_than_a_bottleneck(tmp_path: Path) -> None:
    psnr = {}
    for cut in (1, 2):
        config = digits(tmp_path / str(cut), "splitfed_v2", ["smashed"], batch_size=32)
        config["model"].update(options={"hidden": [256, 4]}, cut=cut)
        found = attack(fedge.run(config).run_dir, ["decoder"], budget=QUICK)["decoder"]
        psnr[cut] = found["psnr"]
    assert psnr[1] > psnr[2] + 5  # 256 ReLU units of 64 pixels against 4 values a sample


@pytest.mark.ci  # a run and a trained attack: seconds; CI's ci tier runs it
def test_one_image_of_one_fedavg_step_is_recovered_from_its_update(tmp_path: Path) -> None:
    config = digits(tmp_path, "fedavg", ["updates"])
    config["data"]["train_limit"] = 4
    config["partition"]["num_clients"] = 4  # one image a client, one local step
    config["model"] = {"name": "mlp", "options": {"hidden": [32]}}
    run_dir = fedge.run(config).run_dir
    found = attack(run_dir, ["gradient_inversion"], budget=QUICK)["gradient_inversion"]
    assert [case["batch"] for case in found["cases"]] == [1, 1]
    assert all(case["labels_right"] == 1.0 for case in found["cases"])
    assert found["psnr"] > 20 and (run_dir / "attack-gradient_inversion.png").is_file()


def test_fedge_attack_runs_what_the_run_allows_and_keeps_it_with_the_summary(tmp_path: Path) -> None:
    config = label_case(tmp_path)
    config["output"]["record"] = ["smashed", "cut_gradients", "labels"]
    run_dir = fedge.run(config).run_dir
    outcome = invoke(["attack", str(run_dir), "--attack", "membership", "--attack", "label_norm"])
    assert outcome.code == 0, outcome.output
    held = json.loads((run_dir / "attacks.json").read_text())
    assert set(held) == {"membership", "label_norm"}
    assert 0.0 <= held["membership"]["auc"] <= 1.0 and held["membership"]["members"] == 200
    assert held["label_norm"]["seconds"] >= 0 and "Li et al." in held["label_norm"]["paper"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["attacks"]["membership"]["auc"] == held["membership"]["auc"]


def test_an_unknown_attack_and_a_round_never_recorded_are_refused_in_one_line(tmp_path: Path) -> None:
    run_dir = fedge.run(label_case(tmp_path)).run_dir
    for args, said in (
        (["--attack", "frobnicate"], "unknown attack 'frobnicate'"),
        (["--attack", "label_norm", "--round", "7"], "round 7 was not recorded"),
    ):
        outcome = invoke(["attack", str(run_dir), *args])
        assert outcome.code == 2 and len(outcome.lines) == 1 and said in outcome.lines[0]


@pytest.mark.parametrize("missing", ["decoder", "gradient_inversion"])
def test_an_attack_names_what_the_run_should_have_recorded(tmp_path: Path, missing: str) -> None:
    run_dir = fedge.run(label_case(tmp_path)).run_dir
    outcome = invoke(["attack", str(run_dir), "--attack", missing])
    kind = "smashed" if missing == "decoder" else "updates"
    assert outcome.code == 2 and f"output.record: [{kind}]" in outcome.lines[0]


@needs_llm
@pytest.mark.ci  # transformers takes seconds to import
def test_the_tokens_behind_a_split_lms_hidden_states_are_recovered(tmp_path: Path) -> None:
    root = write_corpus(tmp_path / "corpus")
    output = {"dir": str(tmp_path / "runs"), "plots": False, "record": ["smashed"]}
    run_dir = fedge.run(lm_config(root, {"name": "splitfed_v2"}, output=output)).run_dir
    found = attack(run_dir, None, budget=QUICK)
    assert set(found) == {"tokens", "membership", "membership_calibrated"}  # no image reconstruction
    assert found["tokens"]["token_accuracy"] > found["tokens"]["most_frequent_token_share"] + 0.1


def test_in_run_attacks_fill_the_recorded_rounds_rows_and_change_no_number(tmp_path: Path) -> None:
    def config(out: Path, attacks: list[str]) -> dict[str, Any]:
        raw = label_case(out)
        raw.update(rounds=3)
        raw["data"]["train_limit"] = 60
        raw["output"].update(record_every=2)
        raw["eval"] = {"attacks": attacks}
        return raw

    plain = fedge.run(config(tmp_path / "plain", []))
    attacked = fedge.run(config(tmp_path / "attacked", ["label_direction", "membership"]))
    leaks = [sorted(k for k in row if k.startswith("leak_")) for row in attacked.metrics]
    assert leaks[1] == [] and "leak_label_direction_auc" in leaks[0] and "leak_membership_auc" in leaks[2]
    stripped = [{k: v for k, v in row.items() if not k.startswith("leak_") and k != "wall_seconds"}
                for row in attacked.metrics]  # fmt: skip
    assert stripped == [{k: v for k, v in row.items() if k != "wall_seconds"} for row in plain.metrics]


def test_an_in_run_attack_without_its_record_is_refused_before_the_run(tmp_path: Path) -> None:
    raw = label_case(tmp_path / "runs")
    raw["output"]["record"] = ["labels"]
    raw["eval"] = {"attacks": ["label_direction"]}
    with pytest.raises(
        fedge.ConfigError, match=r"^eval.attacks: label_direction needs output.record: \[cut_gradients\]"
    ):
        fedge.run(raw)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_in_run_leaks_reach_the_summary_and_fedge_compare(tmp_path: Path) -> None:
    raw = label_case(tmp_path / "runs")
    raw["eval"] = {"attacks": ["label_direction"]}
    summary = fedge.run(raw).summary
    assert summary["leaks"]["leak_label_direction_auc"] > 0.9
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({**raw, "output": {**raw["output"], "dir": str(tmp_path / "cmp")}}))
    outcome = invoke(["compare", str(path), "--algorithms", "splitfed_v2,splitfed_v1", "--seeds", "1"])
    assert outcome.code == 0, outcome.output
    assert "leaks (last" in outcome.output and "label_direction_auc" in outcome.output


def test_the_calibrated_membership_attack_trains_its_reference_on_the_attackers_half(tmp_path: Path) -> None:
    run_dir = fedge.run(label_case(tmp_path)).run_dir
    found = attack(run_dir, ["membership_calibrated"], budget=Budget(reference_epochs=1))
    figures = found["membership_calibrated"]
    assert 0.0 <= figures["auc"] <= 1.0 and figures["members"] == figures["nonmembers"] > 0
    assert figures["reference_samples"] > 0 and "Watson" in figures["paper"]
