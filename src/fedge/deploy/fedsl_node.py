"""Lightweight FedSL's client side on a node (:mod:`fedge.deploy.fedsl_rounds`): the trunk forward to the
cut with its dropout, and the back-propagation of the returned gradient with the client update (prune,
mask, quantize, step), each for the node's own client, with the simulation's functions and streams."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch

from fedge.algorithms.split.fedsl_client import cut_masks
from fedge.algorithms.split.light_fedsl import FedSLRounds
from fedge.algorithms.split.pruning import sparsity_target
from fedge.comm import apply_dropout
from fedge.comm.registry import get_codec
from fedge.deploy.node import Node
from fedge.engine.noise import RowKeys
from fedge.tensors import Tensors

ClientState = dict[str, Tensors]  # "params", "buffers", "masks" (0/1 bytes) of one client, unstacked


class Cut(NamedTuple):
    """The client's forward pass of round t: its stacked (one row) parameters, labels, real-row count,
    smashed data, new BatchNorm statistics, the pull-back of a cut gradient and the dropout keep mask."""

    params: Tensors
    y: torch.Tensor
    count: int
    z: torch.Tensor
    buffers: Tensors
    pullback: Any
    keep: torch.Tensor


def _cut(node: Node, t: int, state: ClientState) -> Cut:
    """The trunk forward of round t on the client's batch, with the round's noise keys and dropout mask
    (both drawn from streams of the seed, round and client, as the simulation draws them)."""
    alg: FedSLRounds = node.algorithm
    ctx, k = node.built.context, node.client
    index, weight = alg.batches(t)
    own = (weight[k : k + 1] > 0).sum(dim=1)
    x, y = ctx.data.x_train[index[k : k + 1]], ctx.data.y_train[index[k : k + 1]]
    params = {name: v.unsqueeze(0) for name, v in state["params"].items()}
    buffers = {name: v.unsqueeze(0) for name, v in state["buffers"].items()}
    ctx.start("train", t)
    every = ctx.executor.phase_keys(range(len(alg.nodes)))
    keys = None if every is None else RowKeys(every.base[k : k + 1])
    alg.parts.model.train()
    z, new_buffers, pullback = ctx.executor.forward_with_vjp(
        alg.forward, params, buffers, x, own, None if keys is None else keys.at(0)
    )
    keep = cut_masks(ctx.seed, t, own, z, k, alg.knobs.cut_dropout)
    return Cut(params, y, int(own[0]), z, new_buffers, pullback, keep)


def forward(node: Node, t: int, state: ClientState) -> tuple[dict[str, Tensors], dict[str, float]]:
    """Round t's kept cut entries (dropout applied, in the up codec) and labels of the client's batch."""
    alg: FedSLRounds = node.algorithm
    began = time.perf_counter()
    cut = _cut(node, t, state)
    with torch.no_grad():
        dropped = apply_dropout(cut.z.detach(), cut.keep, alg.knobs.cut_dropout)[0, : cut.count]
    records = {
        "smashed_up": get_codec(alg.cfg.codec_up).encode({"z": dropped}, False, None),
        "labels_up": {"y": cut.y[0, : cut.count]},
    }
    return records, {"compute_seconds": time.perf_counter() - began}


def backward(node: Node, t: int, state: ClientState, grad: torch.Tensor) -> tuple[ClientState, float]:
    """The client's state after round t: the returned gradient of its kept entries back-propagated (the
    forward pass redone from the same state and keys), then pruned, masked, quantized and stepped."""
    alg: FedSLRounds = node.algorithm
    began = time.perf_counter()
    cut = _cut(node, t, state)
    full = torch.zeros_like(cut.z)
    full[0, : cut.count] = grad.to(full)
    grads = cut.pullback(apply_dropout(full, cut.keep, alg.knobs.cut_dropout))
    knobs = alg.knobs
    rho = sparsity_target(t, knobs.schedule_rounds, knobs.final_sparsity)
    masks = {name: mask.bool().unsqueeze(0) for name, mask in state["masks"].items()}
    params, masks = alg.update(t, rho, cut.params, grads, masks, alg.cfg.optimizer.lr, node.client)
    new = {
        "params": {name: v[0].detach() for name, v in params.items()},
        "buffers": {name: v[0] for name, v in cut.buffers.items()},
        "masks": {name: m[0].to(torch.uint8) for name, m in masks.items()},
    }
    return new, time.perf_counter() - began
