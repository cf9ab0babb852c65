"""What a verified checkpoint must say before a run continues from it.

The checksum of :mod:`fedge.runner.checkpoint` proves a file is whole, not that it is true: anyone who can
write the file can recompute it. So before a resume changes anything, the state must make sense for the run
that reads it: its round is one of the run's rounds and the header's; the algorithm's state has the
entries, tensor shapes and dtypes of the freshly built algorithm; the metrics history holds one row per
round up to that round, and agrees with the rows ``metrics.jsonl`` already has for those rounds. A state
that fails is a one-line :class:`~fedge.errors.CheckpointError`, raised before anything is restored.
The rows and the ledger's transfers come from the checkpoint's journal (:func:`with_history`).
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedge.config import RunConfig
from fedge.errors import CheckpointError, PathError
from fedge.files import results
from fedge.runner.checkpoint import Checkpoint


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {list(value.shape)}"
    return f"of type {type(value).__name__}"


def mismatch(fresh: Any, saved: Any, where: str = "") -> str | None:
    """Where ``saved`` differs in structure from ``fresh`` (entries, lengths, tensor shapes and dtypes,
    kinds of value), or ``None``. An entry that is ``None``, an empty dict or an empty list in the fresh
    state may hold anything of its kind: state an algorithm makes as rounds go (its first round's peers,
    a client's auxiliary head once it trained)."""
    if fresh is None:
        return None
    if isinstance(fresh, dict | list) and not fresh and isinstance(saved, type(fresh)):
        return None
    if isinstance(fresh, torch.Tensor | np.ndarray):
        same = type(saved) is type(fresh) and saved.shape == fresh.shape and saved.dtype == fresh.dtype
        return None if same else f"{where or '/'} is {_describe(saved)}, not {_describe(fresh)}"
    if isinstance(fresh, dict):
        if not isinstance(saved, dict):
            return f"{where or '/'} is {_describe(saved)}, not of type dict"
        if set(saved) != set(fresh):
            extra, missing = (
                sorted(map(str, set(saved) - set(fresh))),
                sorted(map(str, set(fresh) - set(saved))),
            )
            return f"{where or '/'} has entries {extra} it should not, lacks {missing}"
        return next((m for k in fresh if (m := mismatch(fresh[k], saved[k], f"{where}/{k}"))), None)
    if isinstance(fresh, list | tuple):
        if type(saved) is not type(fresh):
            return f"{where or '/'} is {_describe(saved)}, not {_describe(fresh)}"
        if len(saved) != len(fresh):
            return f"{where or '/'} holds {len(saved)} items, not {len(fresh)}"
        return next((m for i, f in enumerate(fresh) if (m := mismatch(f, saved[i], f"{where}[{i}]"))), None)
    if isinstance(fresh, bool | str) or not isinstance(fresh, numbers.Number):
        same = type(saved) is type(fresh)
    else:
        same = isinstance(saved, numbers.Number) and not isinstance(saved, bool)
    return None if same else f"{where or '/'} is {_describe(saved)}, not {_describe(fresh)}"


def _history(rows: Any, round_: int) -> str | None:
    """Why ``rows`` is not the metrics history of rounds 1..``round_`` (``None``: it is)."""
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        return f"is {_describe(rows)}, not a list of rows"
    numbers_ = [row.get("round") for row in rows]
    if numbers_ != list(range(1, round_ + 1)):
        shown = numbers_ if len(numbers_) <= 8 else [*numbers_[:4], "...", *numbers_[-3:]]
        return f"has rows of rounds {shown}, not of 1..{round_}"
    return None


def with_history(saved: Checkpoint, path: Path) -> Checkpoint:
    """``saved`` with its journal's records put back into its state: every metrics row under ``rows``
    and every ledger transfer under ``ledger/columns``, as a checkpoint that held the whole past would
    have them (a format-1 checkpoint holds them already; ``path`` names the journal in a refusal)."""
    state = dict(saved.state)
    if not saved.records:
        return Checkpoint(saved.header, state, [], saved.journal)
    try:
        rows = [row for record in saved.records for row in record["rows"]]
        ledger = dict(state["ledger"])
        parts = {key: [ledger.get("columns", {}).get(key)] for key in saved.records[0]["ledger"]}
        for record in saved.records:
            if set(record["ledger"]) != set(parts):
                raise ValueError("its records name different ledger columns")
            for key, column in record["ledger"].items():
                parts[key].append(column)
        columns = {}
        for key, found in parts.items():
            kept = [np.asarray(part) for part in found if part is not None and len(part)]
            columns[key] = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(
            path, f"does not fit its checkpoint ({type(error).__name__}: {error})"
        ) from None
    state.update(rows=[*state.get("rows", []), *rows], ledger={**ledger, "columns": columns})
    return Checkpoint(saved.header, state, saved.records, saved.journal)


def _written(row: dict[str, Any]) -> dict[str, Any]:
    """A row as ``metrics.jsonl`` holds it."""
    return json.loads(json.dumps(results.strict_json(row), allow_nan=False))


def check(saved: Checkpoint, config: RunConfig, fresh: dict[str, Any], path: Path, metrics: Path) -> None:
    """Refuse ``saved`` unless it makes sense for this run (see the module); ``fresh`` is the freshly built
    run's state under the same keys (``algorithm``...)."""
    state, header = saved.state, saved.header
    round_ = state.get("round")
    if type(round_) is not int or not 1 <= round_ <= config.rounds:
        raise CheckpointError(path, f"round {round_} is not a round of this run (1..{config.rounds})")
    if header["round"] != round_:
        raise CheckpointError(path, f"its header says round {header['round']} but its state round {round_}")
    for key, reference in fresh.items():
        if key not in state:
            raise CheckpointError(path, f"has no {key} state")
        found = mismatch(reference, state[key])
        if found is not None:
            raise CheckpointError(path, f"{key} state does not fit this run: {found}")
    problem = _history(state.get("rows"), round_)
    if problem is not None:
        raise CheckpointError(path, f"metrics history {problem}")
    if not metrics.is_file():
        return  # lost: resume writes it again from the checkpoint's rows
    try:
        written = results.read_jsonl(metrics)
    except PathError:
        return  # damaged: resume writes it again from the checkpoint's rows
    for row in state["rows"]:
        if row["round"] <= len(written) and _written(row) != written[row["round"] - 1]:
            raise CheckpointError(
                path, f"metrics history disagrees with {metrics.name} at round {row['round']}"
            )
