"""Availability-aware participant sampling (fedge.runtime.availability): the synchronous algorithms
that sample participants draw them among the clients online in the round, and nothing changes when
every client is online."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from cases import tiny
from tiers import parametrize_first_by_default

import fedge

TRACE = ["0,1,1,1", "1,0,1,0", "0,0,0,0", "1,1,0,1"]  # round r's row: which of the 4 clients are online
WALL = ("wall_seconds",)


def run(tmp_path: Path, algorithm: str, name: str, system: dict | None, **knobs) -> fedge.Result:
    cfg = tiny(algorithm, tmp_path, rounds=len(TRACE))
    cfg["algorithm"].update(knobs)
    cfg["output"]["name"] = name
    if system is not None:
        cfg["system"] = system
    return fedge.run(cfg)


def rows(result: fedge.Result) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in WALL} for row in result.metrics]


def receivers(result: fedge.Result, kind: str) -> dict[int, set[int]]:
    """The clients that received ``kind`` in each round, by the ledger."""
    out: dict[int, set[int]] = {}
    for row in csv.DictReader(io.StringIO((result.run_dir / "ledger.csv").read_text())):
        if row["kind"] == kind:
            out.setdefault(int(row["round"]), set()).add(int(row["dst"].split(":")[1]))
    return out


@pytest.mark.parametrize(
    ("algorithm", "knobs"),
    [
        ("fedavg", {"fraction": 0.5}),
        ("cse_fsl", {"batch_size": 8}),
        ("splitfed_v2", {"participation": "without_replacement", "clients_per_round": 2, "batch_size": 8}),
    ],
)
def test_only_clients_online_in_the_trace_take_part(tmp_path, algorithm, knobs):
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(TRACE) + "\n")
    result = run(tmp_path, algorithm, algorithm, {"devices": {"trace": str(trace)}}, **knobs)
    online = [{i for i, bit in enumerate(row.split(",")) if bit == "1"} for row in TRACE]
    taking_part = receivers(result, "model_down")
    for t, row in enumerate(result.metrics, start=1):
        assert taking_part.get(t, set()) <= online[t - 1]
        assert row["participants"] == min(len(online[t - 1]), 2 if algorithm != "cse_fsl" else 4)
    assert 3 not in taking_part  # nobody online in round 3: an empty round
    assert result.metrics[2]["sim_seconds"] == result.metrics[1]["sim_seconds"]
    if algorithm == "cse_fsl":  # full participation: every online client
        assert taking_part == {t: online[t - 1] for t in (1, 2, 4)}


@parametrize_first_by_default(("algorithm", "knobs"), [("fedavg", {"fraction": 0.5}), ("cse_fsl", {})])
def test_with_every_client_online_the_draws_are_unchanged(tmp_path, algorithm, knobs):
    plain = run(tmp_path, algorithm, "plain", None, **knobs)
    profiled = run(tmp_path, algorithm, "profiled", {"devices": {"availability": 1.0}}, **knobs)
    assert rows(plain) == rows(profiled)
    assert (plain.run_dir / "ledger.csv").read_bytes() == (profiled.run_dir / "ledger.csv").read_bytes()
