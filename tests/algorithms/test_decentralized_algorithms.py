"""The decentralized family end to end: executors agree, runs are reproducible and resumable, the ledger
is exact, selections respect the graph, and the AFIND+ decisions (cold start, fallback) behave."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiers import parametrize_first_by_default

import fedge
from fedge.algorithms.decentralized.topology import TopologyConfig, build_topology
from fedge.config import parse_config
from fedge.errors import ConfigError
from fedge.experiments.compare import compare
from fedge.runner import checkpoint
from fedge.runner.loop import build_run

WALL = ("wall_seconds",)
COMMON = {"local_epochs": 1, "batch_size": 16, "peers": 2, "optimizer": {"lr": 0.1, "momentum": 0.5}}
VARIANTS = {
    "local": {"name": "local"},
    "gossip": {"name": "gossip"},
    "pens": {"name": "pens", "selection_rounds": 1, "candidates": 3, "keep": 2},
    "federico": {"name": "federico"},
    "fedavg_ft": {"name": "fedavg_ft", "fraction": 0.5},
    "afind": {"name": "afind", "k0": 2},
    "afind-standard-partial": {
        "name": "afind",
        "neighbor_mode": "standard",
        "p_update": "partial",
        "explore": 1,
    },
    "afind-head-alternating": {
        "name": "afind",
        "personal": "head",
        "local_update": "alternating",
        "local_epochs": 2,
    },
    "afind-dp-activation": {"name": "afind", "proxy": "activation", "dp": {"sigma": 2.0}},
    "afind-dp-update-topk": {"name": "afind", "selection": "topk", "dp": {"sigma": 1.0, "target": "update"}},
    "ditto-afind": {"name": "ditto", "peer_selection": "afind"},
    "dispfl-afind": {"name": "dispfl", "peer_selection": "afind", "afind": {"aggregation": "uniform"}},
    "dispfl": {"name": "dispfl"},
    "fedfomo": {"name": "fedfomo"},
    "fedfomo-afind-head": {"name": "fedfomo", "peer_selection": "afind", "personal": "head"},
}


def config(tmp_path, algorithm: dict, **top) -> dict:
    """Six clients on a small synthetic set, full graph; three rounds take well under a second."""
    return {
        "seed": 5,
        "rounds": 3,
        "data": {
            "name": "synthetic",
            "num_train": 360,
            "num_test": 240,
            "shape": [1, 6, 6],
            "num_classes": 4,
        },
        "partition": {"kind": "dirichlet", "num_clients": 6, "alpha": 0.5, "min_size": 8},
        "model": {"name": "mlp", "options": {"hidden": [12, 8]}},
        "algorithm": {**COMMON, **algorithm} if algorithm["name"] != "fedavg_ft" else dict(algorithm),
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
        **top,
    }


def strip(rows):
    return [{k: v for k, v in row.items() if k not in WALL} for row in rows]


def final_params(result):
    state = checkpoint.load(result.run_dir / "checkpoint.pt").state["algorithm"]
    return state["bank"]["params"] if "bank" in state else state["params"]


@parametrize_first_by_default("variant", list(VARIANTS))
def test_batched_and_sequential_executors_agree(tmp_path, variant):
    cfg = config(tmp_path, VARIANTS[variant])
    batched = fedge.run(cfg, ["engine.executor=batched"])
    sequential = fedge.run(cfg, ["engine.executor=sequential"])
    for a, b in zip(batched.metrics, sequential.metrics, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key in WALL:
                continue
            if isinstance(a[key], dict):  # bits by kind and link, storage by node: exact
                assert a[key] == b[key], key
                continue
            assert a[key] == pytest.approx(b[key], abs=1e-4), key
        assert (a["sim_seconds"], a["sim_joules"]) == (b["sim_seconds"], b["sim_joules"])
    pa, pb = final_params(batched), final_params(sequential)
    assert max(float((pa[k] - pb[k]).abs().max()) for k in pa) < 1e-4
    assert 0.0 < batched.metrics[-1]["accuracy"] <= 1.0


def test_same_seed_same_metrics_other_seed_differs(tmp_path):
    cfg = config(tmp_path, VARIANTS["afind"])
    first, second = fedge.run(cfg), fedge.run(cfg)
    assert strip(first.metrics) == strip(second.metrics)
    assert strip(fedge.run(cfg, ["seed=6"]).metrics) != strip(first.metrics)


@parametrize_first_by_default(
    "variant", ["afind", "pens", "dispfl-afind", "ditto-afind", "federico", "fedfomo-afind-head"]
)
def test_state_dict_resumes_to_the_same_result(tmp_path, variant):
    cfg = parse_config(
        config(
            tmp_path,
            {**VARIANTS[variant], "selection_rounds": 2} if variant == "pens" else VARIANTS[variant],
            rounds=4,
        )
    )
    straight = build_run(cfg).algorithm
    for t in range(1, 5):
        straight.run_round(t)
    first = build_run(cfg).algorithm
    for t in (1, 2):
        first.run_round(t)
    state = copy.deepcopy(first.state_dict())
    resumed = build_run(cfg).algorithm
    resumed.load_state_dict(state)
    for t in (3, 4):
        resumed.run_round(t)
    assert resumed.evaluate() == straight.evaluate()


def test_afind_ledger_is_exact(tmp_path):
    result = fedge.run(config(tmp_path, VARIANTS["afind"]))
    built = build_run(parse_config(config(tmp_path, VARIANTS["afind"])))
    algorithm = built.algorithm
    n, rounds = 6, 3
    dim = algorithm.selector.prober.dim
    assert dim == 12 * 8 + 8  # fc2 of the 12-8 MLP: the layer before the head
    model_bits = 32 * sum(v[0].numel() for v in algorithm.bank.params.values())
    chosen = sum(row["selected_mean"] * n for row in result.metrics)
    kinds = result.metrics[-1]["bits_by_kind"]
    probed = rounds * n * (n - 1)  # full graph, Eq. 8 probes every neighbour every round
    assert kinds["proxy"] == probed * 32 * dim
    assert kinds["model_request"] == probed * model_bits  # the selected were all probed
    assert kinds["peer_model"] == round(chosen) * model_bits
    assert kinds["loss"] == round(chosen) * 32
    last = result.metrics[-1]
    assert last["bits_up"] == last["bits_down"] == 0 and last["bits_peer"] == sum(kinds.values())


def test_cold_start_takes_k0_then_the_threshold_and_the_fallback(tmp_path):
    result = fedge.run(config(tmp_path, {"name": "afind", "k0": 3, "tau": 50.0}))
    first, later = result.metrics[0], result.metrics[1:]
    assert first["selected_mean"] == first["selected_min"] == 3 and first["fallbacks"] == 0
    # tau = 50 puts theta far above any score: nobody passes, every client falls back to its top-1
    assert all(r["selected_mean"] == 1 and r["fallbacks"] == 6 for r in later)
    loose = fedge.run(config(tmp_path, {"name": "afind", "k0": 1, "tau": 1e-3, "upsilon": 100.0}))
    assert all(r["selected_mean"] == 5 and r["fallbacks"] == 0 for r in loose.metrics[1:])  # all pass


@pytest.mark.parametrize("name", ["gossip", "afind", "federico", "pens"])
def test_selections_stay_on_the_graph(tmp_path, name):
    cfg = parse_config(config(tmp_path, {**VARIANTS[name], "topology": {"kind": "ring"}}))
    algorithm = build_run(cfg).algorithm
    adjacency = torch.as_tensor(build_topology(TopologyConfig(kind="ring"), 6, cfg.seed))
    for t in (1, 2, 3):
        metrics = algorithm.run_round(t)
        assert metrics["selected_max"] <= 2
    if name == "afind":
        assert not (algorithm.selector.previous & ~adjacency).any()
        assert not (algorithm.selector.p[~adjacency] != 0).any()


def test_private_heads_are_never_mixed(tmp_path):
    def heads(algorithm: str) -> dict:
        cfg = parse_config(config(tmp_path, {"name": algorithm, "personal": "head"}))
        alg = build_run(cfg).algorithm
        alg.run_round(1)
        return alg.bank.params

    local, gossip = heads("local"), heads("gossip")
    assert torch.equal(local["out.linear.weight"], gossip["out.linear.weight"])
    assert not torch.equal(local["fc1.linear.weight"], gossip["fc1.linear.weight"])


def test_identification_finds_the_same_group_at_the_common_start(tmp_path):
    """Neighbour identification (Sec. 3.2) in miniature: 12 clients, 4 groups with disjoint label pairs;
    round 1 probes at one point."""
    cfg = config(tmp_path, {"name": "afind", "k0": 2})
    cfg["data"].update(num_classes=8, num_train=960)
    cfg["partition"] = {"kind": "grouped", "num_clients": 12, "num_groups": 4}
    built = build_run(parse_config(cfg))
    algorithm, data = built.algorithm, built.context.data
    algorithm.run_round(1)
    labels = [frozenset(data.y_train[torch.as_tensor(ix)].tolist()) for ix in data.client_train]
    same = torch.tensor([[a == b and i != j for j, b in enumerate(labels)] for i, a in enumerate(labels)])
    chosen = algorithm.selector.previous
    assert float((chosen & same).sum() / chosen.sum()) == 1.0  # random choice would score 2/11
    sim = algorithm.selector.sim
    assert float(sim[same].min()) > float(sim[~same & ~torch.eye(12, dtype=torch.bool)].max())


def test_dispfl_masks_keep_their_density_and_zero_the_rest(tmp_path):
    cfg = parse_config(config(tmp_path, VARIANTS["dispfl"]))
    algorithm = build_run(cfg).algorithm
    before = {k: int(m.sum()) for k, m in algorithm.masks.items()}
    total = sum(m[0].numel() for m in algorithm.masks.values())
    assert sum(before.values()) / (6 * total) == pytest.approx(0.5, abs=0.02)
    metrics = [algorithm.run_round(t) for t in (1, 2)]
    assert metrics[0]["alpha"] > metrics[1]["alpha"] > 0
    for name, mask in algorithm.masks.items():
        assert int(mask.sum()) == before[name]
        assert (algorithm.bank.params[name][~mask] == 0).all()
    assert not torch.equal(algorithm.masks["fc1.linear.weight"][0], algorithm.masks["fc1.linear.weight"][1])
    sparse, dense = algorithm.models, algorithm.requests  # requests travel dense at fp32 by default
    shapes, kept = algorithm.model_shapes(), algorithm.model_nonzeros()
    assert (
        sparse.account(3, "client:1", "client:0", "peer_model", shapes, kept)[0]
        < dense.account(3, "client:0", "client:1", "model_request", shapes)[0]
    )


def test_ditto_evaluates_personal_models_pulled_towards_the_collaborative_ones(tmp_path):
    cfg = parse_config(config(tmp_path, {"name": "ditto", "lam": 0.0}))
    far = build_run(cfg).algorithm
    near = build_run(
        parse_config(config(tmp_path, {"name": "ditto", "lam": 50.0, "optimizer": {"lr": 0.01}}))
    ).algorithm
    for alg in (far, near):
        alg.run_round(1)
        alg.run_round(2)

    def gap(alg):
        return sum(float((alg.personal_bank.params[k] - alg.bank.params[k]).norm()) for k in alg.bank.params)

    assert gap(near) < gap(far)


def test_fedavg_ft_reports_personalised_and_global_accuracy(tmp_path):
    result = fedge.run(config(tmp_path, VARIANTS["fedavg_ft"]))
    last = result.metrics[-1]
    assert {"accuracy", "global_accuracy", "accuracy_std"} <= last.keys()
    assert set(last["bits_by_kind"]) == {"model_up", "model_down"}


def test_config_errors_name_their_key(tmp_path):
    cases = [
        ({"name": "afind", "local_update": "alternating", "local_epochs": 1}, "algorithm.head_epochs"),
        ({"name": "afind", "proxy_layer": "nope"}, "algorithm.proxy_layer"),
        ({"name": "gossip", "topology": {"kind": "regular", "degree": 9}}, "algorithm.topology.degree"),
    ]
    for algorithm, key in cases:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            fedge.run(config(tmp_path, algorithm))
    single = config(tmp_path, {"name": "gossip", "personal": "head"})
    single["model"]["options"]["hidden"] = []
    with pytest.raises(ConfigError, match=r"algorithm\.personal"):
        fedge.run(single)
    with pytest.raises(ConfigError, match=r"algorithm\.tau"):
        fedge.run(config(tmp_path, {"name": "afind", "tau": 0}))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.ci
def test_compare_runs_the_family_from_one_afind_config(tmp_path):
    cfg = parse_config(config(tmp_path, {"name": "afind", "k0": 2}, rounds=2))
    comparison = compare(cfg, ["gossip", "afind"], seeds=2)
    rows = {r["algorithm"]: r for r in comparison.rows}
    assert rows["afind"]["seeds"] == 2 and rows["gossip"]["final_accuracy_std"] >= 0.0
    assert comparison.dropped["gossip"] == ["k0"] and "gossip" not in rows["afind"]
    assert np.isfinite(rows["afind"]["best_accuracy_mean"])
