"""Text datasets for language models: documents tokenized, packed into sequences (or one padded sequence
per line), a tail held out.

Every text source yields named documents; each document is a natural group (a client under the
``natural`` partitioner). ``data.sequences`` says what a sample is:

- ``windows`` (the default): a document's tokens are packed into windows of ``data.seq_len + 1`` tokens,
  one after another with no padding: the input is a window's first ``seq_len`` tokens and the targets
  its last ``seq_len`` (the next token at every position), so every token is predicted once.
- ``lines``: each non-blank line of a document (white space around it stripped; a ``.jsonl`` record's
  ``text`` is one line, its own line breaks read as spaces) is one sample, as instruction or chat data
  is: tokenized as one stand-alone sample (a Hugging Face tokenizer adds its own special tokens, a
  LLaMA tokenizer's BOS; bytes have none), cut to ``seq_len + 1`` tokens, its input the first of them and
  its targets the next token at each input position. Both are right-padded to ``seq_len``: the input
  with the tokenizer's pad id, the targets with
  :data:`~fedge.data.dataset.IGNORED_TARGET`, which no loss, gradient or count reads. A line of one
  token predicts nothing and is skipped; a document with no longer line is an error. The model is told
  the pad id, and its pad positions cross the cut as nothing (:mod:`fedge.models.transformer`). A real
  token equal to the pad id (a NUL byte, for bytes) is refused: the model would read it as padding.

The last ``data.test_fraction`` of each document's samples (at least one, when it has two) is held out for
evaluation: a contiguous tail, so no held-out token is ever an input or target of training.

Sources:

- ``pystdlib``: the source files of Python standard-library modules, present in every Python install:
  a corpus with no download whose documents differ as their modules do (argument parsing, e-mail, HTTP,
  calendars...), the naturally non-i.i.d. split of a character-level model.
- ``text``: ``data.root``, a ``.txt`` / ``.jsonl`` file or a folder of them (one document per file; a
  JSONL line is an object whose ``text`` field, a string, is read). Only regular files are read (a FIFO
  or a device in the folder is refused without waiting on it), each of at most 1 GiB unless
  ``data.text_bytes`` asks for less of it.
- ``shakespeare``: LEAF's Shakespeare json (``train/`` and ``test/`` folders in ``data.root``, or in the
  cache folder without it), one group per speaking role, each sample its 80 characters followed by the next
  one (fixed-length samples: ``windows`` only). Where the json is absent it is built from Project
  Gutenberg's edition that LEAF reads (a ``100.txt`` in that folder, or downloaded with
  ``data.download``; :mod:`fedge.data.sources.gutenberg`).
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedge.config import DataConfig
from fedge.data.dataset import IGNORED_TARGET, Dataset
from fedge.data.sources import gutenberg
from fedge.data.sources.fetch import cache_folder, not_found
from fedge.data.tokenizer import Tokenizer, make_tokenizer
from fedge.errors import ConfigError, DataError
from fedge.files.regular import NotReadable, read_regular

# Pure-Python standard-library modules (a file or a package's __init__) of every supported Python version
STDLIB_MODULES = (
    "argparse", "ast", "bdb", "calendar", "cmd", "code", "codecs", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "dis", "doctest", "email/message",
    "enum", "fractions", "ftplib", "functools", "gettext", "glob", "gzip", "heapq", "hmac", "http/client",
    "http/cookiejar", "imaplib", "inspect", "ipaddress", "json/decoder", "locale", "logging", "mailbox",
    "netrc", "operator", "optparse", "pickle", "pprint", "queue", "random", "shlex", "shutil", "smtplib",
    "statistics", "string", "tarfile", "textwrap", "threading", "tokenize", "typing", "unittest/case",
    "urllib/parse", "uuid", "wave", "zipfile",
)  # fmt: skip
MAX_TEXT_BYTES = 2**30  # a text file larger than this is refused unread (or read in part: data.text_bytes)
LEAF_HOW_TO = "run LEAF's shakespeare preprocessing (https://github.com/TalwarLab/leaf) and set data.root"


def pack(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Consecutive windows ``[n, seq_len + 1]`` of ``tokens``, each starting where the last one's targets
    end (window i covers tokens ``i*seq_len .. (i+1)*seq_len``); a short tail is dropped."""
    count = max(0, (len(tokens) - 1) // seq_len)
    starts = np.arange(count)[:, None] * seq_len
    return tokens[starts + np.arange(seq_len + 1)[None, :]]


def held_out(count: int, fraction: float) -> int:
    """Windows of a document held out for testing: its ``fraction``, at least one when it has two."""
    return 0 if count < 2 else min(count - 1, max(1, round(fraction * count)))


def pad_token(tokenizer: Tokenizer) -> int:
    """The tokenizer's pad id; a Hugging Face tokenizer without one is refused (``data.tokenizer``)."""
    pad = tokenizer.pad_id
    if pad is None:
        refused = f"{tokenizer.name} has no pad token; data.sequences: lines needs one"
        raise ConfigError("data.tokenizer", refused)
    return int(pad)


def refuse_pad_tokens(name: str, title: str, tokens: np.ndarray, pad: int | None) -> None:
    """A real token equal to the pad id is refused: a model would read it as padding."""
    if pad is not None and bool((tokens == pad).any()):
        byte = " (a NUL byte)" if pad == 0 else ""
        raise DataError(f"{name}: {title} holds the pad token id {pad}{byte}, which a model reads as pad")


def sample_lines(text: str) -> list[str]:
    """A document's non-blank lines, white space around each stripped: one sample each."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def right_filled(
    name: str, title: str, samples: list[np.ndarray], width: int, fill: int, pad: int
) -> np.ndarray:
    """Document ``title``'s token ``samples`` (each at most ``width``) right-filled with ``fill``:
    ``[samples, width]``; a real token equal to the pad id is refused."""
    rows = np.full((len(samples), width), fill, dtype=np.int64)
    for row, ids in zip(rows, samples, strict=True):
        refuse_pad_tokens(name, title, ids, pad)
        row[: len(ids)] = ids
    return rows


def padded_lines(name: str, title: str, text: str, tokenizer: Tokenizer, seq_len: int) -> np.ndarray:
    """Each line of document ``title`` of at least two tokens, cut to ``seq_len + 1`` tokens:
    ``[lines, seq_len + 1]``, the tail of a short line :data:`IGNORED_TARGET` (module docstring)."""
    encoded = [tokenizer.encode_sample(line, seq_len + 1) for line in sample_lines(text)]
    encoded = [ids for ids in encoded if len(ids) >= 2]
    return right_filled(name, title, encoded, seq_len + 1, IGNORED_TARGET, pad_token(tokenizer))


def _inputs_and_targets(rows: np.ndarray, pad: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (each row's first ``seq_len`` tokens) and targets (the next token at each position) of
    ``[n, seq_len + 1]`` token rows; an input whose target is ignored (a padded line's last token and
    the padding after it) is the pad id, so a position is real in both or in neither."""
    x, y = rows[:, :-1].copy(), rows[:, 1:]
    if pad is not None:
        x[y == IGNORED_TARGET] = pad
    as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return as_tensor(x), as_tensor(y)


def token_dataset(
    name: str, documents: list[tuple[str, str]], tokenizer: Tokenizer, seq_len: int, test_fraction: float,
    sequences: str = "windows",
) -> Dataset:  # fmt: skip
    """The held-out-tailed token dataset of named ``documents``: packed windows, or padded lines
    (``sequences``, module docstring)."""
    lines = sequences == "lines"
    train, test, train_groups, test_groups = [], [], [], []
    for group, (title, text) in enumerate(documents):
        if lines:
            rows = padded_lines(name, title, text, tokenizer, seq_len)
            if not len(rows):
                raise DataError(f"{name}: {title} has no line of two tokens or more (data.sequences: lines)")
        else:
            rows = pack(tokenizer.encode(text), seq_len)
            if not len(rows):
                short = f"has fewer than {seq_len + 1} tokens (data.seq_len {seq_len})"
                raise DataError(f"{name}: {title} {short}")
        cut = len(rows) - held_out(len(rows), test_fraction)
        train.append(rows[:cut])
        test.append(rows[cut:])
        train_groups += [group] * cut
        test_groups += [group] * (len(rows) - cut)
    if not documents:
        raise DataError(f"{name}: no documents")
    rows_train, rows_test = np.concatenate(train), np.concatenate(test)
    if not len(rows_test):
        raise DataError(f"{name}: no document is long enough to hold out a test sample; lower data.seq_len")
    pad = pad_token(tokenizer) if lines else None
    x_train, y_train = _inputs_and_targets(rows_train, pad)
    x_test, y_test = _inputs_and_targets(rows_test, pad)
    return Dataset(
        name=name,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=tokenizer.vocab_size,
        train_groups=np.asarray(train_groups, dtype=np.int64),
        test_groups=np.asarray(test_groups, dtype=np.int64),
        pad_id=pad,
    )


def _read(path: Path, limit: int | None, key: str = "data.root") -> str:
    """A file's text (its first ``limit`` bytes), as UTF-8 with undecodable bytes replaced; only a regular
    file (a FIFO or a device is refused without waiting on it) of at most :data:`MAX_TEXT_BYTES`, or the
    first ``limit`` bytes of a larger one."""
    try:
        raw = read_regular(path, MAX_TEXT_BYTES, prefix=limit)
    except NotReadable as error:
        raise ConfigError(key, f"{path}: {error}") from None
    return raw.decode("utf-8", errors="replace")


def jsonl_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The records of a JSONL file with their line numbers: each non-blank line an object whose ``text``
    is a string (a null or a number would otherwise be trained on as the text ``None`` or ``3``)."""
    records = []
    for number, line in enumerate(_read(path, None).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict) or "text" not in record:
            raise DataError(f"{path}:{number}: a JSONL line must be an object with a 'text' field")
        if not isinstance(record["text"], str):
            got = "null" if record["text"] is None else type(record["text"]).__name__
            raise DataError(f"{path}:{number}: 'text' must be a string (got {got})")
        records.append((number, record))
    return records


def _jsonl(path: Path, limit: int | None, one_line: bool = False) -> str:
    """The ``text`` fields of a JSONL file's lines, one after another (the first ``limit`` bytes); each on
    one line of its own when ``one_line`` (its line breaks read as spaces)."""
    parts = []
    for _, record in jsonl_records(path):
        text = record["text"]
        parts.append(" ".join(text.splitlines()) if one_line else text)
    text = "\n".join(parts)
    return text if limit is None else text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")


def stdlib_documents(limit: int | None) -> list[tuple[str, str]]:
    """The standard-library modules of :data:`STDLIB_MODULES` found in this Python, by module name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for module in STDLIB_MODULES:
        for path in (root / f"{module}.py", root / module / "__init__.py"):
            if path.is_file():
                documents.append((module.replace("/", "."), _read(path, limit)))
                break
    if len(documents) < 8:
        raise DataError(f"{root}: the Python standard library's sources are missing (found {len(documents)})")
    return documents


def text_documents(root: Path | None, limit: int | None, one_line: bool = False) -> list[tuple[str, str]]:
    """One document per ``.txt`` / ``.jsonl`` file of ``data.root`` (a file or a folder); ``one_line``
    puts each JSONL record on a line of its own."""
    if root is None:
        raise DataError(
            "data.root: the text source reads a .txt/.jsonl file or a folder of them; set data.root"
        )
    root = Path(root).expanduser()
    files = [root] if root.is_file() else sorted(p for p in root.glob("*") if p.suffix in (".txt", ".jsonl"))
    if not root.exists():
        raise DataError(f"{root}: not found (data.root)")
    if not files:
        raise DataError(f"{root}: no .txt or .jsonl files (data.root)")
    return [(p.name, _jsonl(p, limit, one_line) if p.suffix == ".jsonl" else _read(p, limit)) for p in files]


def _leaf_split(folder: Path) -> dict[str, list[str]]:
    """Every role's samples (80 characters and the next one, joined) of one LEAF split folder."""
    if not folder.is_dir():
        raise DataError(
            f"{folder}: folder not found; data.root must hold LEAF's train/ and test/; {LEAF_HOW_TO}"
        )
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{folder}: no *.json files; {LEAF_HOW_TO}")
    roles: dict[str, list[str]] = {}
    for path in files:
        try:
            user_data = json.loads(_read(path, None))["user_data"]
            for role, record in user_data.items():
                roles.setdefault(role, []).extend(
                    str(x) + str(y) for x, y in zip(record["x"], record["y"], strict=True)
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise DataError(
                f"{path}: not a LEAF Shakespeare json file with user_data x/y ({error})"
            ) from None
    return roles


def leaf_folder(root: Path | None, allow_download: bool) -> Path:
    """The folder holding LEAF's ``train/`` and ``test/`` json: ``data.root`` (or the cache folder), built
    there from Project Gutenberg's edition (a ``100.txt`` in it, or downloaded) when neither is present."""
    base = Path(root).expanduser() if root is not None else cache_folder("shakespeare")
    raw = base / gutenberg.RAW_NAME
    if (base / "train").exists() or ((base / "test").exists() and not raw.is_file()):
        return base  # LEAF's json (ours writes train/ last; a missing half is named by the reader)
    if not raw.is_file() and allow_download:
        raw = gutenberg.fetch_edition(base)
    if raw.is_file():
        gutenberg.convert(raw, base)
        return base
    raise not_found(
        "shakespeare", [base], f"put LEAF's train/ and test/ or Gutenberg's 1994 {raw.name} there"
    )


def shakespeare_dataset(root: Path, tokenizer: Tokenizer, seq_len: int) -> Dataset:
    """LEAF Shakespeare: each sample the last ``seq_len + 1`` tokens of its 80 characters and the next one
    (LEAF's own next-character task is the final target); one group per role, LEAF's train/test split."""
    splits = [_leaf_split(Path(root) / part) for part in ("train", "test")]
    roles = sorted(set(splits[0]) | set(splits[1]))
    arrays = []
    for samples_by_role in splits:
        windows, groups = [], []
        for group, role in enumerate(roles):
            for sample in samples_by_role.get(role, []):
                ids = tokenizer.encode(sample)
                if len(ids) < seq_len + 1:
                    raise DataError(f"shakespeare: a sample of {role!r} has {len(ids)} tokens < seq_len + 1")
                windows.append(ids[-(seq_len + 1) :])
                groups.append(group)
        if not windows:
            raise DataError(f"shakespeare: a split of {root} has no samples")
        arrays.append((torch.from_numpy(np.stack(windows)), np.asarray(groups, dtype=np.int64)))
    (train, train_groups), (test, test_groups) = arrays
    x_train, y_train = train[:, :-1].contiguous(), train[:, 1:].contiguous()
    x_test, y_test = test[:, :-1].contiguous(), test[:, 1:].contiguous()
    vocab = tokenizer.vocab_size
    return Dataset("shakespeare", x_train, y_train, x_test, y_test, vocab, train_groups, test_groups)


def load_pystdlib(cfg: DataConfig, seed: int) -> Dataset:
    """Python standard-library sources, one group per module; bytes as tokens by default."""
    tokenizer = make_tokenizer(cfg.tokenizer, cfg.download)
    documents = stdlib_documents(cfg.text_bytes)
    return token_dataset("pystdlib", documents, tokenizer, cfg.seq_len, cfg.test_fraction, cfg.sequences)


def load_text(cfg: DataConfig, seed: int) -> Dataset:
    """Plain text / JSONL files of data.root, one group per file."""
    tokenizer = make_tokenizer(cfg.tokenizer, cfg.download)
    documents = text_documents(cfg.root, cfg.text_bytes, one_line=cfg.sequences == "lines")
    return token_dataset("text", documents, tokenizer, cfg.seq_len, cfg.test_fraction, cfg.sequences)


def load_shakespeare(cfg: DataConfig, seed: int) -> Dataset:
    """LEAF Shakespeare json in data.root (or built from Project Gutenberg's edition), one group per
    speaking role."""
    folder = leaf_folder(cfg.root, cfg.download)
    return shakespeare_dataset(folder, make_tokenizer(cfg.tokenizer, cfg.download), cfg.seq_len)
