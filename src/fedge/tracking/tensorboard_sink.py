"""TensorBoard event files written by fedge itself: scalars only, so no TensorBoard install is needed.

An event file is a sequence of records ``[length u64][masked crc32c of length][Event protobuf][masked
crc32c of data]``; an Event carries a wall time, a step and a Summary of ``(tag, simple_value)`` pairs.
That small part of the format is encoded here by hand (protobuf wire format, CRC-32C), and a test reads
the files back with TensorBoard's own event reader. A resumed run opens a new file that starts with a
session-restart marker at its first round, so TensorBoard drops the rounds the killed run wrote after
its last checkpoint.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reversed
_TABLE = []
for _byte in range(256):
    _crc = _byte
    for _ in range(8):
        _crc = (_crc >> 1) ^ _POLY if _crc & 1 else _crc >> 1
    _TABLE.append(_crc)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(step: int, body: bytes) -> bytes:
    """An Event: wall_time (1, double), step (2, int64), then ``body`` (its other fields, encoded)."""
    return b"\x09" + struct.pack("<d", time.time()) + b"\x10" + _varint(step) + body


def scalar_event(step: int, values: dict[str, float]) -> bytes:
    """An Event whose Summary (field 5) holds one simple_value per tag."""
    summary = b"".join(
        _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
        for tag, value in values.items()
    )
    return _event(step, _field(5, summary))


def record(data: bytes) -> bytes:
    """One framed record of an event file."""
    header = struct.pack("<Q", len(data))
    return header + _masked(header) + data + _masked(data)


class TensorBoardSink:
    """Scalars of every round into ``folder/events.out.tfevents.*``."""

    def __init__(self, folder: Path, start: int):
        folder.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.fedge"
        self.handle = open(folder / name, "ab")  # noqa: SIM115  (closed by close())
        self._write(_event(0, _field(3, b"brain.Event:2")))
        if start > 0:  # SessionLog (7) status START (1): TensorBoard discards steps >= start + 1
            self._write(_event(start + 1, _field(7, b"\x08\x01")))

    def _write(self, event: bytes) -> None:
        self.handle.write(record(event))
        self.handle.flush()

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._write(scalar_event(step, scalars))

    def finish(self, summary: dict[str, float]) -> None:
        """Nothing to add: every round's scalars are already written."""

    def close(self) -> None:
        self.handle.close()
