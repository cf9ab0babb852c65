"""Safe checkpoints: a verified header, a JSON description of the state, and the raw bytes of its arrays.

Loading a checkpoint never runs code from it (no pickle): the state's structure (dicts, lists, tuples,
dicts keyed by tuples, Python numbers, strings, ``None``) is JSON, and every tensor or NumPy array is
a dtype, a shape and bytes. The file is::

    FEDGE-CHECKPOINT\\n
    {"format": 2, "algorithm": ..., "config_sha256": ..., "rounds": T, "round": t, "body_bytes": n,
     "body_sha256": ..., "journal_bytes": j, "journal_sha256": ...}\\n
    {"tree": ..., "arrays": [{"kind", "dtype", "shape", "offset", "nbytes", ...}, ...]}\\n
    the bytes of every array, each padded to 64 bytes

The run's past (its metrics rows and ledger transfers) is not in the file but in its append-only
:class:`Journal` beside it: each checkpoint appends only what is new, so a checkpoint costs the same at
round 10,000 as at round 1, and its header names the journal's first ``j`` bytes (length and SHA-256) as
its own. A format-1 checkpoint (no journal) holds the whole past in its state and is still read.

:func:`load` refuses, with a one-line :class:`~fedge.errors.CheckpointError`, a file that is empty, not a
checkpoint, truncated or altered (length and SHA-256 of the body), of another format version, or (given
the run's config) written by another algorithm or for another config (``rounds``, the run's length, is
left out of that comparison and kept in the header as ``rounds``: a run may be continued past its
length, :mod:`fedge.runner.run_length`); also a path that is no regular
file, and a file whose size is not its header's (checked before the body is read). The checksum detects
damage, not forgery (anyone who can write the file can recompute it): :mod:`fedge.runner.restore` checks that
what a checkpoint says makes sense for the run before a resume uses it. Round trips are exact: float
values, dtypes, tuple keys, NumPy scalars and the identity of a tensor stored twice all come back.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedge.config import RunConfig
from fedge.errors import CheckpointError, PathError
from fedge.files.regular import NotReadable, open_regular
from fedge.files.results import atomic_write
from fedge.runner import preflight

MAGIC = b"FEDGE-CHECKPOINT\n"
FORMAT = 2
READS = (1, 2)  # format 1: the state holds the whole past (no journal)
MAX_HEADER_BYTES = 4096
ALIGN = 64
TORCH_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    )
}
NUMPY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: plain values only, never objects
HEADER_FIELDS = {"format": int, "algorithm": str, "config_sha256": str, "round": int, "body_bytes": int}


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: its verified header, the state it holds, and the records of its journal (the
    run's past, :class:`Journal`) with the journal to append to."""

    header: dict[str, Any]
    state: dict[str, Any]
    records: list[Any] = field(default_factory=list)
    journal: Journal | None = None

    def written_rounds(self, config: RunConfig) -> int:
        """The ``rounds`` of the config this checkpoint was written under (a checkpoint of an older fedge,
        whose digest covers ``rounds``, matched ``config`` and so was written under its ``rounds``)."""
        return self.header.get("rounds", config.rounds)


def config_digest(config: RunConfig) -> str:
    """SHA-256 of everything in a config that shapes the run's state up to a round (``output`` and
    ``stop`` do not; ``rounds`` is checked apart, by :mod:`fedge.runner.run_length`)."""
    return _digest(config.model_dump(mode="json", exclude=_unshaping(config, {"output", "stop", "rounds"})))


def _older_digest(config: RunConfig) -> str:
    """The digest a checkpoint without a ``rounds`` header field holds: it covers ``rounds`` too."""
    return _digest(config.model_dump(mode="json", exclude=_unshaping(config, {"output", "stop"})))


def _unshaping(config: RunConfig, keys: set[str]) -> dict[str, Any]:
    """``keys``, the in-run attacks (``eval.attacks``: they read the run, never change it) and, while it
    is empty, the ``aggregation`` block: a run without stages has the digest it had before the block
    existed, so its older checkpoints still resume."""
    excluded: dict[str, Any] = {key: True for key in keys} | {"eval": {"attacks": True}}
    return excluded if config.aggregation.stages else {**excluded, "aggregation": True}


ADDED_LATER = (("algorithm", "nopeek", 0.0),)
"""Keys newer than checkpoints that should still resume: left out of the digest at their default."""


def _digest(data: dict[str, Any]) -> str:
    for block, key, default in ADDED_LATER:
        if data.get(block, {}).get(key, default) == default:
            data.get(block, {}).pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class _Packer:
    """Turns a state into a JSON tree and a list of byte buffers (tensors and arrays by index)."""

    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = []
        self.specs: list[dict[str, Any]] = []
        self.seen: dict[int, int] = {}
        self.end = 0

    def _add(self, raw: np.ndarray, spec: dict[str, Any]) -> int:
        self.specs.append({**spec, "offset": self.end, "nbytes": int(raw.nbytes)})
        self.buffers.append(raw)
        self.end += -(-raw.nbytes // ALIGN) * ALIGN
        return len(self.specs) - 1

    def _tensor(self, value: torch.Tensor) -> int:
        if id(value) not in self.seen:
            flat = value.detach().to("cpu").contiguous().reshape(-1)
            spec = {
                "kind": "tensor",
                "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape),
            }
            if spec["dtype"] not in TORCH_DTYPES:
                raise TypeError(f"cannot checkpoint a tensor of dtype {value.dtype}")
            spec["grad"] = bool(value.requires_grad)
            self.seen[id(value)] = self._add(flat.view(torch.uint8).numpy(), spec)
        return self.seen[id(value)]

    def _array(self, value: np.ndarray) -> int:
        if value.dtype.kind not in NUMPY_KINDS:
            raise TypeError(f"cannot checkpoint a NumPy array of dtype {value.dtype}")
        flat = np.ascontiguousarray(value).reshape(-1)
        spec = {"kind": "array", "dtype": value.dtype.str, "shape": list(value.shape)}
        return self._add(flat.view(np.uint8), spec)

    def pack(self, value: Any) -> Any:
        if isinstance(value, np.generic):  # first: np.float64 is also a float, and must stay np.float64
            return {"$scalar": self._array(np.asarray(value))}
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, torch.Tensor):
            return {"$tensor": self._tensor(value)}
        if isinstance(value, np.ndarray):
            return {"$array": self._array(value)}
        if isinstance(value, list):
            return [self.pack(item) for item in value]
        if isinstance(value, tuple):
            return {"$tuple": [self.pack(item) for item in value]}
        if isinstance(value, dict):
            if all(isinstance(key, str) and not key.startswith("$") for key in value):
                return {key: self.pack(item) for key, item in value.items()}
            return {"$dict": [[self.pack(key), self.pack(item)] for key, item in value.items()]}
        raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}")


class _Unpacker:
    """The inverse of :class:`_Packer` over a verified body; malformed input raises ``ValueError``."""

    def __init__(self, specs: list[dict[str, Any]], data: memoryview):
        self.specs = specs
        self.data = data
        self.made: dict[int, Any] = {}

    def _raw(self, index: int) -> tuple[dict[str, Any], np.ndarray]:
        spec = self.specs[index]
        offset, nbytes = int(spec["offset"]), int(spec["nbytes"])
        if offset < 0 or nbytes < 0 or offset + nbytes > len(self.data):
            raise ValueError("an array lies outside the file")
        return spec, np.frombuffer(self.data, dtype=np.uint8, count=nbytes, offset=offset).copy()

    def _tensor(self, index: int) -> torch.Tensor:
        if index not in self.made:
            spec, raw = self._raw(index)
            if spec["kind"] != "tensor" or spec["dtype"] not in TORCH_DTYPES:
                raise ValueError("a tensor entry is not a tensor")
            dtype, shape = TORCH_DTYPES[spec["dtype"]], [int(n) for n in spec["shape"]]
            flat = torch.from_numpy(raw).view(dtype) if raw.size else torch.empty(0, dtype=dtype)
            self.made[index] = flat.reshape(shape).requires_grad_(bool(spec["grad"]))
        return self.made[index]

    def _array(self, index: int) -> np.ndarray:
        spec, raw = self._raw(index)
        dtype = np.dtype(spec["dtype"])
        if spec["kind"] != "array" or dtype.kind not in NUMPY_KINDS or dtype.str != spec["dtype"]:
            raise ValueError("an array entry is not a plain NumPy array")
        return raw.view(dtype).reshape([int(n) for n in spec["shape"]])

    def unpack(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.unpack(item) for item in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1 and next(iter(node)).startswith("$"):
            ((tag, body),) = node.items()
            if tag == "$float":
                return float(body)
            if tag == "$tensor":
                return self._tensor(int(body))
            if tag == "$array":
                return self._array(int(body))
            if tag == "$scalar":
                return self._array(int(body))[()]
            if tag == "$tuple":
                return tuple(self.unpack(item) for item in body)
            if tag == "$dict":
                return {self.unpack(key): self.unpack(item) for key, item in body}
            raise ValueError(f"unknown tag {tag!r}")
        return {key: self.unpack(item) for key, item in node.items()}


def _body(value: Any) -> tuple[bytes, list[tuple[np.ndarray, bytes]]]:
    """``value`` as a body: its JSON description line, then each array's bytes with its padding."""
    packer = _Packer()
    tree = packer.pack(value)
    description = json.dumps({"tree": tree, "arrays": packer.specs}, allow_nan=False, separators=(",", ":"))
    pads = [bytes(-spec["nbytes"] % ALIGN) for spec in packer.specs]
    return description.encode() + b"\n", list(zip(packer.buffers, pads, strict=True))


def _unpack(data: bytes, start: int, end: int) -> Any:
    """The value the verified body ``data[start:end]`` holds; a malformed one raises one of
    :data:`UNREADABLE`."""
    split = data.find(b"\n", start, end)
    if split < 0:
        raise ValueError("its description has no end")
    description = json.loads(data[start:split])
    return _Unpacker(description["arrays"], memoryview(data)[split + 1 : end]).unpack(description["tree"])


UNREADABLE = (ValueError, KeyError, TypeError, IndexError, AttributeError, RuntimeError, RecursionError)


class Journal:
    """The append-only history beside a checkpoint: what each checkpoint adds to the run's past (its new
    metrics rows and ledger transfers), so that no checkpoint writes the whole past again.

    Each record is a length (8 bytes, little-endian) and a body packed as a checkpoint's is. A checkpoint's
    header records how many bytes of the journal are its own (``journal_bytes``) and their SHA-256; bytes
    after that (a record appended before a kill stopped the checkpoint that would have named it) are not
    read, and :meth:`cut` drops them before a resumed run appends again.
    """

    def __init__(self, path: Path, size: int = 0, digest: Any = None):
        self.path = Path(path)
        self.size = size
        self._digest = digest or hashlib.sha256()

    def append(self, record: dict[str, Any]) -> None:
        """Add ``record`` after the journal's own bytes and flush it to disk (before the checkpoint that
        names it is written)."""
        head, chunks = _body(record)
        length = len(head) + sum(raw.nbytes + len(pad) for raw, pad in chunks)
        parts = [
            length.to_bytes(8, "little"),
            head,
            *(b for raw, pad in chunks for b in (raw.tobytes(), pad)),
        ]
        try:
            with open(self.path, "r+b" if self.size else "wb") as handle:
                handle.seek(self.size)
                for part in parts:
                    handle.write(part)
                    self._digest.update(part)
                handle.truncate()
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            raise PathError(self.path, f"cannot be written ({error.strerror or error})") from None
        self.size += 8 + length

    def mark(self) -> dict[str, Any]:
        """The header fields of a checkpoint written now: the journal's length and digest."""
        return {"journal_bytes": self.size, "journal_sha256": self._digest.hexdigest()}

    def cut(self) -> None:
        """Drop whatever follows the journal's own bytes (a resumed run appends after them)."""
        if self.size == 0:
            self.path.unlink(missing_ok=True)
            return
        try:
            with open(self.path, "r+b") as handle:
                handle.truncate(self.size)
        except OSError as error:
            raise PathError(self.path, f"cannot be written ({error.strerror or error})") from None


def journal_path(path: Path) -> Path:
    """Where the journal of the checkpoint at ``path`` lives: beside it (``checkpoint.history``)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.history")


def save(
    path: Path, state: dict[str, Any], config: RunConfig, round_: int, journal: Journal | None = None
) -> None:
    """Write ``state`` (the run's state after ``round_``) to ``path`` atomically; with ``journal``, the
    header names the journal's bytes written so far as the rest of the state."""
    body_head, chunks = _body(state)
    digest = hashlib.sha256(body_head)
    for raw, pad in chunks:
        digest.update(raw)
        digest.update(pad)
    header = {
        "format": FORMAT,
        "algorithm": config.algorithm.name,
        "config_sha256": config_digest(config),
        "rounds": config.rounds,
        "round": int(round_),
        "body_bytes": len(body_head) + sum(raw.nbytes + len(pad) for raw, pad in chunks),
        "body_sha256": digest.hexdigest(),
        **(journal or Journal(journal_path(path))).mark(),
    }

    def write(handle) -> None:
        handle.write(MAGIC)
        handle.write(json.dumps(header).encode() + b"\n")
        handle.write(body_head)
        for raw, pad in chunks:
            handle.write(memoryview(raw))
            handle.write(pad)

    atomic_write(path, write)


def _header(path: Path, data: bytes) -> tuple[dict[str, Any], int]:
    """The verified header of ``data`` and where the body starts."""
    if not data:
        raise CheckpointError(path, "is empty (the run was cut off before its first checkpoint?)")
    if not data.startswith(MAGIC):
        if data.startswith(b"PK\x03\x04"):
            raise CheckpointError(
                path, "is a pickle checkpoint of an older fedge; it is not opened, as unpickling can run code"
            )
        raise CheckpointError(path, "is not a fedge checkpoint")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER_BYTES)
    try:
        header = json.loads(data[len(MAGIC) : end]) if end > 0 else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or not all(
        isinstance(header.get(key), kind) for key, kind in {**HEADER_FIELDS, "body_sha256": str}.items()
    ):
        raise CheckpointError(path, "is damaged: its header cannot be read")
    if "rounds" in header and type(header["rounds"]) is not int:
        raise CheckpointError(path, "is damaged: its header cannot be read")
    journal = header.get("journal_bytes", 0), header.get("journal_sha256", "")
    if type(journal[0]) is not int or journal[0] < 0 or not isinstance(journal[1], str):
        raise CheckpointError(path, "is damaged: its header cannot be read")
    if header["format"] not in READS:
        raise CheckpointError(path, f"has format {header['format']}; this fedge reads formats {READS}")
    return header, end + 1


def _read(path: Path) -> bytes:
    """The bytes of the checkpoint at ``path``, read only once its header says how many there must be.

    A path that is no regular file (a directory, a device such as ``/dev/zero`` behind a symlink, a FIFO)
    is refused without reading (a FIFO is opened without waiting for a writer); so is a file whose size is
    not the header's, or whose body would not fit in memory, before the body is read.
    """
    try:
        opened = open_regular(path)
    except NotReadable as error:
        only = "; fedge only reads a checkpoint it wrote" if error.kind else ""
        raise CheckpointError(path, f"{error}{only}") from None
    with opened as handle:
        size = os.fstat(handle.fileno()).st_size
        try:
            head = handle.read(len(MAGIC) + MAX_HEADER_BYTES)
            header, start = _header(path, head)
            expected = start + header["body_bytes"]
            if size != expected:
                raise CheckpointError(
                    path, f"is damaged: {expected:,} bytes expected from its header, {size:,} on disk"
                )
            room = preflight.available_bytes(torch.device("cpu"))
            if room is not None and header["body_bytes"] > room:
                raise CheckpointError(
                    path,
                    f"its body of {preflight.human(header['body_bytes'])} is more than the memory available "
                    f"({preflight.human(room)}); it is not read",
                )
            return head + handle.read(expected - len(head))
        except OSError as error:
            raise CheckpointError(path, f"cannot be read ({error.strerror})") from None


def load(path: Path, config: RunConfig | None = None) -> Checkpoint:
    """Read and verify the checkpoint at ``path``; with ``config``, it must belong to that run."""
    path = Path(path)
    data = _read(path)
    header, start = _header(path, data)
    body = memoryview(data)[start:]
    if len(body) != header["body_bytes"]:
        raise CheckpointError(
            path, f"is damaged: {len(body)} of {header['body_bytes']} body bytes (truncated?)"
        )
    if hashlib.sha256(body).hexdigest() != header["body_sha256"]:
        raise CheckpointError(path, "is damaged: its checksum does not match its contents")
    if config is not None:
        if header["algorithm"] != config.algorithm.name:
            raise CheckpointError(
                path, f"belongs to a {header['algorithm']} run, not to this {config.algorithm.name} run"
            )
        digest = config_digest(config) if "rounds" in header else _older_digest(config)
        if header["config_sha256"] != digest:
            raise CheckpointError(path, "was written for another config than this run's config.yaml")
    try:
        state = _unpack(data, start, len(data))
    except UNREADABLE as error:
        raise CheckpointError(path, f"is damaged: {_reason(error)}") from None
    if not isinstance(state, dict):
        raise CheckpointError(path, "is damaged: it holds no state")
    journal, records = _journal(journal_path(path), header)
    return Checkpoint(header, state, records, journal)


def _reason(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _journal(path: Path, header: dict[str, Any]) -> tuple[Journal, list[Any]]:
    """The journal a checkpoint's header names, verified, and its records (a checkpoint of an older
    fedge names none: its state holds the whole past)."""
    size, digest = header.get("journal_bytes", 0), header.get("journal_sha256")
    if size == 0:
        return Journal(path), []
    data = _read_prefix(path, size)
    running = hashlib.sha256(data)
    if running.hexdigest() != digest:
        raise CheckpointError(path, "is damaged: its checksum does not match the checkpoint's record of it")
    records, at = [], 0
    try:
        while at < size:
            length = int.from_bytes(data[at : at + 8], "little")
            if at + 8 + length > size:
                raise ValueError("a record runs past its end")
            records.append(_unpack(data, at + 8, at + 8 + length))
            at += 8 + length
    except UNREADABLE as error:
        raise CheckpointError(path, f"is damaged: {_reason(error)}") from None
    return Journal(path, size, running), records


def _read_prefix(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of the regular file at ``path`` (a FIFO or device is refused unread)."""
    try:
        opened = open_regular(path)
    except NotReadable as error:
        raise CheckpointError(path, f"{error}; the checkpoint needs it") from None
    with opened as handle:
        on_disk = os.fstat(handle.fileno()).st_size
        if on_disk < size:
            raise CheckpointError(
                path, f"is damaged: the checkpoint records {size:,} bytes of it, {on_disk:,} on disk"
            )
        try:
            return handle.read(size)
        except OSError as error:
            raise CheckpointError(path, f"cannot be read ({error.strerror})") from None
