"""Payloads on the wire: fedge tensors as Flower ArrayRecords (never pickle) and the checks a reply
must pass (keys, shapes, dtypes) before the server uses it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from fedge.data.federated import FederatedData
from fedge.tensors import Tensors

WIRE_DTYPES = {"fp32": np.float32, "fp16": np.float16}  # what each codec puts on the air
LABELS = np.dtype(np.int64)
F32 = np.dtype(np.float32)


class Rejected(ValueError):
    """A reply the server refuses, with the reason it logs."""


def wire_dtype(codec: str) -> np.dtype:
    """The dtype a codec's values travel in (the deployed runtime carries fp32 and fp16 codecs)."""
    if codec not in WIRE_DTYPES:
        raise ValueError(f"codec {codec!r} cannot be deployed; use fp32 or fp16")
    return np.dtype(WIRE_DTYPES[codec])


def to_record(tensors: Tensors, dtype: np.dtype | None = None) -> ArrayRecord:
    """An ArrayRecord of ``tensors`` (floating ones cast to ``dtype`` when given; integers as they are)."""
    arrays = {}
    for name, value in tensors.items():
        array = value.detach().cpu().numpy()
        if dtype is not None and np.issubdtype(array.dtype, np.floating):
            array = array.astype(dtype)
        arrays[name] = Array(np.array(array, order="C"))  # keeps 0-d shapes
    return ArrayRecord(arrays)


def from_record(record: ArrayRecord, device: torch.device | str = "cpu") -> Tensors:
    """The tensors of an ArrayRecord; floating values come back as float32 (what fedge computes in)."""
    out: Tensors = {}
    for name, array in record.items():
        value = torch.from_numpy(np.array(array.numpy()))
        out[name] = (value.float() if value.is_floating_point() else value).to(device)
    return out


@dataclass(frozen=True)
class Spec:
    """What one array of a reply must be: its dtype and shape (``None``: any shape; the caller checks
    it against the reply's other arrays)."""

    shape: tuple[int, ...] | None
    dtype: np.dtype


def labels(count: int, data: FederatedData) -> Spec:
    """What a client's labels of ``count`` samples must be: one class each, or a language model's target
    per token (the shape of the data's targets)."""
    return Spec((count, *data.dataset.y_train.shape[1:]), LABELS)


def expect(tensors: Tensors, dtype: np.dtype | None = None) -> dict[str, Spec]:
    """Specs that accept exactly ``tensors``' names and shapes (floating dtypes as ``dtype``)."""
    specs = {}
    for name, value in tensors.items():
        native = np.dtype(str(value.dtype).removeprefix("torch."))
        floating = value.is_floating_point() and dtype is not None
        specs[name] = Spec(tuple(value.shape), np.dtype(dtype) if floating else native)
    return specs


def check(record: ArrayRecord, specs: dict[str, Spec]) -> None:
    """Raise :class:`Rejected` naming the first problem: a missing or unexpected key, a wrong dtype or
    shape, or a value that is not finite."""
    missing, extra = sorted(set(specs) - set(record)), sorted(set(record) - set(specs))
    if missing or extra:
        raise Rejected(f"keys differ: missing {missing}, unexpected {extra}")
    for name, spec in specs.items():
        array = record[name]
        if np.dtype(array.dtype) != spec.dtype:
            raise Rejected(f"{name}: dtype {array.dtype}, expected {spec.dtype}")
        if spec.shape is not None and tuple(array.shape) != spec.shape:
            raise Rejected(f"{name}: shape {tuple(array.shape)}, expected {spec.shape}")
        values = array.numpy()
        if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
            raise Rejected(f"{name}: values are not finite")
