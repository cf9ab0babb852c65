"""Recovering a language model's input tokens from its hidden states at the cut: learned inversion,
then the nearest token embedding.

Threat model. In split learning of a transformer language model the client runs the embedding and the
first blocks and sends each sequence's hidden states ``[T, d]`` to the server. A curious server sees
these hidden states; it also knows the client's part well enough to run it on text of its own (the
shared initial model, or a copy it can query) and the token embedding table. It feeds its own
auxiliary token sequences through the client's part, learns a map from hidden state back to the
embedding of the token at that position, and reads each received position as the token whose embedding
the map's output is closest to. This is the learning-based inversion of split-learning activations of
He et al., "Model Inversion Attacks against Collaborative Inference" (ACSAC 2019), applied per token
as in the embedding-inversion attacks of Song and Raghunathan, "Information Leakage in Embedding
Models" (ACM CCS 2020).

Success metric: token accuracy, the share of positions whose token is recovered exactly, against
chance (one over the vocabulary size, or the most frequent token's share).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def train_token_inversion(
    encode: Callable[[torch.Tensor], torch.Tensor],
    aux_tokens: torch.Tensor,
    embedding: torch.Tensor,
    epochs: int = 30,
    lr: float = 0.05,
    batch_size: int = 256,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """A linear map from hidden size ``d`` to embedding size ``e`` trained on the attacker's own
    ``aux_tokens`` ``[M, T]`` (hidden states ``encode(aux_tokens)``, ``[M, T, d]``) so that its output
    picks the true token's row of ``embedding`` ``[V, e]``: cross-entropy over ``output @ embedding.T``.

    The map starts at zero, so with the convex loss of a linear map the only random draw is the order
    of the positions (``generator``)."""
    if aux_tokens.dim() != 2 or embedding.dim() != 2:
        raise ValueError("aux_tokens must be [M, T] and embedding [V, e]")
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError("epochs and batch_size must be at least 1 and lr positive")
    table = embedding.detach().float()
    with torch.no_grad():
        hidden = encode(aux_tokens).detach().float()
    if hidden.shape[:2] != aux_tokens.shape:
        raise ValueError(f"encode gave {tuple(hidden.shape)} for tokens {tuple(aux_tokens.shape)}")
    inputs, targets = hidden.reshape(-1, hidden.shape[-1]), aux_tokens.reshape(-1).long()
    inversion = nn.Linear(inputs.shape[1], table.shape[1])
    nn.init.zeros_(inversion.weight)
    nn.init.zeros_(inversion.bias)
    optimizer = torch.optim.Adam(inversion.parameters(), lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(targets), generator=generator)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            nn.functional.cross_entropy(inversion(inputs[batch]) @ table.T, targets[batch]).backward()
            optimizer.step()
    return inversion.eval()


def recover_tokens(inversion: nn.Module, hidden: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
    """Each position's token: the embedding row with the largest logit ``inversion(h) @ embedding.T``
    (the score the inversion was trained on), ``[N, T]`` from hidden states ``[N, T, d]``."""
    if hidden.dim() != 3:
        raise ValueError(f"hidden states must be [N, T, d], got {tuple(hidden.shape)}")
    with torch.no_grad():
        return (inversion(hidden.detach().float()) @ embedding.detach().float().T).argmax(dim=-1)


def token_accuracy(recovered: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """The share of positions (those where ``mask`` is true, padding left out) whose token was recovered."""
    if recovered.shape != tokens.shape or (mask is not None and mask.shape != tokens.shape):
        raise ValueError(
            f"recovered {tuple(recovered.shape)} and tokens {tuple(tokens.shape)} differ in shape"
        )
    hits = recovered == tokens
    kept = torch.ones_like(hits) if mask is None else mask.bool()
    if not bool(kept.any()):
        raise ValueError("no position to score: the mask is all false")
    return float(hits[kept].float().mean())
