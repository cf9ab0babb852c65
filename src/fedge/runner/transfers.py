"""The recorded transfers in a run directory (``output.record``): one ``records/round-TTTTT.npz`` per
recorded round, written atomically, and ``records/manifest.json`` saying what they hold and cost.

The manifest is rebuilt from the folder after every write, so a resumed run that replays rounds leaves
it true: a replayed round rewrites its file with the same numbers (every draw of the recorder comes from
the run seed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import IO, Any

import numpy as np

from fedge.config import RunConfig
from fedge.files import results

RECORDS = "records"
MANIFEST = "manifest.json"
ROUND_FILE = re.compile(r"^round-(\d{5})\.npz$")


def round_path(run_dir: Path, t: int) -> Path:
    """Where round ``t``'s record goes."""
    return Path(run_dir) / RECORDS / f"round-{t:05d}.npz"


def write_round(run_dir: Path, t: int, arrays: dict[str, np.ndarray], config: RunConfig) -> None:
    """Write round ``t``'s record (nothing for an empty one) and the manifest after it."""
    if not arrays:
        return
    folder = Path(run_dir) / RECORDS
    folder.mkdir(exist_ok=True)

    def save(handle: IO[bytes]) -> None:
        savez: Any = np.savez  # numpy's stubs read the keyword arrays as its allow_pickle flag
        savez(handle, **arrays)

    results.atomic_write(round_path(run_dir, t), save)
    results.write_json(folder / MANIFEST, manifest(run_dir, config))


def recorded_rounds(run_dir: Path) -> list[int]:
    """The rounds with a record in ``run_dir``, in order."""
    folder = Path(run_dir) / RECORDS
    if not folder.is_dir():
        return []
    found = (ROUND_FILE.match(path.name) for path in folder.iterdir())
    return sorted(int(match[1]) for match in found if match)


def _counts(path: Path) -> dict[str, int]:
    """How many cut transfers and client updates a round's record holds."""
    with np.load(path, allow_pickle=False) as held:
        cut = len(held["cut/sample"]) if "cut/sample" in held.files else 0
        updates = len(held["updates/client"]) if "updates/client" in held.files else 0
    return {"cut_transfers": cut, "updates": updates}


def manifest(run_dir: Path, config: RunConfig) -> dict[str, Any]:
    """What the run's records hold: the kinds, every recorded round with its file size and counts, and
    the total bytes (the attacker's view and the ground truth the scoring reads together)."""
    rounds = {}
    for t in recorded_rounds(run_dir):
        path = round_path(run_dir, t)
        rounds[str(t)] = {"file": path.name, "bytes": path.stat().st_size, **_counts(path)}
    output = config.output
    return {
        "kinds": list(output.record),
        "every": output.record_every,
        "samples": output.record_samples,
        "clients": output.record_clients,
        "rounds": rounds,
        "bytes": sum(entry["bytes"] for entry in rounds.values()),
    }


def summary(run_dir: Path, config: RunConfig) -> dict[str, Any]:
    """The summary's ``recorded`` field: kinds, rounds and bytes (none without ``output.record``)."""
    if not config.output.record:
        return {}
    held = manifest(run_dir, config)
    return {"recorded": {"kinds": held["kinds"], "rounds": len(held["rounds"]), "bytes": held["bytes"]}}
