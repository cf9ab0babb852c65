"""A run given another length: a finished run continued to more rounds ends where a run of that length
ends (every algorithm that says its rounds ignore the length), one that reads its length is refused and
its directory left as it was, a checkpoint of an older fedge is continued too, and a sweep rerun with a
larger ``rounds`` continues its runs."""

from __future__ import annotations

import json

import pytest
import yaml
from cases import ALGORITHM_NAMES, invoke, tiny
from tiers import parametrize_first_by_default

import fedge
from fedge.errors import FedgeError
from fedge.runner import checkpoint

WALL = ("wall_seconds",)
# the built-in algorithms whose rounds read the run's length (their tiny config's settings)
READS_LENGTH = {
    "dispfl": "cosine over the run's rounds",
    "light_fedsl": "schedule_rounds",
    "pens": "selection_rounds",
}


def _config(algorithm: str, out, rounds: int, name: str) -> dict:
    config = tiny(algorithm, out, rounds=rounds)
    config["eval"] = {"every": 1}  # every round evaluated: the old last round's evaluation is no extra row
    config["output"]["name"] = name
    if algorithm == "light_fedsl":
        config["algorithm"]["final_sparsity"] = 0.5
    return config


def _rows(result: fedge.Result) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in WALL} for row in result.metrics]


def _snapshot(run_dir) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@parametrize_first_by_default("algorithm", ALGORITHM_NAMES)
def test_a_finished_run_goes_on_to_a_longer_runs_result_or_is_refused(tmp_path, algorithm):
    short = fedge.run(_config(algorithm, tmp_path, 2, "short"))
    if algorithm in READS_LENGTH:
        before = _snapshot(short.run_dir)
        with pytest.raises(FedgeError, match=READS_LENGTH[algorithm]) as refused:
            fedge.resume(short.run_dir, rounds=3)
        assert "a 2-round run cannot go on as a 3-round run" in str(refused.value)
        assert _snapshot(short.run_dir) == before
        return
    longer = fedge.resume(short.run_dir, rounds=3)
    fresh = fedge.run(_config(algorithm, tmp_path, 3, "fresh"))
    assert len(longer.metrics) == 3 and _rows(longer) == _rows(fresh)
    for name in ("ledger.csv", "energy.csv"):
        assert (short.run_dir / name).read_bytes() == (fresh.run_dir / name).read_bytes(), name
    assert yaml.safe_load((short.run_dir / "config.yaml").read_text())["rounds"] == 3
    assert json.loads((short.run_dir / "summary.json").read_text())["rounds"] == 3


def test_a_schedule_fixed_apart_from_the_length_may_go_on(tmp_path):
    config = _config("light_fedsl", tmp_path, 2, "short")
    config["algorithm"]["schedule_rounds"] = 3
    fedge.run(config)
    longer = fedge.resume(tmp_path / "short", rounds=3)
    fresh = fedge.run({**_config("light_fedsl", tmp_path, 3, "fresh"), "algorithm": config["algorithm"]})
    assert _rows(longer) == _rows(fresh)


def test_the_command_line_goes_on_and_refuses_fewer_rounds_than_done(tmp_path):
    run_dir = fedge.run(_config("fedavg", tmp_path, 3, "run")).run_dir
    before = _snapshot(run_dir)
    outcome = invoke(["resume", str(run_dir), "--rounds", "2", "-q"])
    assert outcome.code == 2 and outcome.lines == [
        f"error: {run_dir}: rounds=2 is fewer than the 3 rounds this run has done"
    ], outcome.output
    outcome = invoke(["resume", str(run_dir), "--rounds", "0", "-q"])
    assert outcome.code == 2 and len(outcome.lines) == 1 and "rounds" in outcome.lines[0], outcome.output
    assert _snapshot(run_dir) == before
    assert invoke(["resume", str(run_dir), "--rounds", "4", "-q"]).code == 0
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 4


def test_a_run_that_met_its_target_stays_stopped(tmp_path):
    config = _config("fedavg", tmp_path, 5, "run") | {"stop": {"target_accuracy": 0.01}}
    run_dir = fedge.run(config).run_dir
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 1
    assert len(fedge.resume(run_dir, rounds=9).metrics) == 1


def test_an_older_fedge_checkpoint_whose_digest_covers_rounds_goes_on(tmp_path):
    run_dir = fedge.run(_config("fedavg", tmp_path, 2, "old")).run_dir
    path = run_dir / "checkpoint.pt"
    data = path.read_bytes()
    start = len(checkpoint.MAGIC)
    end = data.index(b"\n", start)
    header = json.loads(data[start:end])
    del header["rounds"]  # as an older fedge wrote it, with a digest of the config's rounds too
    header["config_sha256"] = checkpoint._older_digest(_loaded(run_dir))
    path.write_bytes(data[:start] + json.dumps(header).encode() + data[end:])
    assert fedge.resume(run_dir).summary["rounds"] == 2  # it still resumes as it is
    longer = fedge.resume(run_dir, rounds=3)
    fresh = fedge.run(_config("fedavg", tmp_path, 3, "fresh"))
    assert _rows(longer) == _rows(fresh)
    assert json.loads(path.read_bytes()[start:].split(b"\n", 1)[0])["rounds"] == 3


def _loaded(run_dir):
    from fedge.config import load_config

    return load_config(run_dir / "config.yaml")


def test_an_edited_length_in_config_yaml_is_a_continuation_too(tmp_path):
    run_dir = fedge.run(_config("hist", tmp_path, 2, "run")).run_dir
    path = run_dir / "config.yaml"
    path.write_text(path.read_text().replace("rounds: 2", "rounds: 3"))
    fresh = fedge.run(_config("hist", tmp_path, 3, "fresh"))
    assert _rows(fedge.resume(run_dir)) == _rows(fresh)


@pytest.mark.ci
def test_a_sweep_rerun_with_more_rounds_continues_its_runs(tmp_path):
    base = _config("fedavg", tmp_path, 2, "x")
    del base["output"]["name"]
    spec = {"grid": {"algorithm.name": ["fedavg", "local"]}, "seeds": [1], "name": "grow"}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**base, "sweep": spec}))
    assert invoke(["sweep", str(path), "-q"]).code == 0
    run_dirs = sorted((tmp_path / "grow" / "runs").iterdir())
    assert invoke(["sweep", str(path), "rounds=3", "-q"]).code == 0
    for run_dir in run_dirs:
        assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 3, run_dir
    fresh = fedge.run(_config("fedavg", tmp_path, 3, "fresh") | {"seed": 1})
    grown = [json.loads(line) for line in (run_dirs[0] / "metrics.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k not in WALL} for r in grown] == _rows(fresh)


@pytest.mark.ci
def test_a_sweep_weighs_its_eta_by_the_share_of_each_run_left_to_run(tmp_path):
    from fedge.experiments.sweep import load_sweep, plan, run_sweep

    base = _config("fedavg", tmp_path, 2, "x")
    del base["output"]["name"]
    spec = {"grid": {"stop.target_accuracy": [0.01, 1.0]}, "seeds": [1, 2], "name": "eta"}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**base, "sweep": spec}))
    etas = []
    run_sweep(*load_sweep(path), on_done=lambda task, done, total, eta: etas.append(eta))
    assert etas[-1] == 0.0 and all(eta > 0 for eta in etas[:-1])
    base_raw, sweep = load_sweep(path, ["rounds=8"])
    left = {task.run_dir.name: task.work_left() for task in plan(base_raw, sweep)[1]}
    assert sorted(left.values()) == [0.0, 0.0, 0.75, 0.75]  # target met at round 1: it stays stopped
    etas.clear()

    def announce(task, done, total, eta):
        etas.append((left[task.run_dir.name], eta))

    run_sweep(base_raw, sweep, on_done=announce)
    # the stopped runs go first (grid order) and cost nothing: no rate to tell until a run has rounds
    assert [weight for weight, _ in etas] == [0.0, 0.0, 0.75, 0.75]
    assert etas[0][1] is None and etas[1][1] is None and etas[2][1] > 0 and etas[3][1] == 0.0


def test_an_algorithm_on_the_bare_interface_does_not_go_on_until_it_says_so():
    from types import SimpleNamespace

    from fedge.algorithms import Algorithm

    why = Algorithm.reads_run_length(SimpleNamespace(name="mine"))
    assert why == "mine does not say that its rounds ignore the run's length (reads_run_length)"
