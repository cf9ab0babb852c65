"""A deployed FedAvg round with the ``secagg`` stage: Flower's own SecAgg+ workflow carries the upload
and the sum (Bell et al., CCS 2020; Bonawitz et al., CCS 2017), so the server app only ever holds the
masked vectors and their unmasked weighted mean.

The star round (:class:`~fedge.runtime.star.StarRound`) keeps its own order: the broadcast, the batch
plan, the clock and the report are the algorithm's; its three server-client steps, train, collect and
aggregate, become one run of Flower's :class:`~flwr.server.workflow.SecAggPlusWorkflow`, driven per
round over a :class:`~flwr.server.compat.LegacyContext` with a small strategy: ``configure_fit`` names
the round's participants and their fit settings, the workflow's stage 2 (collect masked vectors)
carries each participant's rows, batch plan and noise keys, as the remote executor's ``train.rows``
message carries them, and ``aggregate_fit`` receives the unmasked weighted mean and each node's loss.
On the node Flower's ``secaggplus_mod`` wraps fedge's training (:func:`fedge.deploy.client_app.train`):
the node trains, reports its sample count as its weight, and the mod quantizes, masks and sends; it
empties every ArrayRecord of the reply, so no trained row leaves the node unmasked.

:class:`CountingGrid` is the workflow's grid: it pushes and pulls through the run's transport (its
round timeout, its short polling, its record of what was carried and of who dropped), and puts the
protocol's messages on the communication ledger at what they carry: the public keys, the encrypted
shares and the node ids at their byte lengths, each masked vector at ``bits`` per coordinate (Flower
sends its int64 array; the ledger counts the value's width mod ``2^bits``, as the simulated stage does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, FitRes, Parameters, bytes_to_ndarray, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from fedge.aggregation.secure_protocol import secagg_traffic
from fedge.comm import nodes
from fedge.data.federated import BatchPlan
from fedge.deploy.executor import RemoteExecutor
from fedge.deploy.secagg import SecAggOptions
from fedge.deploy.transport import GridTransport, Outgoing
from fedge.deploy.wire import to_record
from fedge.engine import ClientBank
from fedge.engine.step import StepFn
from fedge.errors import ConfigError, FedgeError
from fedge.runtime.context import Context as RunContext
from fedge.runtime.star import OptimizerStates, StarRound, StarRuntime
from fedge.tensors import Tensors, floating

ID_BITS = 64
"""A node id on Flower's wire (a ConfigRecord's sint64)."""
SCALAR_BITS = 64
"""A setting on Flower's wire (an int64 or a double)."""
KINDS = {
    (Stage.SETUP, "down"): "secagg_setup",
    (Stage.SETUP, "up"): "secagg_keys",
    (Stage.SHARE_KEYS, "down"): "secagg_keys",
    (Stage.SHARE_KEYS, "up"): "secagg_shares",
    (Stage.COLLECT_MASKED_VECTORS, "down"): "secagg_shares",
    (Stage.COLLECT_MASKED_VECTORS, "up"): "secagg_masked",
    (Stage.UNMASK, "down"): "secagg_unmask",
    (Stage.UNMASK, "up"): "secagg_unmask",
}
"""The ledger kind of each stage's messages each way: the simulated stage's kinds, plus the settings
Flower sends first (``secagg_setup``), which the simulation does not send."""


def _value_bits(value: Any) -> int:
    """Bits of one ConfigRecord value as carried: bytes and text at their length, numbers and ids at
    64 bits, lists element by element."""
    if isinstance(value, bytes | str):
        return 8 * len(value)
    if isinstance(value, list):
        return sum(_value_bits(v) for v in value)
    return SCALAR_BITS


@dataclass
class Summed:
    """What the server learns from one round's protocol: the survivors' weighted mean (Flower's
    arrays, in the rows' order), and from each surviving client its loss and integer counters."""

    mean: list[np.ndarray]
    losses: dict[int, float]
    counters: dict[int, dict[str, np.ndarray]]


class _Strategy(Strategy):
    """The legacy strategy the workflow asks: ``configure_fit`` picks the round's participants with
    their fit settings, ``aggregate_fit`` keeps the unmasked mean (every result carries it) and each
    node's metrics. Evaluation stays fedge's (the server app tests the global model itself)."""

    def __init__(self, proxies: dict[int, ClientProxy], settings: dict[int, dict[str, Any]], client_of):
        self.proxies, self.settings, self.client_of = proxies, settings, client_of
        self.summed: Summed | None = None

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        empty = Parameters(tensors=[], tensor_type="numpy.ndarray")
        return [(self.proxies[c], FitIns(empty, self.settings[c])) for c in self.proxies]

    def aggregate_fit(self, server_round, results: list[tuple[ClientProxy, FitRes]], failures):
        if not results:
            return None, {}
        mean = parameters_to_ndarrays(results[0][1].parameters)
        losses, counters = {}, {}
        for proxy, res in results:
            client = self.client_of[proxy.node_id]
            losses[client] = float(res.metrics["loss"])
            counters[client] = {
                k.removeprefix("counter:"): np.frombuffer(cast(bytes, v), dtype=np.int64)
                for k, v in res.metrics.items()
                if k.startswith("counter:")
            }
        self.summed = Summed(mean, losses, counters)
        return None, {}  # fedge keeps the model; the workflow's own copy is not needed

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class _Workflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow whose stage-2 fit instructions also carry fedge's records of each
    participant (its rows, batch plan and noise keys)."""

    def __init__(self, records: dict[int, dict[str, ArrayRecord]], **settings: Any):
        super().__init__(**settings)
        self.records = records

    def collect_masked_vectors_stage(self, grid, context, state) -> bool:
        for node, content in state.nid_to_fitins.items():
            for name, record in self.records[node].items():
                content[name] = record
        return super().collect_masked_vectors_stage(grid, context, state)


@dataclass
class CountingGrid:
    """The workflow's grid for round ``round``: its exchanges go through ``transport`` and onto the
    ledger of ``ctx``; ``ledger`` sums the bits by kind, ``masked_above`` the least share, over the
    senders, of masked coordinates above ``quantization`` (a quantized row never exceeds it, a masked
    one, uniform mod ``2^bits``, mostly does)."""

    transport: GridTransport
    ctx: RunContext
    round: int
    bits: int
    quantization: int
    ledger: dict[str, int] = field(default_factory=dict)
    masked_above: float = 1.0

    def __getattr__(self, name: str) -> Any:  # the rest of Flower's Grid
        return getattr(self.transport.grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Push ``messages``, pull their replies until all came or the round timeout passed; record each
        message both ways and drop, for the round, the clients that did not answer."""
        sent = list(messages)
        client_of = {node: client for client, node in self.transport.node_of.items()}
        stage = str(sent[0].content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]) if sent else ""
        for message in sent:
            self._account(stage, "down", client_of[message.metadata.dst_node_id], message.content)
        began = time.monotonic()
        ids = list(self.transport.grid.push_messages(sent))
        by_id = {mid: client_of[m.metadata.dst_node_id] for mid, m in zip(ids, sent, strict=True)}
        answers = self.transport._pull(by_id, began)
        replies = []
        for mid, client in by_id.items():
            reply, seconds = answers.get(mid, (None, None))
            if reply is None or reply.has_error():
                why = (
                    "no reply within the round timeout"
                    if reply is None
                    else f"error reply {reply.error.reason}"
                )
                self.transport.drop(self.round, client, f"secagg {stage}: {why}")
                if reply is None:
                    continue
            else:
                self._account(stage, "up", client, reply.content)
                metrics = reply.content.config_records.get("fitres.metrics", ConfigRecord({}))
                self.transport.timings.append(
                    {"round": self.round, "message": f"secagg.{stage}", "node": nodes.client(client),
                     "node_id": self.transport.node_of[client], "seconds": seconds,
                     "compute_seconds": metrics.get("compute_seconds")}
                )  # fmt: skip
            replies.append(reply)
        return replies

    def _account(self, stage: str, way: str, client: int, content: RecordDict) -> None:
        """Put one message's protocol values on the ledger; its ArrayRecords and its protocol record on
        the transport's record of what was carried."""
        src, dst = (
            (nodes.SERVER, nodes.client(client)) if way == "down" else (nodes.client(client), nodes.SERVER)
        )
        for name, record in content.array_records.items():
            self.transport._carry(self.round, src, dst, name, record)
        configs = content.config_records[RECORD_KEY_CONFIGS]
        held = sum(8 * len(k) + _value_bits(v) for k, v in configs.items()) // 8  # (Flower's count_bytes
        # fails on an empty list, as the unmask stage's list of dropped nodes usually is)
        self.transport.carried.append(
            {"round": self.round, "src": src, "dst": dst, "kind": f"secagg.{stage}", "bytes": held}
        )
        if Key.MASKED_PARAMETERS in configs:
            masked = [bytes_to_ndarray(b) for b in cast(list[bytes], configs[Key.MASKED_PARAMETERS])]
            coordinates = np.concatenate([m.ravel() for m in masked])
            self.masked_above = min(self.masked_above, float((coordinates > self.quantization).mean()))
            bits = len(coordinates) * self.bits
        else:
            values = {k: v for k, v in configs.items() if k != Key.STAGE}
            bits = sum(_value_bits(v) for v in values.values())
            bits += ID_BITS * len(values) if stage == Stage.SHARE_KEYS and way == "down" else 0  # keyed by id
        kind = KINDS[(stage, way)]
        self.ledger[kind] = self.ledger.get(kind, 0) + bits
        self.ctx.network.ledger.record(self.round, src, dst, kind, bits)


class SecAggPlusUpload:
    """Runs Flower's SecAgg+ once per round over the nodes of ``transport``; ``reports`` holds each
    round's settings, senders, dropped clients and bits by kind next to the simulated stage's formula
    (:func:`~fedge.aggregation.secure_protocol.secagg_traffic`)."""

    def __init__(self, ctx: RunContext, transport: GridTransport, options: SecAggOptions):
        if getattr(transport, "grid", None) is None:
            raise ConfigError(
                f"{options.key}.name", "secagg deploys on Flower's runtime only (there is no Grid)"
            )
        self.ctx, self.transport, self.options = ctx, transport, options
        self.reports: list[dict[str, Any]] = []

    def run(self, t: int, outgoing: dict[int, Outgoing], coordinates: int) -> Summed:
        """Round ``t``'s protocol over the clients of ``outgoing`` (their fit messages); the unmasked
        weighted mean of their ``coordinates`` trained values and each survivor's loss."""
        transport, clients = self.transport, sorted(outgoing)
        sizes = self.ctx.data.client_sizes(np.asarray(clients))
        settings = self.options.settings(len(clients), float(max(sizes)))
        node_of = transport.node_of
        proxies: dict[int, ClientProxy] = {c: GridClientProxy(node_of[c], transport.grid, 0) for c in clients}
        fit = {c: {"round": t, "client": c, **outgoing[c].config} for c in clients}
        strategy = _Strategy(proxies, fit, {n: c for c, n in node_of.items()})
        records = {
            node_of[c]: {
                name: to_record(tensors, dtype) for name, (tensors, dtype) in outgoing[c].records.items()
            }
            for c in clients
        }
        state = RecordDict({MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: t})})
        state[MAIN_PARAMS_RECORD] = ArrayRecord()
        context = LegacyContext(Context(0, 0, {}, state, {}), strategy=strategy)
        grid = CountingGrid(transport, self.ctx, t, self.options.bits, int(settings["quantization_range"]))
        try:
            workflow = _Workflow(records, **settings, timeout=transport.timeout)
        except ValueError as error:
            raise ConfigError(
                self.options.key, f"Flower's SecAgg+ refuses the settings {settings}: {error}"
            ) from None
        workflow(cast(Grid, grid), context)  # Flower's grid, counted
        if strategy.summed is None:
            lost = transport.dropped.get(t, {})
            raise FedgeError(f"round {t}: Flower's secure aggregation halted (too few nodes left: {lost})")
        dropped = sorted(set(clients) - set(strategy.summed.losses))
        holders = len(clients) if settings["num_shares"] == 1.0 else int(settings["num_shares"])
        self.reports.append(
            {
                "round": t,
                "senders": clients,
                "dropped": dropped,
                "settings": settings,
                "ledger": grid.ledger,
                "simulated_formula": secagg_traffic(
                    len(clients), coordinates, self.options.bits, holders - 1,
                    int(settings["reconstruction_threshold"]), len(dropped),
                ),
                "masked_above_quantization": grid.masked_above,
            }
        )  # fmt: skip
        return strategy.summed


@dataclass
class SecureStarRound(StarRound):
    """A star round whose train, collect and aggregate steps are one run of Flower's SecAgg+
    (:class:`SecAggPlusUpload`): ``train`` runs the protocol (the nodes train inside its stage 2),
    ``collect`` has nothing to collect (the server never holds a row) and ``aggregate`` returns the
    protocol's mean, held by every participant as FedAvg's aggregate is."""

    upload: SecAggPlusUpload | None = None
    names: list[str] = field(default_factory=list)
    summed: Summed | None = None

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, lr: float, states: OptimizerStates
    ) -> torch.Tensor:
        assert self.upload is not None
        executor = cast(RemoteExecutor, self.ctx.executor)
        outgoing, _, index_of = executor.messages(step, bank, plan, self.ctx.data, lr)
        model = {**bank.params, **floating(bank.buffers)}
        self.names = list(model)
        coordinates = sum(math.prod(t.shape[1:]) for t in model.values())
        self.summed = self.upload.run(self.round, outgoing, coordinates)
        losses = torch.full((len(bank),), float("nan"), device=self.ctx.device)
        for client, loss in self.summed.losses.items():
            losses[index_of[client].to(losses.device)] = loss
        lost = sorted(set(index_of) - set(self.summed.losses))
        if lost:
            executor.untrained.setdefault(self.round, set()).update(lost)
            losses = torch.where(torch.isnan(losses), losses.nanmean(), losses)
        return losses

    def collect(self, link, bank: ClientBank) -> Tensors:
        return {}

    def aggregate(self, stacked: Tensors, params: Tensors, buffers: Tensors) -> tuple[Tensors, Tensors]:
        assert self.summed is not None
        reference = {**params, **buffers}
        out = {
            name: torch.as_tensor(array).reshape(reference[name].shape).to(reference[name])
            for name, array in zip(self.names, self.summed.mean, strict=True)
        }
        for name, held in reference.items():
            if name not in out:  # an integer counter: the largest survivor's, as the simulated stage takes
                values = [c[name] for c in self.summed.counters.values() if name in c]
                largest = torch.as_tensor(np.stack(values).max(axis=0)) if values else held
                out[name] = largest.reshape(held.shape).to(held)
        new_params, new_buffers = {k: out[k] for k in params}, {k: out[k] for k in buffers}
        self.ctx.network.hold(self.receivers, "model", out)
        return new_params, new_buffers


class SecureRounds:
    """A star runtime whose rounds are :class:`SecureStarRound`\\ s over ``upload``."""

    def __init__(self, rounds: StarRuntime, upload: SecAggPlusUpload):
        self.rounds, self.upload = rounds, upload

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rounds, name)

    def open(self, t: int) -> SecureStarRound | None:
        rnd = self.rounds.open(t)
        if rnd is None:
            return None
        return SecureStarRound(**{f.name: getattr(rnd, f.name) for f in fields(rnd)}, upload=self.upload)
