"""The remote executor: the executor seam (:meth:`fedge.engine.executors.Executor.train`) with every row
trained on its client's SuperNode, so an algorithm's own round runs deployed unchanged.

A ``train`` call sends each client the rows it owns (their parameters, buffers and optimizer state),
their batch plan (sample indices into the client's data, per-sample weights, step counts), their noise
keys and the names of the step function and data set on the algorithm; the node trains them with its own
executor (:func:`fedge.deploy.node.Node.train_rows`) and sends the rows back. The server's noise stream
draws the keys, so a row's dropout masks are the simulation's; the algorithm's links encode, count and
decode every transfer in the server app exactly as in a simulation (the wire carries fp32 rows).

A client that does not train in a call (no reply in time, an error, a malformed reply; or dropped
earlier in the round) keeps the rows it was sent: it counts as a client that did not move. Its loss is
the mean loss of the rows that trained. :attr:`RemoteExecutor.untrained` lists such clients per round,
and :class:`fedge.deploy.rounds.DeployedRounds` writes them into the round's metrics row.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from fedge.data.federated import BatchPlan, FederatedData
from fedge.deploy.transport import Outgoing, Transport
from fedge.deploy.wire import F32, expect
from fedge.engine import ClientBank
from fedge.engine.executors import Executor, Mapped
from fedge.engine.step import StepFn
from fedge.errors import FedgeError
from fedge.tensors import Tensors

STATE = ("params", "buffers", "opt_state")
MESSAGE = "train.rows"


def attribute_name(algorithm: Any, value: object, kind: str) -> str:
    """The name under which the run's adversary (:func:`_adversaries`: the data view its malicious
    clients train on), ``algorithm``'s context (``ctx.<name>``) or ``algorithm`` holds ``value``: how a
    node, which builds the same algorithm from the same config, finds the same step function or data set.
    The algorithm's own attributes come last: a round may reassign one (the peers' ``train_data``, the
    adversary's view from ``start_round`` on), which a node, running no round, still holds as built."""
    owners = [*_adversaries(algorithm), (algorithm.ctx, "ctx."), (algorithm, "")]
    for owner, prefix in owners:
        for name, held in vars(owner).items():
            if held is value:
                return prefix + name
    raise FedgeError(f"{type(algorithm).__name__} trains with a {kind} it does not hold: cannot deploy it")


def _adversaries(algorithm: Any) -> list[tuple[object, str]]:
    """The run's adversary objects with their dotted paths: an ``adversary`` of the algorithm or of its
    ``rounds`` (the star's and a hierarchy's), and the ``adversary`` each of those wraps (the peers'
    :class:`~fedge.runtime.peer_adversary.PeerAdversary` wraps the run's
    :class:`~fedge.runtime.adversary.Adversary`)."""
    found: list[tuple[object, str]] = []
    frontier: list[tuple[object, str]] = [(algorithm, ""), (getattr(algorithm, "rounds", None), "rounds.")]
    while frontier:
        owner, prefix = frontier.pop(0)
        held = getattr(owner, "adversary", None)
        if held is not None:
            found.append((held, f"{prefix}adversary."))
            frontier.append((held, f"{prefix}adversary."))
    return found


def resolve(algorithm: Any, name: str) -> Any:
    """The value :func:`attribute_name` named (a dotted path from ``algorithm``)."""
    return functools.reduce(getattr, name.split("."), algorithm)


def _take(tensors: Tensors, index: torch.Tensor) -> Tensors:
    """Rows ``index`` of every tensor (on the tensor's device)."""
    return {k: v[index.to(v.device)] for k, v in tensors.items()}


def _narrow(index: torch.Tensor) -> torch.Tensor:
    """Sample indices as int32 on the wire where they fit (half the bytes of the plan's int64)."""
    return index.to(torch.int32) if index.numel() and int(index.max()) < 2**31 else index


class RemoteExecutor(Executor):
    """Trains each row of a bank on its client's node through ``transport`` (``local``: the run's own
    executor, whose noise root this one shares and draws the rows' keys from)."""

    name = "remote"

    def __init__(self, algorithm: Any, transport: Transport, local: Executor):
        self.algorithm = algorithm
        self.transport = transport
        self.noise = local.noise
        self.round = 0
        self.untrained: dict[int, set[int]] = {}

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        outgoing, specs, index_of = self.messages(step, bank, plan, data, lr)
        replies = self.transport.exchange(self.round, MESSAGE, outgoing, specs)
        return self._adopt(bank, (bank.params, bank.buffers, bank.opt_state), replies, index_of, data.device)

    def messages(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> tuple[dict[int, Outgoing], dict[int, dict], dict[int, torch.Tensor]]:
        """Each client's message of a ``train`` call (its rows, their batch plan and noise keys, the step
        function's and data set's names), the checks of its reply, and its rows' positions in the bank."""
        keys = self.phase_keys(bank.clients)  # the server's stream: the phase a simulation would take
        config = {
            "step": attribute_name(self.algorithm, step, "step function"),
            "data": attribute_name(self.algorithm, data, "data set"),
            "lr": float(lr),
        }
        state = (bank.params, bank.buffers, bank.opt_state)
        batches = {"index": _narrow(plan.index), "weight": plan.weight, "steps": plan.steps}
        owners = np.asarray(bank.clients, dtype=np.int64)
        outgoing, specs, index_of = {}, {}, {}
        for client in dict.fromkeys(int(c) for c in owners):
            index = torch.as_tensor(np.flatnonzero(owners == client))
            sent = {name: _take(t, index) for name, t in zip(STATE, state, strict=True)}
            records = {name: (t, None) for name, t in sent.items()}
            records["plan"] = (_take(batches, index), None)
            if keys is not None:
                records["keys"] = (_take({"base": keys.base}, index), None)
            outgoing[client] = Outgoing(records, config)
            losses = {"loss": torch.zeros(len(index), dtype=torch.float32)}
            specs[client] = {**{name: expect(t, F32) for name, t in sent.items()}, "losses": expect(losses)}
            index_of[client] = index
        return outgoing, specs, index_of

    def _adopt(
        self,
        bank: ClientBank,
        state: tuple[Tensors, ...],
        replies: dict[int, Any],
        index_of: dict[int, torch.Tensor],
        device: torch.device,
    ) -> torch.Tensor:
        """The bank holds the trained rows (an untrained client's rows as sent); each row's loss."""
        if not replies:
            raise FedgeError(
                f"round {self.round}: no client trained ({self.transport.dropped.get(self.round)})"
            )
        owned = (
            bank.owned
        )  # trained in place; otherwise the bank gets new tensors and the given stay as they are
        new = state if owned else tuple({k: v.clone() for k, v in tensors.items()} for tensors in state)
        losses = torch.full((len(bank),), float("nan"), device=device)
        for client, reply in replies.items():
            index = index_of[client]
            for name, tensors in zip(STATE, new, strict=True):
                for k, v in reply.records[name].items():
                    tensors[k][index.to(tensors[k].device)] = v.to(tensors[k])
            losses[index.to(device)] = reply.records["losses"]["loss"].to(losses)
        missing = sorted(set(index_of) - set(replies))
        if missing:
            self.untrained.setdefault(self.round, set()).update(missing)
            losses = torch.where(torch.isnan(losses), losses.nanmean(), losses)
        if not owned:
            bank.adopt(*new, owned=False)
        return losses

    def map(self, fn, *, state, batch, shared, counts, inputs=(), keys=None, stage="map") -> Mapped:
        """Refused: ``map`` is per-batch client work on batch tensors the caller already holds, which
        would run here, in the server app, not on the nodes (split learning's rounds)."""
        raise FedgeError(
            f"{type(self.algorithm).__name__} maps per-batch client work ({stage}): the remote executor "
            "trains whole local phases only"
        )
