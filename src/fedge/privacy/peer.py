"""Peer-message DP (``privacy.peer``): the Gaussian mechanism on every model a decentralized peer sends.

A peer's message in round t is ``start + clip_C(trained - start) + N(0, (z C)^2 I)``: its update since
the state it started the round from, clipped to L2 norm ``C`` over all its shared floating tensors
(parameters and floating buffers together), plus Gaussian noise of std ``z C`` drawn once per round and
sender, so every neighbour receives the same noisy message (one release; the stream is keyed by round and
sender, so both executors and any grouping of rows draw the same numbers). Under add/remove of the
sender's whole dataset the clipped update moves by at most ``C`` given the start, so each message is a
Gaussian mechanism of multiplier ``z`` at client level (Abadi et al. 2016's clip-and-noise applied to a
whole update, as DP-FedAvg does: McMahan et al. 2018), and the run's rounds compose adaptively.

The start must itself be a function of what the sender has already released, or the composition does
not hold: so the sender mixes its *released* message as its own row too (a state built from its exact
updates and sent later would leak them with no noise). Every other message a peer sends that depends on
its data without this noise (AFIND+'s proxies and reported losses, Dis-PFL's evolved masks) is recorded
as a non-private release: the ledger then says the run is not DP, rather than overstating it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedge.config import RunConfig
from fedge.privacy.release import GAUSSIAN, Release
from fedge.privacy.run import RunPrivacy
from fedge.tensors import Tensors

PEER = "peer"
"""The release kind (and noise purpose) of a peer's model message."""


def flat_rows(tensors: Tensors, names: Sequence[str]) -> torch.Tensor:
    """``[R, D]``: the tensors ``names`` of stacked rows, flattened and concatenated per row."""
    return torch.cat([tensors[k].reshape(len(tensors[k]), -1) for k in names], dim=1)


def clip_rows(values: torch.Tensor, bound: float) -> torch.Tensor:
    """Each row of ``[R, D]`` scaled to L2 norm at most ``bound`` (norms in float64)."""
    norms = torch.linalg.vector_norm(values.double(), dim=1, keepdim=True)
    return values * (bound / norms.clamp_min(bound)).to(values.dtype)


def released_rows(
    privacy: RunPrivacy,
    start: Tensors,
    trained: Tensors,
    keys: Sequence[tuple[int, ...]],
    clip: float,
    multiplier: float,
) -> Tensors:
    """The messages of stacked rows: ``start + clip(trained - start) + noise`` over every tensor of
    ``trained`` (all must be floating), the noise of row r drawn from ``privacy``'s ``"peer"`` stream
    keyed ``keys[r]`` (round, sender[, receiver]) with std ``multiplier * clip``."""
    names = list(trained)
    delta = clip_rows(flat_rows(trained, names) - flat_rows(start, names), clip)
    if multiplier > 0:
        std = multiplier * clip
        noise = torch.stack([privacy.gaussian(delta[r], std, PEER, *key) for r, key in enumerate(keys)])
        delta = delta + noise
    out, offset = {}, 0
    for k in names:
        size = trained[k][0].numel()
        out[k] = start[k] + delta[:, offset : offset + size].reshape(trained[k].shape)
        offset += size
    return out


def peer_releases(round_: int, senders: Sequence[int], clip: float, multiplier: float) -> list[Release]:
    """One client-level Gaussian release per message: ``senders[r]`` sent row r in ``round_`` (a sender of
    several distinct messages, e.g. AFIND+'s literal replies, spends one release per message)."""
    counts: dict[int, int] = {}
    for sender in senders:
        counts[int(sender)] = counts.get(int(sender), 0) + 1
    return [
        Release(round_, PEER, "client", GAUSSIAN, multiplier, clip, count=count, clients=(sender,))
        for sender, count in sorted(counts.items())
    ]


def unprotected(round_: int, kind: str, senders: Sequence[int]) -> list[Release]:
    """Non-private releases (multiplier 0: epsilon is unbounded) of a message ``kind`` each of
    ``senders`` sent from its data without noise, at client and at sample level."""
    counts: dict[int, int] = {}
    for sender in senders:
        counts[int(sender)] = counts.get(int(sender), 0) + 1
    return [
        Release(round_, kind, unit, GAUSSIAN, 0.0, count=count, clients=(sender,))
        for sender, count in sorted(counts.items())
        for unit in ("client", "sample")
    ]


def plan_peer(config: RunConfig, data_sizes: list[int], multiplier: float) -> list[Release]:
    """The peer messages a whole run would release, at ``privacy.peer.noise_multiplier`` or, where that
    is unset, at ``multiplier`` (the calibrated one): one per client per round (AFIND+'s literal mode
    sends one message per selected requester and so spends more: it is planned as at most ``peers``
    replies plus the own row, every client answering every requester it may have)."""
    peer = config.privacy.peer
    if peer is None:
        return []
    if peer.noise_multiplier is not None:
        multiplier = peer.noise_multiplier
    clients = len(data_sizes)
    algorithm = config.algorithm
    per_round = 1
    if getattr(algorithm, "name", None) == "afind" and getattr(algorithm, "neighbor_mode", "") == "literal":
        per_round = 1 + max(clients - 1, 0)
    return [
        Release(t, PEER, "client", GAUSSIAN, multiplier, peer.clip, count=per_round, clients=(c,))
        for t in range(1, config.rounds + 1)
        for c in range(clients)
    ]
