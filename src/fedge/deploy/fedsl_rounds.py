"""Lightweight FedSL and traditional FedSL deployed: the simulated round, unchanged, with each client's
trunk forward, back-propagation and update (prune, mask, quantize, step) on its SuperNode.

A round is one step of every client, two messages each: ``query.forward`` carries the client's state
down (trunk, BatchNorm statistics, pruning mask) and brings back its kept cut entries (dropout applied)
and labels; the server app then takes the simulation's server side (the links' sends, the mean-gradient
step, the gradient of the kept entries) and ``train.backward`` carries each client its gradient and
brings back its updated state. The dropout masks and the quantizer's noise come from streams named by
the seed, round and client, so node and server draw the same ones.

The server app keeps every client's state, as the simulation does: its evaluation reads the average of
the trunks every round and the averaging every I rounds needs them. So the runtime carries each state
down and back every round in fp32 (``carried.csv`` shows it), while the ledger counts the protocol's
transfers: the cut exchange every round and the trunks' upload and broadcast every I rounds.

A client whose node does not answer the forward message sends nothing that round (a zero gradient in
the server's mean over all clients, Eq. 7; its state unchanged); one that does not answer the backward
message keeps its state. Either way its loss in the round's mean is the mean of the others'.
"""

from __future__ import annotations

import torch

from fedge.algorithms.base import Context
from fedge.algorithms.split.fedsl_client import cut_masks
from fedge.algorithms.split.fedsl_steps import ServedCut, Trained
from fedge.algorithms.split.light_fedsl import FedSL, LightFedSL
from fedge.deploy.transport import Outgoing, Reply, Transport, dropout_figures
from fedge.deploy.wire import F32, Spec, expect, labels, wire_dtype
from fedge.engine.noise import RowKeys
from fedge.errors import ConfigError, FedgeError
from fedge.metrics import RoundReport
from fedge.tensors import Tensors, rows

STATE = ("params", "buffers", "masks")


class DeployedFedSL:
    """Mixed in front of a :class:`~fedge.algorithms.split.light_fedsl.FedSLRounds` (lightweight FedSL or
    its baseline): the clients' steps on their nodes, the round's dropouts in its metrics row."""

    transport: Transport
    ctx: Context

    def check_deployable(self) -> None:
        """Every setting is carried (the cut's codecs are fp32 or fp16, which the runtime carries) but
        the privacy mechanisms: a node trains and sends its cut data itself."""
        for block in ("cut", "labels", "sample"):
            if getattr(self.ctx.config.privacy, block) is not None:
                clear = "a deployed node trains and sends the cut's data in clear"
                raise ConfigError(f"privacy.{block}", clear)

    def run_round(self, t: int) -> RoundReport:
        report = super().run_round(t)
        return RoundReport(report.train_loss, {**report.extra, **dropout_figures(self.transport, t)})

    def client_steps(self, t: int, rho: float, index: torch.Tensor, counts: torch.Tensor) -> Trained:
        """The simulation's steps 1-3 with each client's side on its node (``rho`` is the node's to
        compute: it follows from the round)."""
        every = self.ctx.executor.phase_keys(range(len(self.nodes)))  # the round's stream, as simulated
        keys = None if every is None else RowKeys(every.base)
        state = self._client_state()
        sizes = {k: int(c) for k, c in enumerate(counts.tolist())}
        forward = self._forward(t, state, sizes)
        served = self._serve(t, index, counts, forward, keys)
        backward = self._backward(t, state, {k: sizes[k] for k in forward}, served.grad)
        loss = served.loss.clone()
        answered = torch.tensor([k in backward for k in range(len(self.nodes))])
        if not bool(answered.any()):
            raise FedgeError(f"round {t}: no client replied ({self.transport.dropped.get(t)})")
        loss[~answered] = loss[answered].mean()
        states = {
            part: {name: torch.stack([backward.get(k, state[k])[part][name] for k in state]) for name in held}
            for part, held in self.clients.items()
        }
        states["masks"] = {name: mask.bool() for name, mask in states["masks"].items()}
        return Trained(states, loss, served.up_bits, served.down_bits)

    def _client_state(self) -> dict[int, dict[str, Tensors]]:
        """Each client's state as it travels (masks as bytes)."""
        n = len(self.nodes)
        masks = {name: mask.to(torch.uint8) for name, mask in self.clients["masks"].items()}
        held = {"params": self.clients["params"], "buffers": self.clients["buffers"], "masks": masks}
        return {k: {part: rows(held[part], k) for part in STATE} for k in range(n)}

    def _forward(
        self, t: int, state: dict[int, dict[str, Tensors]], sizes: dict[int, int]
    ) -> dict[int, Reply]:
        """``query.forward`` to every client: its kept cut entries and labels, by client."""
        up = wire_dtype(self.cfg.codec_up)
        outgoing = {
            k: Outgoing({part: (tensors, F32) for part, tensors in s.items()}) for k, s in state.items()
        }
        specs = {
            k: {"smashed_up": {"z": Spec(None, up)}, "labels_up": {"y": labels(sizes[k], self.ctx.data)}}
            for k in state
        }
        replies = self.transport.exchange(t, "query.forward", outgoing, specs)
        for k, reply in list(replies.items()):
            if len(reply.records["smashed_up"]["z"]) != sizes[k]:
                self.transport.drop(t, k, f"query.forward: rejected: not {sizes[k]} rows")
                del replies[k]
        return replies

    def _serve(
        self,
        t: int,
        index: torch.Tensor,
        counts: torch.Tensor,
        forward: dict[int, Reply],
        keys: RowKeys | None,
    ) -> ServedCut:
        """The server's side of the round on the clients' uploads, stacked as the simulation stacks them
        (clients that sent nothing count zero rows)."""
        if not forward:
            raise FedgeError(f"round {t}: no client replied ({self.transport.dropped.get(t)})")
        device, n = self.ctx.device, len(self.nodes)
        first = next(iter(forward.values())).records
        dropped = torch.zeros(n, index.shape[1], *first["smashed_up"]["z"].shape[1:], device=device)
        targets = first["labels_up"]["y"].shape[1:]  # none for classes, the sequence for a language model
        y = torch.zeros(n, index.shape[1], *targets, dtype=torch.int64, device=device)
        own = torch.zeros_like(counts)
        for k, reply in forward.items():
            c = int(counts[k])
            dropped[k, :c], y[k, :c], own[k] = (
                reply.records["smashed_up"]["z"],
                reply.records["labels_up"]["y"],
                c,
            )
        keep = cut_masks(self.ctx.seed, t, own, dropped, 0, self.knobs.cut_dropout)
        return self.server_side(t, dropped, y, own, keep, keys)

    def _backward(
        self, t: int, state: dict[int, dict[str, Tensors]], sizes: dict[int, int], grad: torch.Tensor
    ) -> dict[int, dict[str, Tensors]]:
        """``train.backward`` to the clients that sent: their updated states, by client."""
        down = wire_dtype(self.cfg.codec_down)
        outgoing = {k: Outgoing({"grad_down": ({"g": grad[k, :c]}, down)}) for k, c in sizes.items()}
        specs = {k: {part: expect(state[k][part], F32) for part in STATE} for k in sizes}
        replies = self.transport.exchange(t, "train.backward", outgoing, specs)
        return {k: reply.records for k, reply in replies.items()}


class DeployedLightFedSL(DeployedFedSL, LightFedSL):
    """Lightweight FedSL with its clients on their nodes."""


class DeployedTraditionalFedSL(DeployedFedSL, FedSL):
    """Traditional FedSL (lightweight FedSL's baseline) with its clients on their nodes."""
