"""A restricted unpickler for dataset files: plain values out, nothing of the file ever runs.

A pickle is a program: loading one calls every callable it names, so a dataset file from a stranger could
create files, start processes or open sockets. Here only the few callables that rebuild plain values are
found, each checked before it runs: NumPy arrays and dtypes of numbers, bytes or fixed-width strings
(never objects), and ``_codecs.encode`` of a string to latin-1 (how Python 3 writes ``bytes`` at protocol
2). Containers, numbers, strings, bytes, ``None`` and booleans need no callable at all. Anything else is
:class:`Refused`, naming what the file asked for, before it is called.
"""

from __future__ import annotations

import codecs
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

PLAIN_KINDS = "biufcSU"  # bool, signed, unsigned, float, complex, bytes, str: never objects or records


class Refused(pickle.UnpicklingError):
    """The pickle names a callable that no plain dataset holds; it was not called."""


def _plain_dtype(dtype: Any) -> np.dtype:
    found = np.dtype(dtype)
    if found.kind not in PLAIN_KINDS or found.hasobject or found.fields is not None:
        raise Refused(f"it holds an array of dtype {found}, which is not plain numbers or text")
    return found


def _dtype(spec: Any, *args: Any) -> np.dtype:
    """``numpy.dtype(spec, align, copy)`` as pickles call it, for plain dtypes only."""
    _plain_dtype(spec)
    return np.dtype(spec, *args)


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """An empty ``numpy.ndarray`` that the pickle then fills (``__setstate__``), for plain dtypes only."""
    if subtype is not np.ndarray:
        raise Refused(f"it rebuilds an array of type {subtype!r}, not numpy.ndarray")
    return np.ndarray.__new__(np.ndarray, shape, _plain_dtype(dtype))


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    """An array from in-band bytes (protocol 5), for plain dtypes only."""
    array = np.frombuffer(buffer, dtype=_plain_dtype(dtype))
    return array.reshape(shape, order="F" if order == "F" else "C").copy()


def _encode(text: Any, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode(str, 'latin1')``: how Python 3 pickles ``bytes`` at protocol 2."""
    if not isinstance(text, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise Refused("it calls _codecs.encode other than on a string to latin-1")
    return text.encode("latin-1")


ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
    **{(f"numpy.{core}.multiarray", "_reconstruct"): _reconstruct for core in ("core", "_core")},
    **{(f"numpy.{core}.numeric", "_frombuffer"): _frombuffer for core in ("core", "_core")},
    ("numpy", "ndarray"): np.ndarray,  # only as _reconstruct's first argument (anything else is refused)
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _encode,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED.get((module, name))
        if found is None:
            raise Refused(f"its pickle calls {module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise Refused("its pickle refers to an outside object")


def _check(value: Any) -> None:
    """Refuse a value that is not made of plain parts (``numpy.ndarray`` can also be reached as a class)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check(key)
            _check(item)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _check(item)
    elif isinstance(value, np.ndarray):
        _plain_dtype(value.dtype)
    elif not (value is None or isinstance(value, bool | int | float | complex | str | bytes | bytearray)):
        raise Refused(f"it holds a {type(value).__name__}, not a plain value")


def load(path: Path, encoding: str = "bytes") -> Any:
    """The plain value pickled in ``path`` (Python 2 strings as ``bytes`` by default, as CIFAR needs).

    Raises :class:`Refused` for anything but plain values, and what ``pickle`` raises for a damaged file.
    """
    with Path(path).open("rb") as f:
        value = _Unpickler(f, encoding=encoding).load()
    _check(value)
    return value
