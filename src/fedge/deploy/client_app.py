"""The Flower ClientApp of a deployed fedge run (``clientapp = "fedge.deploy.client_app:app"``).

A node keeps its split-round state (its row's parameters, buffers and optimizer state; an FSL-SAGE
client's aux model across rounds) in the Flower context's state between messages. The built run (data,
model, algorithm) is kept in this process per run and partition: a SuperNode's default ClientApp
process handles one message and builds it again, while a long-lived one
(:mod:`fedge.deploy.app_process`) builds it once per run. The client is the node's ``partition-id``;
``num-partitions`` must equal the config's number of clients (the server checks it).
"""

from __future__ import annotations

import time

import yaml
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat

from fedge.deploy import fedsl_node
from fedge.deploy.node import Node, State
from fedge.deploy.wire import F32, from_record, to_record
from fedge.errors import ConfigError
from fedge.extend import parse_config
from fedge.tensors import Tensors

app = ClientApp()
STATE = ("fedge.params", "fedge.buffers", "fedge.opt")
FEDSL_STATE = ("params", "buffers", "masks")  # a lightweight-FedSL client's state, kept as fedge.<part>
AUX, AUX_ROUND = "fedge.aux", "fedge.aux_round"  # an FSL-SAGE client's aux model and its alignment round


_BUILT: dict[tuple[int, int], Node] = {}  # the node of the latest (run id, partition id) this process served


def _node(context: Context) -> Node:
    """This node's client side of the context's run, built on the run's first message in this process
    and reused by the next ones (a new run replaces the last run's)."""
    key = (int(context.run_id), int(context.node_config["partition-id"]))
    if key not in _BUILT:
        _BUILT.clear()
        config = parse_config(yaml.safe_load(str(context.run_config["config"])))
        _BUILT[key] = Node(config, key[1])
    return _BUILT[key]


def _reply(
    msg: Message, node: Node, records: dict[str, Tensors], metrics: dict[str, float], exact: bool = False
) -> Message:
    """``records`` in the up codec's dtype (``exact``: floating values in fp32; ``steps`` always exact)."""
    up = F32 if exact else node.wire_up()
    content = RecordDict({name: to_record(t, None if name == "steps" else up) for name, t in records.items()})
    content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=msg)


def _received(msg: Message) -> dict[str, Tensors]:
    return {name: from_record(record) for name, record in msg.content.array_records.items()}


def _save(context: Context, state: State) -> None:
    for name, tensors in zip(STATE, state, strict=True):
        context.state[name] = to_record(tensors)


def _load(context: Context) -> State:
    return tuple(from_record(context.state[name]) for name in STATE)


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    """Which client this node is."""
    node = {k: int(context.node_config[k]) for k in ("partition-id", "num-partitions")}
    return Message(RecordDict({"node": ConfigRecord(node)}), reply_to=msg)


@app.train("rows")
def train_rows(msg: Message, context: Context) -> Message:
    """Rows of one executor call of the server's round (any algorithm the remote executor deploys),
    trained on this node; they travel back as they are (fp32: the server's links apply the codecs)."""
    node = _node(context)
    config = dict(msg.content.config_records["config"])
    records, metrics = node.train_rows(_received(msg), config)
    content = RecordDict({name: to_record(t) for name, t in records.items()})
    content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=msg)


def _kept_aux(context: Context) -> tuple[Tensors, int] | None:
    """FSL-SAGE: the aux model this node keeps and the round the server aligned it in (None: none yet)."""
    if AUX not in context.state:
        return None
    return from_record(context.state[AUX]), int(context.state[AUX_ROUND]["round"])


def _keep_aux(context: Context, model: Tensors, round_: int) -> None:
    context.state[AUX] = to_record(model)
    context.state[AUX_ROUND] = ConfigRecord({"round": round_})


def secure_fit(msg: Message, context: Context) -> Message:
    """Stage 2 of Flower's SecAgg+ (inside its ``secaggplus_mod``): train the row the fit message
    carries and reply with it as a FitRes; the mod masks it and empties the reply's ArrayRecords."""
    node = _node(context)
    config = dict(msg.content.config_records["fitins.config"])
    received = {
        name: from_record(r) for name, r in msg.content.array_records.items() if name != "fitins.parameters"
    }
    arrays, count, metrics = node.secure_rows(received, config)
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), count, metrics)
    return Message(compat.fitres_to_recorddict(fitres, False), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """A stage of Flower's SecAgg+ workflow (a deployed FedAvg with ``secagg``): handled by Flower's
    ``secaggplus_mod`` around :func:`secure_fit`. Otherwise CSE-FSL, FSL_AN, FSL-SAGE: a whole aux-head
    split round's local work (FSL-SAGE's with the aux model its node keeps, ``aux_round`` naming the one
    the server expects)."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, secure_fit)
    node = _node(context)
    config = msg.content.config_records["config"]
    received = _received(msg)
    if "aux_round" in config:
        model, aligned = node.held_aux(received, _kept_aux(context), int(config["aux_round"]))
        if model:
            _keep_aux(context, model, aligned)
        received["aux_down"] = model
    _, records, metrics = node.aux_round(int(config["round"]), node.split_start(received))
    return _reply(msg, node, records, metrics)


@app.train("aux")
def keep_aux(msg: Message, context: Context) -> Message:
    """FSL-SAGE: keep the aux model the server aligned in round ``aux_round``; nothing goes back."""
    began = time.perf_counter()
    config = msg.content.config_records["config"]
    if int(config["client"]) != int(context.node_config["partition-id"]):
        raise ConfigError("partition-id", f"client {config['client']}'s aux model sent to another node")
    _keep_aux(context, _received(msg)["aux_down"], int(config["aux_round"]))
    metrics = {"compute_seconds": time.perf_counter() - began}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@app.query("smashed")
def smashed(msg: Message, context: Context) -> Message:
    """SplitFed v1, v2: a step's forward pass to the cut (the round's first also brings the model down)."""
    node = _node(context)
    config = msg.content.config_records["config"]
    received = _received(msg)
    state = node.split_start(received) if received else _load(context)
    if received:
        _save(context, state)
    records, metrics = node.smashed(int(config["round"]), int(config["step"]), state)
    return _reply(msg, node, records, metrics)


@app.train("apply_gradients")
def apply_gradients(msg: Message, context: Context) -> Message:
    """SplitFed: back-propagate a step's returned gradient; the round's last step uploads the model."""
    node = _node(context)
    config = msg.content.config_records["config"]
    grad = _received(msg)["grad_down"]["g"]
    state, seconds = node.apply_gradients(int(config["round"]), int(config["step"]), _load(context), grad)
    _save(context, state)
    records = node.split_upload(state) if bool(config["final"]) else {}
    return _reply(msg, node, records, {"compute_seconds": seconds})


@app.query("forward")
def cut_forward(msg: Message, context: Context) -> Message:
    """Lightweight FedSL: the client's state comes down; its kept cut entries and labels go up."""
    node = _node(context)
    state = _received(msg)
    for part in FEDSL_STATE:
        context.state[f"fedge.{part}"] = to_record(state[part])
    records, metrics = fedsl_node.forward(node, int(msg.content.config_records["config"]["round"]), state)
    return _reply(msg, node, records, metrics)


@app.train("backward")
def cut_backward(msg: Message, context: Context) -> Message:
    """Lightweight FedSL: back-propagate the returned gradient, update; the new state goes up (fp32)."""
    node = _node(context)
    state = {part: from_record(context.state[f"fedge.{part}"]) for part in FEDSL_STATE}
    grad = _received(msg)["grad_down"]["g"]
    t = int(msg.content.config_records["config"]["round"])
    new, seconds = fedsl_node.backward(node, t, state, grad)
    return _reply(msg, node, new, {"compute_seconds": seconds}, exact=True)
