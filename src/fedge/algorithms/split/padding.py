"""Pad positions at the cut: a right-padded sequence's pad tokens cross as nothing.

A model that reads padding (``SplitModel.pad_id``: a transformer on ``data.sequences: lines``) hands the
cut a zero vector at every pad position, and the receiving side reads a zero vector as padding
(:mod:`fedge.models.encoder`, :mod:`fedge.models.transformer`). So the smashed data and the cut-layer
gradients of a pad position are never sent: the ledger counts ``real tokens x hidden x bits`` per
sequence, and the server's gradient there is exactly zero, which is what a client that sent nothing
would get back. A language model's targets at pad positions are ignored and not sent either: the
labels link counts one target per real token.
"""

from __future__ import annotations

import torch

from fedge.data.dataset import IGNORED_TARGET
from fedge.models.transformer import real_positions


def sent_entries(z: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A 0/1 mask shaped like the stacked smashed data ``z`` ``[rows, batch, sequence, hidden]``: the
    entries of the real tokens of each row's first ``lengths[row]`` (real) sequences."""
    real = torch.as_tensor(lengths, device=z.device)
    rows = torch.arange(z.shape[1], device=z.device)[None, :] < real[:, None]
    tokens = real_positions(z) & rows[..., None]
    return tokens[..., None].expand(z.shape).to(z.dtype)


def sent_targets(y: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor | None:
    """A 0/1 mask shaped like a language model's stacked targets ``y`` ``[rows, batch, sequence]``: the
    real (not ignored) targets of each row's first ``lengths[row]`` sequences. ``None`` for class labels,
    one per sequence, which are all sent."""
    if y.dim() < 3:
        return None
    real = torch.as_tensor(lengths, device=y.device)
    rows = torch.arange(y.shape[1], device=y.device)[None, :] < real[:, None]
    return (y.ne(IGNORED_TARGET) & rows[..., None]).to(torch.float32)
