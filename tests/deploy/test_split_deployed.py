"""The deployed split rounds without the runtime: the server side of ``fedge deploy`` (the simulated
round with its local steps on the nodes) against nodes that answer in this process. It must end with the
simulation's model and ledger; a node that stops answering leaves the round, which completes on the
others."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("flwr")

from fedge.api import resolve_config  # noqa: E402
from fedge.deploy import fedsl_node  # noqa: E402
from fedge.deploy.fedsl_rounds import DeployedLightFedSL, DeployedTraditionalFedSL  # noqa: E402
from fedge.deploy.node import Node  # noqa: E402
from fedge.deploy.split_rounds import (  # noqa: E402
    DeployedCseFsl,
    DeployedFslAn,
    DeployedFslSage,
    DeployedSplitFedV1,
    DeployedSplitFedV2,
)
from fedge.deploy.transport import Outgoing, Reply  # noqa: E402
from fedge.errors import ConfigError  # noqa: E402
from fedge.runner.loop import build_run  # noqa: E402

CLIENTS = 3
ALGORITHMS = {
    "cse_fsl": ({"name": "cse_fsl", "h": 2, "local_steps": 4, "batch_size": 32}, DeployedCseFsl),
    "splitfed_v2": ({"name": "splitfed_v2", "local_steps": 2, "batch_size": 32}, DeployedSplitFedV2),
    "fsl_an": ({"name": "fsl_an", "local_steps": 3, "batch_size": 32}, DeployedFslAn),
    "splitfed_v1": ({"name": "splitfed_v1", "local_steps": 2, "batch_size": 32}, DeployedSplitFedV1),
    "light_fedsl": (
        {"name": "light_fedsl", "batch_size": 32, "agg_interval": 2, "final_sparsity": 0.5, "quant_bits": 4},
        DeployedLightFedSL,
    ),
    "fedsl": ({"name": "fedsl", "batch_size": 32}, DeployedTraditionalFedSL),
    "fsl_sage": (
        {"name": "fsl_sage", "h": 2, "local_steps": 4, "batch_size": 32, "align_every": 1, "align_epochs": 2},
        DeployedFslSage,
    ),
    "fsl_an_copy0": (
        {"name": "fsl_an", "local_steps": 2, "batch_size": 32, "copies_eval": "copy0"},
        DeployedFslAn,
    ),
}


def config(algorithm: str):
    return resolve_config(
        {
            "seed": 3,
            "rounds": 2,
            "data": {"name": "digits"},
            "partition": {"kind": "iid", "num_clients": CLIENTS},
            "model": {"name": "mlp", "options": {"hidden": [32]}, "cut": 1},
            "algorithm": ALGORITHMS[algorithm][0],
            "engine": {"executor": "sequential", "threads": 1},
        }
    )


class Loopback:
    """A transport whose nodes run in this process; client ``silent`` stops answering in round ``after``."""

    def __init__(self, cfg, silent: int | None = None, after: int = 0):
        self.nodes = {c: Node(cfg, c) for c in range(CLIENTS)}
        self.state: dict[int, tuple] = {}
        self.aux: dict[int, tuple] = {}  # FSL-SAGE: each node's kept aux model and its alignment round
        self.silent, self.after = silent, after
        self.dropped: dict[int, dict[int, str]] = {}

    def drop(self, round_: int, client: int, reason: str) -> None:
        self.dropped.setdefault(round_, {})[client] = reason

    def exchange(
        self, round_: int, message_type: str, outgoing: dict[int, Outgoing], specs: dict
    ) -> dict[int, Reply]:
        replies = {}
        for c, out in outgoing.items():
            if c == self.silent and round_ >= self.after:
                self.drop(round_, c, "no reply")
                continue
            received = {name: tensors for name, (tensors, _) in out.records.items()}
            replies[c] = Reply(self._answer(c, round_, message_type, out, received), {}, 0.0)
        return replies

    def _answer(self, c: int, t: int, message_type: str, out: Outgoing, received: dict) -> dict:
        """What node ``c`` sends back, as the client app computes it (fp32: the wire changes nothing)."""
        node = self.nodes[c]
        if message_type == "query.forward":
            self.state[c] = received
            return fedsl_node.forward(node, t, received)[0]
        if message_type == "train.backward":
            return fedsl_node.backward(node, t, self.state[c], received["grad_down"]["g"])[0]
        if message_type == "train.aux":
            self.aux[c] = (received["aux_down"], int(out.config["aux_round"]))
            return {}
        if message_type == "train":
            if "aux_round" in out.config:
                model, aligned = node.held_aux(received, self.aux.get(c), int(out.config["aux_round"]))
                self.aux[c] = (model, aligned)
                received["aux_down"] = model
            return node.aux_round(t, node.split_start(received))[1]
        step = int(out.config["step"])
        if message_type == "query.smashed":
            if received:
                self.state[c] = node.split_start(received)
            return node.smashed(t, step, self.state[c])[0]
        self.state[c], _ = node.apply_gradients(t, step, self.state[c], received["grad_down"]["g"])
        return node.split_upload(self.state[c]) if out.config["final"] else {}


def run_both(algorithm: str, cfg=None, **silence) -> tuple:
    """Two rounds simulated and deployed (``cfg``, default :func:`config`): each side's algorithm,
    context and round reports."""
    cfg = cfg or config(algorithm)
    simulated = build_run(cfg)
    ctx = build_run(cfg).context
    deployed = ALGORITHMS[algorithm][1](ctx, cfg.algorithm)
    deployed.check_deployable()
    deployed.transport = Loopback(cfg, **silence)
    sides = {"simulated": (simulated.algorithm, simulated.context), "deployed": (deployed, ctx)}
    reports: dict[str, list] = {name: [] for name in sides}
    for t in (1, 2):
        for name, (algorithm_, context) in sides.items():
            context.start("train", t)
            reports[name].append(algorithm_.run_round(t))
    return sides, reports


def client_model(algorithm) -> dict[str, torch.Tensor]:
    return {**algorithm.client["params"], **algorithm.server.params}


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_deployed_round_equals_the_simulation(algorithm):
    sides, reports = run_both(algorithm)
    (sim, sim_ctx), (dep, dep_ctx) = sides["simulated"], sides["deployed"]
    want, got = client_model(sim), client_model(dep)
    assert got.keys() == want.keys()
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5
    assert _entries(dep_ctx) == _entries(sim_ctx)
    for simulated, deployed in zip(reports["simulated"], reports["deployed"], strict=True):
        assert deployed.train_loss == pytest.approx(simulated.train_loss, abs=1e-5)
        assert deployed.extra.get("participants", CLIENTS) == simulated.extra.get("participants", CLIENTS)
        assert deployed.extra.get("participants", CLIENTS) == CLIENTS
        assert deployed.extra["dropped"] == 0


ADVERSARIES = {
    "cse_fsl": ({"clients": [1], "attack": "smashed_noise", "options": {"sigma": 2.0}}, []),
    "splitfed_v2": ({"clients": [0], "attack": "smashed_flip", "options": {"scale": 3.0}}, []),
    "fsl_an": ({"clients": [2], "attack": "label_flip"}, []),
    "splitfed_v1": ({"clients": [1], "attack": "sign_flip", "options": {"scale": 4.0}}, ["median"]),
    "fsl_sage": ({"clients": [0, 2], "attack": "alie", "start_round": 2}, []),
}


BACKDOORS = {name: ({"clients": [1], "attack": "backdoor", "options": {"trigger_size": 2}}, [])
             for name in ("cse_fsl", "splitfed_v1", "fsl_sage")}  # fmt: skip
"""A malicious node trains on its stamped view (and CSE-FSL's server pass draws over it)."""


@pytest.mark.parametrize(
    "algorithm, adversary, stages",
    [(name, *attack) for name, attack in ADVERSARIES.items()]
    + [(name, *attack) for name, attack in BACKDOORS.items()],
)
def test_a_deployed_split_adversary_equals_the_simulation(algorithm, adversary, stages):
    """Malicious nodes poison their smashed data and labels before sending (as a simulated client does)
    and the server poisons their client models at receipt: the simulation's model, ledger, losses and
    figures (``malicious``, ``malicious_kept``)."""
    cfg = resolve_config({**config(algorithm).model_dump(), "adversary": adversary,
                          "aggregation": {"stages": stages}})  # fmt: skip
    sides, reports = run_both(algorithm, cfg)
    (sim, sim_ctx), (dep, dep_ctx) = sides["simulated"], sides["deployed"]
    want, got = client_model(sim), client_model(dep)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5
    assert _entries(dep_ctx) == _entries(sim_ctx)
    clean = build_run(config(algorithm))
    for t in (1, 2):
        clean.context.start("train", t)
        clean.algorithm.run_round(t)
    honest = client_model(clean.algorithm)
    assert max(float((honest[k] - want[k]).abs().max()) for k in want) > 1e-3  # the attack bites
    for simulated, deployed in zip(reports["simulated"], reports["deployed"], strict=True):
        assert deployed.train_loss == pytest.approx(simulated.train_loss, abs=1e-5)
        for key in ("malicious", "malicious_kept"):
            assert deployed.extra[key] == pytest.approx(simulated.extra[key], abs=1e-6), key
    assert sum(r.extra["malicious"] for r in reports["deployed"]) > 0


@pytest.mark.parametrize("algorithm", ["splitfed_v2", "cse_fsl", "light_fedsl"])
def test_a_language_model_on_padded_lines_deployed_equals_the_simulation(algorithm, tmp_path):
    """Targets per token and pad positions never sent: the deployed round stacks a language model's
    targets as the simulation does and ends with its model and ledger."""
    pytest.importorskip("transformers")
    from llm_cases import WORDS, lm_config

    for f in range(2):
        words = [WORDS[(f + 3 * i) % len(WORDS)] for i in range(60)]
        lines = [" ".join(words[i : i + 1 + i % 5]) for i in range(40)]  # 1 to 5 words: padded
        (tmp_path / f"doc{f}.txt").write_text("\n".join(lines) + "\n")
    raw = lm_config(tmp_path, ALGORITHMS[algorithm][0] | {"batch_size": 8}, clients=CLIENTS)
    raw["data"] |= {"sequences": "lines", "seq_len": 24}
    raw["partition"] = {"kind": "iid", "num_clients": CLIENTS}
    raw["engine"] = {"executor": "sequential", "threads": 1}
    sides, reports = run_both(algorithm, resolve_config(raw))
    (sim, sim_ctx), (dep, dep_ctx) = sides["simulated"], sides["deployed"]
    want, got = client_model(sim), client_model(dep)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5
    assert _entries(dep_ctx) == _entries(sim_ctx)
    kinds = Counter(entry[3] for entry in _entries(sim_ctx))
    assert kinds["labels_up"] > 0
    for simulated, deployed in zip(reports["simulated"], reports["deployed"], strict=True):
        assert deployed.train_loss == pytest.approx(simulated.train_loss, abs=1e-5)


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if "fedsl" not in a])
def test_a_silent_node_leaves_its_rounds_and_the_others_complete_them(algorithm):
    sides, reports = run_both(algorithm, silent=2, after=2)
    first, second = reports["deployed"]
    assert first.extra["dropped"] == 0 and first.extra["participants"] == CLIENTS
    assert second.extra["dropped_nodes"] == ["client:2"] and second.extra["participants"] == CLIENTS - 1
    assert torch.isfinite(torch.tensor(second.train_loss))
    dep, ctx = sides["deployed"]
    assert all(torch.isfinite(v).all() for v in client_model(dep).values())
    uploaded = [n for n, kind in zip(*_senders(ctx, 2), strict=True) if kind == "model_up"]
    assert sorted(uploaded) == ["client:0", "client:1"]


def test_a_silent_fedsl_client_sends_nothing_keeps_its_state_and_the_round_completes():
    """Lightweight FedSL: client 2 stops answering in round 2 (an aggregation round): it uploads no cut
    entries, its stale trunk enters the average, the others' losses make the round's."""
    sides, reports = run_both("light_fedsl", silent=2, after=2)
    first, second = reports["deployed"]
    assert first.extra["dropped"] == 0 and second.extra["dropped_nodes"] == ["client:2"]
    assert torch.isfinite(torch.tensor(second.train_loss)) and second.train_loss > 0
    dep, ctx = sides["deployed"]
    sim, _ = sides["simulated"]
    assert all(torch.isfinite(v).all() for v in client_model(dep).values())
    assert any(
        not torch.equal(dep.clients["params"][k], sim.clients["params"][k]) for k in dep.clients["params"]
    )
    bits = _bits(ctx, 2, "smashed_up")
    assert bits["client:2"] == 0 and bits["client:0"] > 0 and bits["client:1"] > 0


def _bits(ctx, round_: int, kind: str) -> dict[str, int]:
    """Bits of round ``round_``'s ``kind`` entries, by sender."""
    state = ctx.ledger.state_dict()
    names, kinds, c = state["nodes"], state["kinds"], state["columns"]
    out: dict[str, int] = {}
    for i, r in enumerate(c["round"]):
        if r == round_ and kinds[c["kind"][i]] == kind:
            out[names[c["src"][i]]] = out.get(names[c["src"][i]], 0) + int(c["bits"][i])
    return out


def _senders(ctx, round_: int) -> tuple[list[str], list[str]]:
    """The senders and kinds of round ``round_``'s ledger entries."""
    state = ctx.ledger.state_dict()
    names, kinds, columns = state["nodes"], state["kinds"], state["columns"]
    at = [i for i, r in enumerate(columns["round"]) if r == round_]
    return [names[columns["src"][i]] for i in at], [kinds[columns["kind"][i]] for i in at]


def _entries(ctx) -> list[tuple]:
    """Every ledger entry as (round, sender, receiver, kind, bits)."""
    state = ctx.ledger.state_dict()
    names, kinds, c = state["nodes"], state["kinds"], state["columns"]
    return [
        (int(c["round"][i]), names[c["src"][i]], names[c["dst"][i]], kinds[c["kind"][i]], int(c["bits"][i]))
        for i in range(len(c["round"]))
    ]


def test_a_kept_client_optimizer_state_is_refused_naming_the_key():
    """A deployed node starts its optimizer state afresh each round: ``keep`` would silently be ``reset``."""
    cfg = resolve_config(
        {
            **config("cse_fsl").model_dump(),
            "algorithm": {**ALGORITHMS["cse_fsl"][0], "client_optimizer_state": "keep"},
        }
    )
    algorithm = DeployedCseFsl(build_run(cfg).context, cfg.algorithm)
    with pytest.raises(ConfigError, match=r"algorithm\.client_optimizer_state"):
        algorithm.check_deployable()


class MissedAux(Loopback):
    """Client 2's node misses its aligned aux model of round 1 (no reply to ``train.aux``)."""

    def exchange(self, round_: int, message_type: str, outgoing: dict, specs: dict) -> dict:
        if message_type == "train.aux" and round_ == 1:
            self.drop(round_, 2, "no reply")
            outgoing = {c: out for c, out in outgoing.items() if c != 2}
        return super().exchange(round_, message_type, outgoing, specs)


def test_an_fsl_sage_node_that_missed_its_aux_model_gets_it_with_its_next_round():
    """The node trains round 2 with the aux model aligned in round 1 all the same (the model equals the
    simulation's); the second delivery is counted as one more ``aux_down`` to client 2 in round 2."""
    cfg = config("fsl_sage")
    simulated = build_run(cfg)
    ctx = build_run(cfg).context
    deployed = DeployedFslSage(ctx, cfg.algorithm)
    deployed.transport = MissedAux(cfg)
    for t in (1, 2):
        for algorithm, context in ((simulated.algorithm, simulated.context), (deployed, ctx)):
            context.start("train", t)
            algorithm.run_round(t)
    want, got = client_model(simulated.algorithm), client_model(deployed)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5
    extra = Counter(_entries(ctx)) - Counter(_entries(simulated.context))
    assert [(r, dst, kind) for r, _, dst, kind, _ in extra.elements()] == [(2, "client:2", "aux_down")]
    assert len(_entries(ctx)) == len(_entries(simulated.context)) + 1
