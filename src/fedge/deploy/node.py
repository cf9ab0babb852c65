"""The client side of a deployed run: what a SuperNode computes for each message, with fedge's own step
functions, on its own client's batches and state.

A node builds the run from the same config (:func:`fedge.runner.loop.build_run`: its partition follows from
the run seed, exactly as in a simulation) and trains only the client named by its ``partition-id``. Its
state between the messages of a split round (parameters, buffers, optimizer state) is returned to the
caller, which keeps it in the node's Flower context. Floating tensors travel in the codec's wire dtype.

Under a split ``adversary`` a malicious node lies where a simulated malicious client does
(:mod:`fedge.runtime.split_adversary`): it trains on its flipped labels and sends them (``label_flip``),
and it poisons its smashed data before it sends it (``smashed_noise``, ``smashed_flip``: the simulation
poisons it before the up link encodes it), with the simulation's draws; the server poisons uploaded client
models at receipt, as simulated.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedge.algorithms.split.participation import draw
from fedge.algorithms.split.plans import round_plan
from fedge.algorithms.split.protocol import GradientReturn, SplitLearning
from fedge.algorithms.split.server import Served
from fedge.comm.registry import get_codec
from fedge.config import RunConfig
from fedge.data.federated import BatchPlan, FederatedData
from fedge.deploy.executor import resolve
from fedge.deploy.wire import wire_dtype
from fedge.engine import ClientBank, stack_copies
from fedge.engine.noise import RowKeys
from fedge.errors import ConfigError, FedgeError
from fedge.runner.loop import build_run
from fedge.tensors import Tensors, floating, rows

State = tuple[Tensors, Tensors, Tensors]  # one row of params, buffers, optimizer state


class GivenKeys:
    """A node's noise root for one executor call: the row keys the server's stream drew (a node never
    draws keys of its own, so its dropout masks are the simulation's)."""

    def __init__(self, base: torch.Tensor):
        self.base = base

    def next_phase(self, clients: Sequence[int]) -> RowKeys:
        return RowKeys(self.base)


@dataclass
class RowRound:
    """This node's row in round t: its batches over the data it trains on (an attacking ``label_flip``
    client's flipped labels), noise keys and client step size, and which of its client's rows it is
    (``occurrence``: smashed-data draws are keyed by it)."""

    row: int
    occurrence: int
    data: FederatedData
    index: torch.Tensor  # [1, steps, batch]
    weight: torch.Tensor
    keys: RowKeys | None
    lr: float

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs, labels, 0/1 weights ([1, batch, ...]) and real-row count ([1]) of ``step``."""
        data = self.data
        idx = self.index[:, step]
        w = self.weight[:, step]
        return data.x_train[idx], data.y_train[idx], w, (w > 0).sum(dim=1)


class Node:
    """One client's side of a deployed run."""

    def __init__(self, config: RunConfig, client: int):
        self.built = build_run(config)
        self.client = client
        if not 0 <= client < self.built.context.data.num_clients:
            raise ConfigError("partition-id", f"{client} is not a client of this run")

    @property
    def algorithm(self):
        return self.built.algorithm

    def wire_up(self) -> np.dtype:
        """The dtype of what this node sends up (its up codec's; the hierarchical links are fp32)."""
        return wire_dtype(getattr(self.algorithm.cfg, "codec_up", "fp32"))

    # ----- rows of any executor call (the remote executor) ------------------------------------------

    def train_rows(
        self, received: dict[str, Tensors], config: dict
    ) -> tuple[dict[str, Tensors], dict[str, float]]:
        """Train the rows the server sent (its executor's ``train`` call, for this client's rows only)
        with this node's executor, the step function and data set the config names, and the server's
        noise keys; the trained rows and their losses."""
        alg = self.algorithm
        ctx = self.built.context
        if int(config["client"]) != self.client:
            raise ConfigError(
                "partition-id", f"rows of client {config['client']} sent to client {self.client}"
            )
        began = time.perf_counter()
        plan = received["plan"]
        count = len(plan["steps"])
        clients = (self.client,) * count
        bank = ClientBank(clients, received["params"], received["buffers"], received["opt_state"], owned=True)
        batches = BatchPlan(clients, plan["index"].long(), plan["weight"], plan["steps"])
        step, data = resolve(alg, str(config["step"])), resolve(alg, str(config["data"]))
        executor = ctx.executor
        executor.noise = GivenKeys(received["keys"]["base"]) if "keys" in received else None
        alg.model.train()
        losses = executor.train(step, bank, batches, data, float(config["lr"]))
        records = {"params": bank.params, "buffers": bank.buffers, "opt_state": bank.opt_state}
        records["losses"] = {"loss": losses.float()}
        return records, {"compute_seconds": time.perf_counter() - began}

    def secure_rows(
        self, received: dict[str, Tensors], config: dict
    ) -> tuple[list[np.ndarray], int, dict[str, bool | bytes | float | int | str]]:
        """Flower's SecAgg+ fit (wrapped by its ``secaggplus_mod``): the row :meth:`train_rows` trains,
        as the arrays the mod quantizes and masks (parameters then floating buffers, through the up
        codec as a simulated upload is, in float64: Flower quantizes to up to 31 bits), the client's
        sample count (its weight), its loss and compute seconds, and its integer counters in clear
        (int64 bytes: they are not secret, the simulated stage takes the largest of them too)."""
        records, metrics = self.train_rows(received, config)
        if len(records["losses"]["loss"]) != 1:
            raise FedgeError(
                f"client {self.client} trains {len(records['losses']['loss'])} rows: secagg sums one"
            )
        params, buffers = rows(records["params"], 0), rows(records["buffers"], 0)
        model = get_codec(self.algorithm.cfg.codec_up).encode({**params, **floating(buffers)}, False, None)
        arrays = [v.detach().cpu().double().numpy() for v in model.values()]
        counters: dict[str, bool | bytes | float | int | str] = {
            f"counter:{k}": v.cpu().long().numpy().tobytes()
            for k, v in buffers.items()
            if not v.is_floating_point()
        }
        count = int(self.built.context.data.client_sizes(np.asarray([self.client]))[0])
        return arrays, count, {"loss": float(records["losses"]["loss"][0]), **metrics, **counters}

    # ----- split learning ----------------------------------------------------------------------------

    def row_round(self, t: int) -> RowRound:
        """This node's row of round t, with the round's noise streams opened as the server opens them."""
        alg: SplitLearning = self.algorithm
        ctx, cfg = self.built.context, alg.cfg
        draws = draw(
            ctx.seed, t, ctx.data.num_clients, cfg.participation, cfg.clients_per_round, cfg.duplicates
        )
        mine = np.flatnonzero(draws.clients == self.client)
        if len(mine) != 1:
            raise ConfigError(
                "algorithm.participation", f"client {self.client} has {len(mine)} rows in round {t}"
            )
        r = int(mine[0])
        data = alg.training(t)  # a backdoor's stamped copies, which the plan indexes
        plan = round_plan(data, draws, t, cfg.batch_size, cfg.local_epochs, cfg.local_steps, cfg.drop_last)
        plan = alg.step_limits(t, plan)
        ctx.start("train", t)
        keys = ctx.executor.phase_keys(draws.clients)
        alg.parts.model.train()
        alg.parts.local.train()
        lr, _ = alg.learning_rates(t)
        return RowRound(
            r,
            int(draws.occurrence[r]),
            data,
            plan.index[r : r + 1],
            plan.weight[r : r + 1],
            None if keys is None else keys.rows([r]),
            lr,
        )

    def sent_smashed(
        self, t: int, rr: RowRound, step: int, z: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """Smashed data ``z`` ([1, batch, ...], ``counts`` real) of ``step`` as this client sends it:
        poisoned when it is a malicious one that attacks at the cut (unchanged otherwise)."""
        adversary = self.algorithm.adversary
        if adversary is None:
            return z
        client, occurrence = np.asarray([self.client]), np.asarray([rr.occurrence])
        return adversary.smashed(t, client, occurrence, step, z, counts)

    def split_start(self, received: dict[str, Tensors]) -> State:
        """The row's state from the broadcast parts (``model_down``, ``aux_down``), fresh optimizer state."""
        alg: SplitLearning = self.algorithm
        model: Tensors = {}
        for payload in received.values():
            model.update(payload)
        params = {k: model.get(k, v) for k, v in alg.client["params"].items()}
        buffers = {k: model.get(k, v) for k, v in alg.client["buffers"].items()}
        return stack_copies(params, 1), stack_copies(buffers, 1), stack_copies(alg.client_sgd.init(params), 1)

    def held_aux(
        self, received: dict[str, Tensors], kept: tuple[Tensors, int] | None, expected: int
    ) -> tuple[Tensors, int]:
        """FSL-SAGE: the aux model this client trains with when the server last aligned it in round
        ``expected`` (0: never, the initial model), and that round: the one the message carries (a
        delivery the node missed), else the one the node ``kept`` (model, round); a stale one is refused."""
        if "aux_down" in received:
            return received["aux_down"], expected
        model, round_ = kept if kept is not None else ({}, 0)
        if round_ != expected:
            raise FedgeError(
                f"client {self.client} holds the aux model aligned in round {round_}, the server's is from "
                f"round {expected}"
            )
        return model, round_

    def split_upload(self, state: State) -> dict[str, Tensors]:
        """The row's client model as it travels up: ``model_up`` (trunk) and ``aux_up`` (a shared head)."""
        alg: SplitLearning = self.algorithm
        params, buffers, _ = (rows(s, 0) for s in state)
        codec = get_codec(alg.cfg.codec_up)
        out = {}
        for name, part in alg.exchanged_parts():
            sent = {**part(params), **floating(part(buffers))}
            if sent:
                out[f"{name}_up"] = codec.encode(sent, False, None)
        return out

    def aux_round(self, t: int, state: State) -> tuple[State, dict[str, Tensors], dict[str, float]]:
        """All local steps of an aux-head round (CSE-FSL, FSL_AN): the new state, the smashed data and
        labels of the upload steps (real rows only), and each step's loss and sample count."""
        alg: SplitLearning = self.algorithm
        began = time.perf_counter()
        rr = self.row_round(t)
        codec = get_codec(alg.cfg.codec_up)
        smashed, labels, upload_steps, upload_counts = [], [], [], []
        losses, counts_per_step = [], []
        for s in range(rr.index.shape[1]):
            x, y, w, counts = rr.batch(s)
            if not bool(counts.any()):
                losses.append(0.0)
                counts_per_step.append(0)
                continue
            c = int(counts[0])

            def exchange(z: torch.Tensor, grad_z: bool, y=y, c=c, s=s, counts=counts) -> Served:
                sent = self.sent_smashed(t, rr, s, z, counts)
                smashed.append(codec.encode({"z": sent[0, :c].detach()}, False, None)["z"])
                labels.append(y[0, :c])
                upload_steps.append(s)
                upload_counts.append(c)
                return Served(torch.zeros(1), None)

            keys = None if rr.keys is None else rr.keys.at(s)
            step = alg.clients.step(state, (x, y, w), counts, rr.lr, keys, exchange, alg.uploads_at(s))
            state = step.state
            losses.append(float(step.loss[0]))
            counts_per_step.append(c)
        records = {
            "smashed_up": _ragged(smashed, "z"),
            "labels_up": _ragged(labels, "y"),
            "steps": {
                "loss": torch.tensor(losses, dtype=torch.float32),
                "counts": torch.tensor(counts_per_step, dtype=torch.int64),
                "upload_steps": torch.tensor(upload_steps, dtype=torch.int64),
                "upload_counts": torch.tensor(upload_counts, dtype=torch.int64),
            },
            **self.split_upload(state),
        }
        return state, records, {"compute_seconds": time.perf_counter() - began}

    def smashed(self, t: int, step: int, state: State) -> tuple[dict[str, Tensors], dict[str, float]]:
        """SplitFed: the forward pass of ``step`` to the cut; its smashed data and labels (real rows)."""
        alg: GradientReturn = self.algorithm
        began = time.perf_counter()
        rr = self.row_round(t)
        x, y, _, counts = rr.batch(step)
        params, buffers, _ = state
        trunk = {k: v for k, v in params.items() if k.startswith("trunk.")}
        keys = None if rr.keys is None else rr.keys.at(step)
        with torch.no_grad():
            z, _, _ = alg.ctx.executor.forward_with_vjp(alg.clients.forward, trunk, buffers, x, counts, keys)
        c = int(counts[0])
        z = self.sent_smashed(t, rr, step, z, counts)
        z_sent = get_codec(alg.cfg.codec_up).encode({"z": z[0, :c]}, False, None)
        records = {"smashed_up": z_sent, "labels_up": {"y": y[0, :c]}}
        return records, {"compute_seconds": time.perf_counter() - began}

    def apply_gradients(self, t: int, step: int, state: State, grad: torch.Tensor) -> tuple[State, float]:
        """SplitFed: back-propagate the returned cut-layer gradient of ``step`` and take the step (the
        forward pass is redone from the same state and keys, so it is the one the smashed data came from)."""
        alg: GradientReturn = self.algorithm
        began = time.perf_counter()
        rr = self.row_round(t)
        x, _, _, counts = rr.batch(step)
        full = torch.zeros(1, x.shape[1], *grad.shape[1:], dtype=grad.dtype)
        full[0, : grad.shape[0]] = grad
        keys = None if rr.keys is None else rr.keys.at(step)
        step_out = alg.clients.backprop_step(
            state, x, counts, rr.lr, keys, lambda z, grad_z: Served(torch.zeros(1), full)
        )
        return step_out.state, time.perf_counter() - began


def _ragged(values: list[torch.Tensor], name: str) -> Tensors:
    """Several batches' real rows as one array (concatenated along rows); empty when there are none."""
    if not values:
        return {name: torch.zeros(0)}
    return {name: torch.cat(values)}
