"""Safe checkpoints: exact round trips without pickle, and every damaged or foreign checkpoint refused by
``fedge resume`` with one line and exit code 2, the run directory left exactly as it was."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from cases import invoke, killed_after, read_only, tiny
from tiers import parametrize_first_by_default

import fedge
from fedge.config import parse_config
from fedge.errors import CheckpointError, PathError
from fedge.files import results
from fedge.runner import checkpoint, restore


def test_state_round_trips_exactly_with_every_kind_of_value(tmp_path):
    shared = torch.randn(3, 4)
    state = {
        "tensors": {
            "f32": shared,
            "again": shared,
            "f64": torch.randn(2, dtype=torch.float64),
            "bf16": torch.randn(5).to(torch.bfloat16),
            "mask": torch.rand(4) > 0.5,
            "ints": torch.arange(6, dtype=torch.int64).reshape(2, 3),
            "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 3),
            "strided": torch.randn(4, 4).t(),
            "nan": torch.tensor([math.nan, math.inf, -0.0]),
        },
        "arrays": [np.arange(5, dtype=np.int32), np.array([[1.5, -2.0]]), np.zeros(0, dtype=np.int64)],
        "scalars": (np.int64(7), np.float32(0.1), np.bool_(True), np.float64(0.3)),
        "totals": {("model_up", "up"): 2**40 + 1, ("peer", "peer"): 0},
        "numbers": [0.1, 1e-300, -0.0, math.inf, math.nan, 10**30, True, None, "text", "$dollar"],
        "$odd": {"$tuple": 1},
    }
    config = parse_config({})
    checkpoint.save(tmp_path / "c.pt", state, config, 3)
    loaded = checkpoint.load(tmp_path / "c.pt", config)
    assert loaded.header["round"] == 3 and loaded.header["algorithm"] == "fedavg"
    back = loaded.state
    for key, tensor in state["tensors"].items():
        assert back["tensors"][key].dtype == tensor.dtype and back["tensors"][key].shape == tensor.shape
        assert torch.equal(back["tensors"][key].nan_to_num(), tensor.nan_to_num())
    assert back["tensors"]["again"] is back["tensors"]["f32"]
    assert torch.equal(back["tensors"]["nan"].signbit(), state["tensors"]["nan"].signbit())
    for a, b in zip(back["arrays"], state["arrays"], strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert [type(v) for v in back["scalars"]] == [np.int64, np.float32, np.bool_, np.float64]
    assert back["scalars"] == state["scalars"] and back["totals"] == state["totals"]
    numbers = back["numbers"]
    assert (
        numbers[:4] == state["numbers"][:4] and math.copysign(1, numbers[2]) == -1 and math.isnan(numbers[4])
    )
    assert numbers[5:] == state["numbers"][5:] and back["$odd"] == state["$odd"]


def test_values_a_checkpoint_cannot_hold_fail_when_saving(tmp_path):
    with pytest.raises(TypeError, match="object"):
        checkpoint.save(tmp_path / "c.pt", {"x": np.array([object()])}, parse_config({}), 1)
    with pytest.raises(TypeError, match="set"):
        checkpoint.save(tmp_path / "c.pt", {"x": {1, 2}}, parse_config({}), 1)
    assert not list(tmp_path.iterdir())


def test_a_pickle_is_never_opened(tmp_path):
    """An old (or hostile) torch.save file is refused from its first bytes: nothing is unpickled."""

    marker = tmp_path / "pwned"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "checkpoint.pt"
    torch.save({"state": Boom()}, path)
    with pytest.raises(CheckpointError, match="pickle checkpoint of an older fedge; it is not opened"):
        checkpoint.load(path)
    assert not marker.exists()


@pytest.fixture
def interrupted(tmp_path) -> Path:
    """A FedAvg run stopped after round 2 of 4 (its checkpoint and metrics as a kill would leave them)."""
    config = tiny("fedavg", tmp_path / "runs", rounds=4)
    config["output"]["name"] = "cut"

    killed_after(config, 2)
    run_dir = tmp_path / "runs" / "cut"
    assert len(results.read_jsonl(run_dir / "metrics.jsonl")) == 2
    return run_dir


def _other_algorithm_checkpoint(run_dir: Path, tmp_path: Path) -> None:
    other = fedge.run(tiny("gossip", tmp_path / "other", rounds=1))
    shutil.copy(other.run_dir / "checkpoint.pt", run_dir / "checkpoint.pt")


def _truncate(run_dir: Path, tmp_path: Path) -> None:
    path = run_dir / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


FAULTS = {
    "truncated": (_truncate, "is damaged: "),
    "random bytes": (
        lambda d, t: (d / "checkpoint.pt").write_bytes(os.urandom(4096)),
        "is not a fedge checkpoint",
    ),
    "empty": (lambda d, t: (d / "checkpoint.pt").write_bytes(b""), "is empty"),
    "text": (lambda d, t: (d / "checkpoint.pt").write_text("round: 2\n"), "is not a fedge checkpoint"),
    "another algorithm's": (_other_algorithm_checkpoint, "belongs to a gossip run, not to this fedavg run"),
    "flipped byte": (
        lambda d, t: (d / "checkpoint.pt").write_bytes(
            (b := bytearray((d / "checkpoint.pt").read_bytes()))[:-1] + bytes([b[-1] ^ 1])
        ),
        "is damaged: its checksum does not match",
    ),
}


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@parametrize_first_by_default("fault", list(FAULTS))
def test_a_damaged_or_foreign_checkpoint_is_refused_and_nothing_changes(interrupted, tmp_path, fault):
    damage, needle = FAULTS[fault]
    damage(interrupted, tmp_path)
    before = _snapshot(interrupted)
    outcome = invoke(["resume", str(interrupted), "-q"])
    assert outcome.exception is None and outcome.code == 2, outcome.output
    assert len(outcome.lines) == 1, outcome.output
    assert outcome.lines[0].startswith(f"error: {interrupted / 'checkpoint.pt'}: {needle}"), outcome.lines[0]
    assert _snapshot(interrupted) == before  # metrics.jsonl byte-identical, nothing added or removed


def test_a_read_only_run_directory_is_refused_and_nothing_changes(interrupted):
    before = _snapshot(interrupted)
    with read_only(interrupted):
        outcome = invoke(["resume", str(interrupted), "-q"])
    assert outcome.code == 2 and len(outcome.lines) == 1, outcome.output
    assert outcome.lines[0].startswith(f"error: {interrupted}: cannot be written"), outcome.lines[0]
    assert _snapshot(interrupted) == before


def test_an_edited_config_does_not_resume_a_checkpoint_of_another(interrupted):
    path = interrupted / "config.yaml"
    path.write_text(path.read_text().replace("seed: 3", "seed: 4"))
    before = _snapshot(interrupted)
    outcome = invoke(["resume", str(interrupted), "-q"])
    assert outcome.code == 2 and "was written for another config" in outcome.lines[0], outcome.output
    assert _snapshot(interrupted) == before


def test_resume_removes_stale_temporaries_and_finishes(interrupted, tmp_path):
    for name in (".metrics.jsonl.abc123.tmp", ".checkpoint.pt.x_9.tmp", "plots/.accuracy_vs_mb.png.q1.tmp"):
        (interrupted / name).write_text("half")
    result = fedge.resume(interrupted)
    assert not [p for p in interrupted.rglob(".*")], list(interrupted.rglob(".*"))
    reference = fedge.run(tiny("fedavg", tmp_path / "reference", rounds=4))
    wall = ("wall_seconds",)
    strip = [
        [{k: v for k, v in row.items() if k not in wall} for row in r.metrics] for r in (result, reference)
    ]
    assert strip[0] == strip[1]


def test_a_directory_another_process_runs_is_refused(interrupted):
    lock = results.RunLock(interrupted)
    try:
        with pytest.raises(PathError, match="is being run by another fedge process"):
            fedge.resume(interrupted)
    finally:
        lock.release()
    assert fedge.resume(interrupted).summary["rounds"] == 4


def test_checkpoint_files_hold_no_pickle(tmp_path):
    result = fedge.run(tiny("cse_fsl", tmp_path / "runs", rounds=1))
    data = (result.run_dir / "checkpoint.pt").read_bytes()
    assert data.startswith(checkpoint.MAGIC) and b"PK\x03\x04" not in data[:64]
    header = yaml.safe_load(data.splitlines()[1])
    assert header["format"] == checkpoint.FORMAT and header["algorithm"] == "cse_fsl"
    assert header["config_sha256"] == checkpoint.config_digest(result.config) and header["round"] == 1


def test_a_full_disk_mid_run_is_one_line_and_the_last_checkpoint_resumes(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny("fedavg", out, rounds=4) | {"eval": {"every": 1}}))
    original, writes = results.atomic_write, []

    def full_after_a_while(target, write):
        writes.append(target)
        if len(writes) > 5:
            raise PathError(target, "cannot be written (No space left on device)")
        original(target, write)

    monkeypatch.setattr(results, "atomic_write", full_after_a_while)
    monkeypatch.setattr(checkpoint, "atomic_write", full_after_a_while)
    outcome = invoke(["run", str(path), "-q"])
    assert outcome.code == 2 and len(outcome.lines) == 1, outcome.output
    assert "No space left on device" in outcome.lines[0] and outcome.exception is None
    monkeypatch.undo()
    (run_dir,) = out.iterdir()
    assert fedge.resume(run_dir).summary["rounds"] == 4


def test_resuming_a_finished_run_changes_no_result(tmp_path):
    result = fedge.run(tiny("fedavg", tmp_path / "runs", rounds=2))
    before = (result.run_dir / "metrics.jsonl").read_bytes()
    outcome = invoke(["resume", str(result.run_dir), "-q"])
    assert outcome.code == 0 and (result.run_dir / "metrics.jsonl").read_bytes() == before


def test_plotting_a_damaged_metrics_file_is_one_line(tmp_path):
    result = fedge.run(tiny("fedavg", tmp_path / "runs", rounds=1))
    (result.run_dir / "metrics.jsonl").write_text('{"round": 1}\nnot json\n')
    outcome = invoke(["plot", str(result.run_dir)])
    assert outcome.code == 2 and outcome.lines == [
        f"error: {result.run_dir / 'metrics.jsonl'}: line 2 is not a JSON object"
    ]


def test_a_well_formed_but_inconsistent_checkpoint_is_refused_not_a_traceback(tmp_path):
    """The checksum is no signature: a crafted file with a valid one still only gets a one-line refusal."""
    config = parse_config({})
    checkpoint.save(tmp_path / "c.pt", {"w": torch.zeros(2, 3)}, config, 1)
    magic, header, description, data = (tmp_path / "c.pt").read_bytes().split(b"\n", 3)
    crafted = description.replace(b'"shape":[2,3]', b'"shape":[7,7]')
    body = crafted + b"\n" + data
    fields = json.loads(header) | {"body_bytes": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
    (tmp_path / "c.pt").write_bytes(magic + b"\n" + json.dumps(fields).encode() + b"\n" + body)
    with pytest.raises(CheckpointError, match="is damaged: "):
        checkpoint.load(tmp_path / "c.pt", config)


# --- a checkpoint whose checksum was recomputed is checked for what it says --------------------------


def _forge(run_dir: Path, change, header_round: int | None = None) -> None:
    """Rewrite the run's checkpoint with ``change(state)`` applied and a valid checksum, as anyone who can
    write the file can."""
    path, config = run_dir / "checkpoint.pt", fedge.resolve_config(str(run_dir / "config.yaml"))
    state = restore.with_history(checkpoint.load(path, config), checkpoint.journal_path(path)).state
    change(state)  # the whole past in the state, as a format-1 checkpoint holds it
    checkpoint.save(path, state, config, state["round"] if header_round is None else header_round)


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _transpose_a_weight(state) -> None:
    weight = next(t for t in _tensors(state["algorithm"]) if t.ndim == 2 and t.shape[0] != t.shape[1])
    weight.data = weight.data.t().contiguous()


def _widen_a_dtype(state) -> None:
    weight = next(t for t in _tensors(state["algorithm"]) if t.is_floating_point())
    weight.data = weight.data.double()


MEANINGLESS = {
    "negative round": (lambda s: s.update(round=-5), "round -5 is not a round of this run (1..4)"),
    "round past the end": (
        lambda s: s.update(round=10**6),
        "round 1000000 is not a round of this run (1..4)",
    ),
    "round zero": (lambda s: s.update(round=0), "round 0 is not a round of this run (1..4)"),
    "a transposed weight": (_transpose_a_weight, "algorithm state "),
    "a wider dtype": (_widen_a_dtype, "algorithm state "),
    "a missing entry": (lambda s: s["algorithm"].pop(next(iter(s["algorithm"]))), "algorithm state "),
    "a row dropped": (lambda s: s["rows"].pop(0), "metrics history "),
    "rows renumbered": (lambda s: s["rows"][1].update(round=7), "metrics history "),
    "a row altered": (lambda s: s["rows"][0].update(train_loss=0.0), "metrics.jsonl"),
    "rows that are not rows": (lambda s: s.update(rows="x"), "metrics history "),
}


@parametrize_first_by_default("fault", list(MEANINGLESS))
def test_a_checkpoint_with_a_valid_checksum_but_no_meaning_is_refused(interrupted, fault):
    change, needle = MEANINGLESS[fault]
    _forge(interrupted, change)
    before = _snapshot(interrupted)
    outcome = invoke(["resume", str(interrupted), "-q"])
    assert outcome.exception is None and outcome.code == 2, outcome.output
    assert len(outcome.lines) == 1, outcome.output
    assert outcome.lines[0].startswith(f"error: {interrupted / 'checkpoint.pt'}: "), outcome.lines[0]
    assert needle in outcome.lines[0], outcome.lines[0]
    assert _snapshot(interrupted) == before
    with pytest.raises(CheckpointError):  # and from Python, with the run directory left unlocked
        fedge.resume(interrupted)


def test_a_header_round_that_disagrees_with_the_state_is_refused(interrupted):
    _forge(interrupted, lambda s: None, header_round=3)
    with pytest.raises(CheckpointError, match="its header says round 3 but its state round 2"):
        fedge.resume(interrupted)


def test_a_forged_checkpoint_that_still_makes_sense_resumes(interrupted, tmp_path):
    """The checks refuse nonsense, not a checkpoint that only moved a value: the hash is no signature."""
    _forge(interrupted, lambda s: s.update(wall_seconds=1.0))
    assert [row["round"] for row in fedge.resume(interrupted).metrics] == [1, 2, 3, 4]


# --- a checkpoint path that is not a regular file ------------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


NOT_FILES = {
    "a directory": (lambda p: p.mkdir(), "is not a regular file (a directory)"),
    "a symlink to /dev/zero": (
        lambda p: p.symlink_to("/dev/zero"),
        "is not a regular file (a character device)",
    ),
    "a FIFO": (_fifo, "is not a regular file (a FIFO)"),
    "a dangling symlink": (lambda p: p.symlink_to(p.parent / "nowhere"), "cannot be read (No such file"),
}


@parametrize_first_by_default("kind", list(NOT_FILES))
def test_a_checkpoint_that_is_not_a_regular_file_is_refused_before_anything_is_written(interrupted, kind):
    make, needle = NOT_FILES[kind]
    path = interrupted / "checkpoint.pt"
    path.unlink()
    make(path)
    metrics = (interrupted / "metrics.jsonl").read_bytes()
    outcome = invoke(["resume", str(interrupted), "-q"])
    assert outcome.exception is None and outcome.code == 2, outcome.output
    assert outcome.lines == [f"error: {path}: {needle}"] or (
        len(outcome.lines) == 1 and outcome.lines[0].startswith(f"error: {path}: {needle}")
    ), outcome.output
    assert (interrupted / "metrics.jsonl").read_bytes() == metrics


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    with path.open("r+b" if path.exists() else "wb") as f:
        f.write(head)
        f.truncate(size)


def test_sizes_are_checked_against_the_header_before_reading(interrupted):
    """A checkpoint grown to 64 GiB (sparse), 64 GiB of zeros, and a header that claims a body larger
    than the machine's memory: each refused at once, naming the file, without reading the body."""
    path = interrupted / "checkpoint.pt"
    data = path.read_bytes()
    magic, header, body = data.split(b"\n", 2)
    cases = {
        "grown": (
            data,
            64 * 2**30,
            f"is damaged: {len(data):,} bytes expected from its header, {64 * 2**30:,} on disk",
        ),
        "zeros": (b"", 64 * 2**30, "is not a fedge checkpoint"),
    }
    claim = json.loads(header) | {"body_bytes": 2**43}
    head = magic + b"\n" + json.dumps(claim).encode() + b"\n"
    cases["claims 8 TiB"] = (head, len(head) + 2**43, "its body of 8.0 TiB is more than the memory available")
    for name, (content, size, needle) in cases.items():
        path.unlink()
        _sparse(path, size, content)
        started = time.monotonic()
        with pytest.raises(CheckpointError) as error:
            checkpoint.load(path)
        assert str(error.value).startswith(f"{path}: ") and needle in str(error.value), (
            name,
            str(error.value),
        )
        assert time.monotonic() - started < 5, name


def test_state_made_as_rounds_go_fits_and_nothing_else_does():
    """``None``, empty dicts and empty lists of a fresh algorithm fill as it runs (peers, auxiliary heads
    of clients that trained); every other entry keeps its keys, lengths, shapes, dtypes and kind."""
    from fedge.runner.restore import mismatch

    fresh = {"w": torch.zeros(2, 3), "aux": {}, "seen": [], "peers": None, "t": 0, "name": "x"}
    grown = {**fresh, "aux": {0: torch.ones(4)}, "seen": [1, 2], "peers": torch.ones(3, 3, dtype=torch.bool)}
    assert mismatch(fresh, grown) is None and mismatch(fresh, {**fresh, "t": 7.5}) is None
    assert (
        mismatch(fresh, {**fresh, "w": torch.zeros(3, 2)})
        == "/w is a float32 tensor of shape [3, 2], not a float32 tensor of shape [2, 3]"
    )
    assert mismatch(fresh, {**fresh, "aux": [1]}) == "/aux is of type list, not of type dict"
    assert mismatch(fresh, {**fresh, "t": True}) == "/t is of type bool, not of type int"
    assert mismatch({"a": [1, 2]}, {"a": [1]}) == "/a holds 1 items, not 2"
    assert mismatch({"a": {"b": 1}}, {"a": {"c": 1}}) == "/a has entries ['c'] it should not, lacks ['b']"


# --- a round costs the same however many rounds are behind it ------------------------------------------


def test_a_checkpoint_does_not_grow_with_the_rounds_behind_it(tmp_path):
    """The past (rows, ledger transfers) goes to the append-only journal: the checkpoint after round 30
    is the size of the one after round 3 (a row is about 1 KB), and the journal grows by the same bytes
    per round."""
    sizes = {}
    for rounds in (3, 30):
        result = fedge.run(tiny("fedavg", tmp_path / f"r{rounds}", rounds=rounds))
        path = result.run_dir / "checkpoint.pt"
        sizes[rounds] = (path.stat().st_size, checkpoint.journal_path(path).stat().st_size)
    assert abs(sizes[30][0] - sizes[3][0]) < 16, sizes  # the header's numbers have more digits
    assert 5 < sizes[30][1] / sizes[3][1] < 15, sizes  # about ten times the rounds, ten times the journal


def test_every_round_appends_its_row_instead_of_rewriting_the_file(tmp_path):
    config = tiny("fedavg", tmp_path / "runs", rounds=4)
    seen = []
    fedge.run(
        config,
        on_round=lambda t, row: seen.append(
            os.stat(tmp_path / "runs" / "fedavg-synthetic" / "metrics.jsonl")
        ),
    )
    assert len({info.st_ino for info in seen}) == 1, "metrics.jsonl was replaced, not appended to"
    assert [info.st_size for info in seen] == sorted({info.st_size for info in seen})


def test_a_kill_between_the_journal_and_the_checkpoint_resumes_to_the_identical_run(interrupted, tmp_path):
    """What a kill after round 3's journal record and metrics line, before its checkpoint, leaves: both
    files longer than the round-2 checkpoint says (a half line, a half record); resume drops the rest."""
    with checkpoint.journal_path(interrupted / "checkpoint.pt").open("ab") as journal:
        journal.write(os.urandom(300))
    with (interrupted / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"round": 3, "accur')
    result = fedge.resume(interrupted)
    reference = fedge.run(tiny("fedavg", tmp_path / "reference", rounds=4))
    wall = ("wall_seconds",)
    strip = [
        [{k: v for k, v in row.items() if k not in wall} for row in rows]
        for rows in (results.read_jsonl(interrupted / "metrics.jsonl"), result.metrics, reference.metrics)
    ]
    assert strip[0] == strip[1] == strip[2]
    assert (interrupted / "ledger.csv").read_bytes() == (reference.run_dir / "ledger.csv").read_bytes()


def _cut_journal(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def _flip_journal(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[20] ^= 1
    path.write_bytes(bytes(data))


JOURNAL_FAULTS = {
    "truncated": (_cut_journal, "is damaged: the checkpoint records "),
    "a flipped byte": (_flip_journal, "is damaged: its checksum does not match"),
    "lost": (lambda p: p.unlink(), "cannot be read (No such file"),
    "a FIFO": (lambda p: (p.unlink(), os.mkfifo(p)), "is not a regular file (a FIFO)"),
}


@pytest.mark.parametrize("fault", list(JOURNAL_FAULTS))
def test_a_damaged_journal_is_refused_in_one_line_and_nothing_changes(interrupted, fault):
    damage, needle = JOURNAL_FAULTS[fault]
    path = checkpoint.journal_path(interrupted / "checkpoint.pt")
    damage(path)
    before = {k: v for k, v in _snapshot(interrupted).items() if k != path.name}
    outcome = invoke(["resume", str(interrupted), "-q"])
    assert outcome.exception is None and outcome.code == 2, outcome.output
    assert len(outcome.lines) == 1 and outcome.lines[0].startswith(f"error: {path}: {needle}"), outcome.output
    assert {k: v for k, v in _snapshot(interrupted).items() if k != path.name} == before


def test_a_row_being_appended_is_not_read_as_damage(interrupted):
    """A reader (``fedge plot``, a resume) of a live or killed run may meet the last line half-written."""
    rows = results.read_jsonl(interrupted / "metrics.jsonl")
    with (interrupted / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"round": 3, "accur')
    assert results.read_jsonl(interrupted / "metrics.jsonl") == rows
    assert invoke(["plot", str(interrupted)]).code == 0


def test_keys_added_later_leave_older_checkpoints_digest_alone():
    """A run's digest at the defaults of ``algorithm.nopeek`` and ``eval.attacks`` is the one a fedge
    without those keys wrote, so its checkpoints still resume; a set value does change it."""
    import hashlib
    import json

    from fedge.config import parse_config
    from fedge.runner.checkpoint import config_digest

    config = parse_config({"algorithm": {"name": "splitfed_v2"}, "model": {"cut": 1}})
    older = config.model_dump(mode="json", exclude={"output", "stop", "rounds", "aggregation"})
    del older["algorithm"]["nopeek"], older["eval"]["attacks"]
    assert config_digest(config) == hashlib.sha256(json.dumps(older, sort_keys=True).encode()).hexdigest()
    assert config_digest(
        config.model_copy(update={"algorithm": config.algorithm.model_copy(update={"nopeek": 1.0})})
    ) != config_digest(config)
