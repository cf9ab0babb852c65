"""Text classification datasets for sequence classifiers: windows of a document, or its lines, labeled by
its class.

``textcls`` reads ``data.root``, a ``.txt`` / ``.jsonl`` file or a folder of them. A ``.txt`` file is one
document whose class is the file; a ``.jsonl`` line is an object with a ``text`` string and, optionally, a
``label`` (a string or a number): the lines of one file with one label form one document of that label
(no ``label``: the file is the class, as for ``.txt``). Without ``data.root`` the documents are the Python
standard-library modules of the ``pystdlib`` source, each its own class (which module a window of source
code comes from: a task with no download). Labels are the sorted distinct names (file names, modules, or
the ``label`` values as strings), numbered from 0.

``data.sequences`` says what a sample is:

- ``windows`` (the default): each document is tokenized and cut into consecutive full windows, each
  framed as one sample by the tokenizer's special tokens (a Hugging Face BERT tokenizer's
  ``[CLS] window [SEP]``, which a pretrained pooler expects; bytes have none) to ``data.seq_len`` tokens
  in all, and labeled with its document's class; a short tail is dropped and a document shorter than one
  window is an error. No sequence is padded.
- ``lines``: each non-blank line of a document (for ``.jsonl``, each record, its own line breaks read as
  spaces; surrounding white space stripped) is one sample, as sentence-level tasks (sentiment, topic)
  are: tokenized as one sample (a Hugging Face tokenizer adds its special tokens, BERT's
  ``[CLS] text [SEP]``, which a pretrained pooler expects; bytes have none), cut to ``data.seq_len``
  tokens (the text is truncated, the special tokens kept) and right-padded to ``data.seq_len`` with the
  tokenizer's pad id (the byte tokenizer's is 0, the NUL byte; a Hugging Face tokenizer's its
  ``[PAD]``). The model masks the pad positions (``bert``: every attention, and the cut, where they are
  never sent, so the ledger counts real tokens only) and must pad on the same id, which the run checks.

A real token equal to the pad id (a NUL byte in a text, for the byte tokenizer) is an error in both
modes: the model would read it as padding. The last ``data.test_fraction`` of each document's samples is
held out (a contiguous tail); each document is a natural group (``partition.kind: natural``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedge.config import DataConfig
from fedge.data.dataset import Dataset
from fedge.data.sources.text import (
    held_out,
    jsonl_records,
    pad_token,
    refuse_pad_tokens,
    right_filled,
    sample_lines,
    stdlib_documents,
    text_documents,
)
from fedge.data.tokenizer import Tokenizer, make_tokenizer
from fedge.errors import ConfigError, DataError


def windows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Consecutive full windows ``[n, seq_len]`` of ``tokens``; a short tail is dropped."""
    count = len(tokens) // seq_len
    return tokens[: count * seq_len].reshape(count, seq_len)


def framed_windows(title: str, text: str, tokenizer: Tokenizer, seq_len: int) -> np.ndarray:
    """Document ``title``'s consecutive full windows, each framed as one sample by the tokenizer's special
    tokens (BERT: ``[CLS] window [SEP]``) to ``seq_len`` tokens in all: ``[windows, seq_len]``."""
    width = seq_len - tokenizer.framing
    if width < 1:
        special = f"{tokenizer.name}'s {tokenizer.framing} special tokens"
        refused = f"{seq_len} leaves no room for a text between {special}"
        raise ConfigError("data.seq_len", refused)
    rows = windows(tokenizer.encode(text), width)
    if not len(rows):
        raise DataError(f"textcls: {title} has fewer than {width} tokens (data.seq_len {seq_len})")
    return np.stack([tokenizer.frame(row) for row in rows])


def _labeled_jsonl(path: Path, limit: int | None, one_line: bool) -> list[tuple[str, str, str]]:
    """A JSONL file's documents ``(title, label, text)``: its lines joined per ``label`` field, each
    record on one line of its own when ``one_line`` (its line breaks read as spaces)."""
    texts: dict[str, list[str]] = {}
    for number, record in jsonl_records(path):
        text = " ".join(record["text"].splitlines()) if one_line else record["text"]
        label = record.get("label", path.name)
        if isinstance(label, bool) or not isinstance(label, str | int | float):
            raise DataError(f"{path}:{number}: 'label' must be a string or a number (got {label!r:.40})")
        texts.setdefault(str(label), []).append(text)
    clip = lambda t: t if limit is None else t.encode("utf-8")[:limit].decode("utf-8", errors="ignore")  # noqa: E731
    return [(f"{path.name}:{label}", label, clip("\n".join(parts))) for label, parts in texts.items()]


def labeled_documents(
    root: Path | None, limit: int | None, one_line: bool = False
) -> list[tuple[str, str, str]]:
    """Every document ``(title, label, text)`` of ``data.root`` (module docstring); ``one_line`` puts each
    JSONL record on a line of its own."""
    files = text_documents(root, limit)  # checks data.root; .txt texts read here
    folder = Path(root).expanduser()  # type: ignore[arg-type]
    documents = []
    for name, text in files:
        path = folder if folder.is_file() else folder / name
        jsonl = path.suffix == ".jsonl"
        documents += _labeled_jsonl(path, limit, one_line) if jsonl else [(name, name, text)]
    return documents


def padded_samples(title: str, text: str, tokenizer: Tokenizer, seq_len: int, pad_id: int) -> np.ndarray:
    """Each non-blank line of document ``title``'s ``text`` as token ids cut to ``seq_len`` and
    right-padded with ``pad_id``: ``[lines, seq_len]``."""
    lines = [tokenizer.encode_sample(line, seq_len) for line in sample_lines(text)]
    return right_filled("textcls", title, lines, seq_len, pad_id, pad_id)


def classification_dataset(
    documents: list[tuple[str, str, str]],
    tokenizer: Tokenizer,
    seq_len: int,
    test_fraction: float,
    sequences: str = "windows",
) -> Dataset:
    """The held-out-tailed classification dataset of labeled ``documents``: full windows, or padded lines
    (``sequences``, module docstring)."""
    labels = sorted({label for _, label, _ in documents})
    if len(labels) < 2:
        raise DataError(f"textcls: {len(labels)} class in data.root; a classifier needs at least two")
    index = {label: i for i, label in enumerate(labels)}
    parts: dict[str, list[np.ndarray]] = {"x_train": [], "y_train": [], "g_train": [], "x_test": [],
                                          "y_test": [], "g_test": []}  # fmt: skip
    pad = pad_token(tokenizer) if sequences == "lines" else None
    for group, (title, label, text) in enumerate(documents):
        if pad is not None:
            rows = padded_samples(title, text, tokenizer, seq_len, pad)
            if not len(rows):
                raise DataError(f"textcls: {title} has no line of text (data.sequences: lines)")
        else:
            rows = framed_windows(title, text, tokenizer, seq_len)
            refuse_pad_tokens("textcls", title, rows, tokenizer.pad_id)
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
        pad_id=pad,
    )


def load_textcls(cfg: DataConfig, seed: int) -> Dataset:
    """Text classification: .txt / .jsonl files of data.root, windows labeled by file or 'label' field
    (without data.root: Python standard-library modules, one class each)."""
    tokenizer = make_tokenizer(cfg.tokenizer, cfg.download)
    if cfg.root is None:  # the offline default: which standard-library module a window comes from
        documents = [(name, name, text) for name, text in stdlib_documents(cfg.text_bytes)]
    else:
        documents = labeled_documents(cfg.root, cfg.text_bytes, one_line=cfg.sequences == "lines")
    return classification_dataset(documents, tokenizer, cfg.seq_len, cfg.test_fraction, cfg.sequences)
