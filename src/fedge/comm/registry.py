"""Codecs by name: ``fp32``, ``fp16``, ``bf16``, ``sparse``, ``bitmap``, ``q<bits>`` (the stochastic
quantizer) and ``topk:<fraction>`` / ``randk:<fraction>`` (sparsifiers); ``fedge.config.CodecName``
validates the same names in a config."""

from __future__ import annotations

import torch

from fedge.comm.codecs import Codec, FloatCodec
from fedge.comm.quantize import StochasticQuantizer
from fedge.comm.sparse import SparseCodec
from fedge.comm.sparsify import Sparsifier

CODECS: dict[str, Codec] = {
    "fp32": FloatCodec("fp32", torch.float32),
    "fp16": FloatCodec("fp16", torch.float16),
    "bf16": FloatCodec("bf16", torch.bfloat16),
    "sparse": SparseCodec(),
    "bitmap": SparseCodec("bitmap", ("dense", "bitmap")),
}


def get_codec(name: str) -> Codec:
    """The codec called ``name``; ``q1``..``q31`` build a stochastic quantizer of that many bits,
    ``topk:f`` / ``randk:f`` a sparsifier keeping the share ``f`` in (0, 1] of each tensor."""
    if name in CODECS:
        return CODECS[name]
    if name.startswith("q") and name[1:].isdigit() and 1 <= int(name[1:]) <= 31:
        return StochasticQuantizer(int(name[1:]))
    kind, _, fraction = name.partition(":")
    if kind in ("topk", "randk") and fraction:
        try:
            return Sparsifier(float(fraction), random=kind == "randk")
        except ValueError:
            pass
    raise ValueError(f"unknown codec {name!r}; known: {', '.join(CODECS)}, q1..q31, topk:<f>, randk:<f>")
