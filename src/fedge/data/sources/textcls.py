"""Text classification datasets for sequence classifiers: every window of a document labeled by its class.

``textcls`` reads ``data.root``, a ``.txt`` / ``.jsonl`` file or a folder of them. A ``.txt`` file is one
document whose class is the file; a ``.jsonl`` line is an object with a ``text`` field and, optionally, a
``label`` field: the lines of one file with one label form one document of that label (no ``label``: the
file is the class, as for ``.txt``). Without ``data.root`` the documents are the Python standard-library
modules of the ``pystdlib`` source, each its own class (which module a window of source code comes from:
a task with no download). Labels are the sorted distinct names (file names, modules, or the ``label``
values as strings), numbered from 0.

Each document is tokenized and cut into consecutive full windows of ``data.seq_len`` tokens, each a sample
labeled with its document's class; a short tail is dropped and a document shorter than one window is an
error. So no sequence is padded: every position a model reads is a real token, and the ledger's
``tokens x hidden x bits`` counts no pad position. The last ``data.test_fraction`` of each document's
windows is held out (a contiguous tail); each document is a natural group (``partition.kind: natural``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedge.config import DataConfig
from fedge.data.dataset import Dataset
from fedge.data.sources.text import _read, held_out, stdlib_documents, text_documents
from fedge.data.tokenizer import Tokenizer, make_tokenizer
from fedge.errors import DataError


def windows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Consecutive full windows ``[n, seq_len]`` of ``tokens``; a short tail is dropped."""
    count = len(tokens) // seq_len
    return tokens[: count * seq_len].reshape(count, seq_len)


def _labeled_jsonl(path: Path, limit: int | None) -> list[tuple[str, str, str]]:
    """A JSONL file's documents ``(title, label, text)``: its lines joined per ``label`` field."""
    texts: dict[str, list[str]] = {}
    for number, line in enumerate(_read(path, None).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            texts.setdefault(str(record.get("label", path.name)), []).append(str(record["text"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DataError(f"{path}:{number}: a JSONL line must be an object with a 'text' field") from None
    clip = lambda t: t if limit is None else t.encode("utf-8")[:limit].decode("utf-8", errors="ignore")  # noqa: E731
    return [(f"{path.name}:{label}", label, clip("\n".join(parts))) for label, parts in texts.items()]


def labeled_documents(root: Path | None, limit: int | None) -> list[tuple[str, str, str]]:
    """Every document ``(title, label, text)`` of ``data.root`` (module docstring)."""
    files = text_documents(root, limit)  # checks data.root; .txt texts read here
    folder = Path(root).expanduser()  # type: ignore[arg-type]
    documents = []
    for name, text in files:
        path = folder if folder.is_file() else folder / name
        documents += _labeled_jsonl(path, limit) if path.suffix == ".jsonl" else [(name, name, text)]
    return documents


def classification_dataset(
    documents: list[tuple[str, str, str]], tokenizer: Tokenizer, seq_len: int, test_fraction: float
) -> Dataset:
    """The windowed, held-out-tailed classification dataset of labeled ``documents``."""
    labels = sorted({label for _, label, _ in documents})
    if len(labels) < 2:
        raise DataError(f"textcls: {len(labels)} class in data.root; a classifier needs at least two")
    index = {label: i for i, label in enumerate(labels)}
    parts: dict[str, list[np.ndarray]] = {"x_train": [], "y_train": [], "g_train": [], "x_test": [],
                                          "y_test": [], "g_test": []}  # fmt: skip
    for group, (title, label, text) in enumerate(documents):
        rows = windows(tokenizer.encode(text), seq_len)
        if not len(rows):
            raise DataError(f"textcls: {title} has fewer than {seq_len} tokens (data.seq_len {seq_len})")
        cut = len(rows) - held_out(len(rows), test_fraction)
        for split, chunk in (("train", rows[:cut]), ("test", rows[cut:])):
            parts[f"x_{split}"].append(chunk)
            parts[f"y_{split}"].append(np.full(len(chunk), index[label], dtype=np.int64))
            parts[f"g_{split}"].append(np.full(len(chunk), group, dtype=np.int64))
    joined = {key: np.concatenate(value) for key, value in parts.items()}
    if not len(joined["x_test"]):
        raise DataError("textcls: no document is long enough to hold out a test window; lower data.seq_len")
    tensor = lambda key: torch.from_numpy(np.ascontiguousarray(joined[key]))  # noqa: E731
    return Dataset(
        name="textcls",
        x_train=tensor("x_train"),
        y_train=tensor("y_train"),
        x_test=tensor("x_test"),
        y_test=tensor("y_test"),
        num_classes=len(labels),
        train_groups=joined["g_train"],
        test_groups=joined["g_test"],
    )


def load_textcls(cfg: DataConfig, seed: int) -> Dataset:
    """Text classification: .txt / .jsonl files of data.root, windows labeled by file or 'label' field
    (without data.root: Python standard-library modules, one class each)."""
    tokenizer = make_tokenizer(cfg.tokenizer, cfg.download)
    if cfg.root is None:  # the offline default: which standard-library module a window comes from
        documents = [(name, name, text) for name, text in stdlib_documents(cfg.text_bytes)]
    else:
        documents = labeled_documents(cfg.root, cfg.text_bytes)
    return classification_dataset(documents, tokenizer, cfg.seq_len, cfg.test_fraction)
