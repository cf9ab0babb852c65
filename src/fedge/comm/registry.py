"""Codecs by name: ``fp32``, ``fp16``, ``sparse``, ``bitmap`` and ``q<bits>`` (the stochastic quantizer)."""

from __future__ import annotations

import torch

from fedge.comm.codecs import Codec, FloatCodec
from fedge.comm.quantize import StochasticQuantizer
from fedge.comm.sparse import SparseCodec

CODECS: dict[str, Codec] = {
    "fp32": FloatCodec("fp32", torch.float32),
    "fp16": FloatCodec("fp16", torch.float16),
    "sparse": SparseCodec(),
    "bitmap": SparseCodec("bitmap", ("dense", "bitmap")),
}


def get_codec(name: str) -> Codec:
    """The codec called ``name``; ``q1``..``q31`` build a stochastic quantizer of that many bits."""
    if name in CODECS:
        return CODECS[name]
    if name.startswith("q") and name[1:].isdigit() and 1 <= int(name[1:]) <= 31:
        return StochasticQuantizer(int(name[1:]))
    raise ValueError(f"unknown codec {name!r}; known: {', '.join(CODECS)}, q1..q31")
