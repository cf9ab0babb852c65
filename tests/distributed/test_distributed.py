"""Scale-out: the same run on 2 gloo ranks (CPU processes) against one process (docs/scale-out.md).

One launch of two rank processes runs every config twice (``a`` and ``b``), so the start-up of torch is
paid once; the single-process runs happen here. World size 2 twice: bit-identical metrics; world size 2
against 1: identical ledgers and final parameters within 1e-5. The rank processes record how many rows
each executor call saw, which shows that each rank trained only its rows. Stochastic codecs (the q4
quantizer, random sparsification) have their own launch: their noise must be one process's on 2 ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import children
import numpy as np
import pytest
import torch
from llm_cases import llm_extra, needs_llm

import fedge
import fedge.algorithms.decentralized.training as peer
from fedge.algorithms.decentralized.proxies import Prober
from fedge.config import load_config
from fedge.distributed import Cohorts
from fedge.distributed.group import Group
from fedge.runner import checkpoint

WORKER = """
import json, os, sys, torch
torch.set_num_threads(1)
import fedge
from fedge.engine.executors import BatchedExecutor, SequentialExecutor
seen = {}
def counting(map_):
    def wrapped(self, fn, **kwargs):
        stage = kwargs.get("stage", "map")
        seen[stage] = max(seen.get(stage, 0), int(kwargs["counts"].shape[0]))
        return map_(self, fn, **kwargs)
    return wrapped
def counting_train(train):
    def wrapped(self, step, bank, *args, **kwargs):
        seen["train"] = max(seen.get("train", 0), len(bank.clients))
        return train(self, step, bank, *args, **kwargs)
    return wrapped
for executor in (BatchedExecutor, SequentialExecutor):
    executor.map = counting(executor.map)
    executor.train = counting_train(executor.train)
import fedge.algorithms.decentralized.training as peer
scoring = peer.pair_losses
def scored(*args, **kwargs):
    out = scoring(*args, **kwargs)
    seen["scored"] = seen.get("scored", 0) + len(out)
    return out
peer.pair_losses = scored
from fedge.algorithms.decentralized.proxies import Prober
def probing(method):
    def wrapped(self, params, buffers, rows, *args, **kwargs):
        seen["probed"] = seen.get("probed", 0) + len(rows)
        return method(self, params, buffers, rows, *args, **kwargs)
    return wrapped
Prober.similarities = probing(Prober.similarities)
Prober.proxies = probing(Prober.proxies)
for config, name in json.loads(sys.argv[1]):
    seen.clear()
    fedge.run(config, [f"output.name={name}"])
    with open(os.path.join(sys.argv[2], f"{name}.rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)
"""
SPLIT = ["splitfed_v1", "splitfed_v2", "fsl_an", "cse_fsl", "light_fedsl", "fsl_sage"]
PEER = ["local", "pens", "federico", "ditto", "dispfl", "fedfomo", "fedavg_ft"]
AFIND = ["afind", "afind_dp", "afind_pairs"]  # nested vmap, with DP noise, pair by pair with DP noise


def base(tmp_path: Path, **algorithm) -> dict:
    """A small synthetic run: 6 clients of unequal size, 3 rounds, every round evaluated."""
    return {
        "seed": 5,
        "rounds": 3,
        "data": {
            "name": "synthetic",
            "num_train": 360,
            "num_test": 120,
            "shape": [1, 6, 6],
            "num_classes": 4,
        },
        "partition": {"kind": "dirichlet", "num_clients": 6, "alpha": 0.5, "min_size": 8},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "algorithm": algorithm,
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }


def configs(tmp_path: Path) -> dict[str, dict]:
    return {
        "fedavg": base(
            tmp_path,
            name="fedavg",
            batch_size=16,
            fraction=0.7,
            optimizer={"lr": 0.1, "momentum": 0.9},
            client_optimizer_state="keep",  # each rank keeps every client's state: all ranks' rows gathered
        ),
        "hist": base(
            tmp_path, name="hist", cells=3, split="partition", edge_rounds=2, local_steps=2, batch_size=8
        ),
        "hfedavg": base(
            tmp_path,
            name="hfedavg",
            cells=3,
            split="partition",
            edge_rounds=1,
            local_steps=2,
            batch_size=8,
            aggregation="aircomp",
        ),  # fmt: skip
        "gossip": base(tmp_path, name="gossip", local_epochs=1, batch_size=16, peers=2),
        "afind": base(tmp_path, name="afind", local_epochs=1, batch_size=16, k0=2),
        "afind_dp": base(tmp_path, name="afind", local_epochs=1, batch_size=16, k0=2, dp={"sigma": 1.0}),
        "afind_pairs": base(
            tmp_path,
            name="afind",
            local_epochs=1,
            batch_size=16,
            peers=2,
            neighbor_mode="standard",
            topology={"kind": "ring"},
            dp={"sigma": 1.0},
        ),  # 12 of 30 pairs: probed pair by pair
        **{name: peer_config(tmp_path, name) for name in PEER},
        **{name: split_config(tmp_path, name) for name in SPLIT},
        **robust_configs(tmp_path),
        **(lm_configs(tmp_path) if llm_extra() else {}),  # the language models need the llm extra
    }


def robust_configs(tmp_path: Path) -> dict[str, dict]:
    """Robust reducers, which no rank-local partial sum gives: every rank gathers the rows first, at a
    server (Krum, FLTrust), at the edges (the median) and at peers (ClippedGossip)."""
    star = {"name": "fedavg", "batch_size": 16, "fraction": 1.0, "optimizer": {"lr": 0.1}}  # Krum: k > 4
    cells = {"name": "hfedavg", "cells": 3, "split": "partition", "edge_rounds": 1, "local_steps": 2}
    stages = {
        "fedavg_krum": (star, [{"name": "krum", "options": {"byzantine": 1}}]),
        "fedavg_fltrust": (star, [{"name": "fltrust", "at": ["server"], "options": {"root_samples": 20}}]),
        "hfedavg_median": ({**cells, "batch_size": 8}, [{"name": "median", "at": ["edge"]}]),
        "gossip_clipped": (
            {"name": "gossip", "local_epochs": 1, "batch_size": 16, "peers": 2},
            [{"name": "clipped_gossip", "at": ["peer"]}],
        ),
    }
    return {
        name: {**base(tmp_path, **algorithm), "aggregation": {"stages": chain}}
        for name, (algorithm, chain) in stages.items()
    }


ROBUST = ["fedavg_krum", "fedavg_fltrust", "hfedavg_median", "gossip_clipped"]


def lm_configs(tmp_path: Path) -> dict[str, dict]:
    """The language-model cases: FedAvg and the split algorithms of :data:`LM_SPLIT`."""
    return {
        "lm_fedavg": lm_config(tmp_path),
        **{f"lm_{name}": lm_split_config(tmp_path, name) for name in LM_SPLIT},
    }


def lm_config(tmp_path: Path) -> dict:
    """FedAvg of LoRA adapters on a tiny GPT-2 over six standard-library modules (token targets)."""
    config = base(tmp_path, name="fedavg", batch_size=8, optimizer={"lr": 0.05})
    config["rounds"] = 2
    config["data"] = {"name": "pystdlib", "seq_len": 16, "text_bytes": 1200}
    config["partition"] = {"kind": "natural", "num_clients": 6}
    config["model"] = {"name": "gpt2", "options": {"layers": 2, "hidden": 16, "heads": 2, "lora_rank": 2}}
    return config


LM_SPLIT = ("splitfed_v2", "cse_fsl")


def lm_split_config(tmp_path: Path, name: str) -> dict:
    """The language model cut after its first block: hidden states of every token up, their gradients
    (SplitFed v2) or nothing (CSE-FSL's per-token auxiliary head) down, sharded 3 + 3 over two ranks."""
    config = lm_config(tmp_path)
    config["algorithm"] = {"name": name, "batch_size": 8, "optimizer": {"lr": 0.05}, **SPLIT_OPTIONS[name]}
    config["model"]["cut"] = 1
    return config


SPLIT_OPTIONS = {
    "cse_fsl": {"h": 2, "server_order": "random"},
    "fsl_sage": {"h": 2, "align_every": 1, "align_epochs": 2, "server_order": "random"},
    "splitfed_v2": {"server_order": "arrival", "arrival_jitter_s": 0.01},
    "fsl_an": {"aggregate_aux": False, "agg_every": 2},
    "splitfed_v1": {
        "participation": "with_replacement",
        "clients_per_round": 6,
        "optimizer": {"momentum": 0.9},
        "client_optimizer_state": "keep",
    },
}


def split_config(tmp_path: Path, name: str) -> dict:
    """A split-family run (cut after the first block), sharded 3 + 3 clients over two ranks; a few
    options that change who waits for whom (queue order, arrival times, local aux heads, mid-round
    aggregation, a client drawn twice, client optimizer states kept across rounds)."""
    config = base(tmp_path, name=name, **SPLIT_OPTIONS.get(name, {}))
    config["model"]["cut"] = 1
    config["rounds"] = 2
    if name in ("splitfed_v1", "fsl_an"):  # refuses calls without an active row: ranks idle in turn
        config["engine"] = {"executor": "sequential"}
    return config


PEER_OPTIONS = {
    "pens": {"candidates": 3, "keep": 2, "selection_rounds": 1},  # rounds 2-3: phase 2
    "ditto": {"peer_selection": "afind", "afind": {"k0": 2}},
    "fedavg_ft": {"fraction": 0.7},
}


def peer_config(tmp_path: Path, name: str) -> dict:
    """A decentralized-family run (and FedAvg-FT, whose evaluation is per client): one local epoch,
    two peers, 3 + 3 training rows and evaluated clients per rank."""
    options = {"local_epochs": 1, "batch_size": 16, **PEER_OPTIONS.get(name, {})}
    if name != "fedavg_ft":
        options["peers"] = 2
    return base(tmp_path, name=name, **options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, jobs: list[tuple[dict, str]], seen: Path, timeout: float = 600.0) -> None:
    """Run ``jobs`` (config, run name) one after another on ``world`` rank processes of one group; each
    rank writes the most rows per executor stage of each run to ``seen``."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(fedge.__file__).parents[1]), env.get("PYTHONPATH", "")])
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                children.started(
                    [sys.executable, "-c", WORKER, json.dumps(jobs), str(seen)],
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world)},
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            for r in range(world)
        ]
        errors = [children.finish(p, timeout)[1] for p in procs]
    failed = [
        f"rank {r}: {err[-2000:]}"
        for r, (p, err) in enumerate(zip(procs, errors, strict=True))
        if p.returncode
    ]
    assert not failed, "\n".join(failed)


def codec_configs(tmp_path: Path) -> dict[str, dict]:
    """Stochastic codecs on 2 ranks: HIST's sharded uplink (each rank encodes its clients' rows, a cell
    spans both ranks, and every edge round sends ``model_up`` once per cell: several sends of one kind
    in a round) with the q4 quantizer and with random sparsification, and gossip's peer models with q4
    (decoded for every sender on every rank)."""
    hist = {
        "name": "hist",
        "cells": 3,
        "split": "partition",
        "edge_rounds": 2,
        "local_steps": 2,
        "batch_size": 8,
    }
    return {
        "hist_q4": base(tmp_path, **hist, codec_up="q4"),
        "hist_randk": base(tmp_path, **hist, codec_up="randk:0.5", codec_down="q4"),
        "gossip_q4": base(tmp_path, name="gossip", local_epochs=1, batch_size=16, peers=2, codec_model="q4"),
    }


def launch_and_run(tmp: Path, cases: dict[str, dict]) -> dict[str, Path]:
    """``cases`` twice on 2 ranks (one launch) and once in this process; the runs' root per case."""
    (tmp / "seen").mkdir()
    launch(2, [(cfg, f"{name}-{copy}") for name, cfg in cases.items() for copy in "ab"], tmp / "seen")
    for name, cfg in cases.items():
        with (
            mock.patch.object(peer, "pair_losses", wraps=peer.pair_losses) as scoring,
            mock.patch.object(
                Prober, "similarities", autospec=True, side_effect=Prober.similarities
            ) as dense,
            mock.patch.object(Prober, "proxies", autospec=True, side_effect=Prober.proxies) as pairwise,
        ):
            fedge.run(cfg, [f"output.name={name}-single"])
        pairs = sum(len(call.args[4][0]) for call in scoring.call_args_list)
        probed = sum(len(call.args[3]) for call in [*dense.call_args_list, *pairwise.call_args_list])
        (tmp / "seen" / f"{name}-single.json").write_text(json.dumps({"scored": pairs, "probed": probed}))
    return {name: tmp / "runs" for name in cases}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("dist")
    return launch_and_run(tmp, configs(tmp))


@pytest.fixture(scope="module")
def codec_runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("codecs")
    return launch_and_run(tmp, codec_configs(tmp))


def rows(run_dir: Path) -> list[dict]:
    out = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in out:
        row.pop("wall_seconds")
    return out


def flat_state(value) -> list[np.ndarray]:
    """Every floating tensor of a (nested) state, in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [value.double().numpy().ravel()] if value.is_floating_point() else []
    if isinstance(value, dict):
        return [a for key in sorted(value) for a in flat_state(value[key])]
    if isinstance(value, list | tuple):
        return [a for item in value for a in flat_state(item)]
    return []


def algorithm_state(run_dir: Path) -> dict:
    saved = checkpoint.load(run_dir / "checkpoint.pt", load_config(run_dir / "config.yaml"))
    return saved.state["algorithm"]


def final_state(run_dir: Path) -> np.ndarray:
    return np.concatenate(flat_state(algorithm_state(run_dir)))


LM = [pytest.param(name, marks=needs_llm) for name in ("lm_fedavg", *(f"lm_{name}" for name in LM_SPLIT))]


@pytest.mark.ci
@pytest.mark.parametrize("name", ["fedavg", "hist", "hfedavg", "gossip", *AFIND, *PEER, *SPLIT, *ROBUST, *LM])
def test_two_ranks_twice_bit_identical_and_match_one_process(runs, name):
    root = runs[name]
    two_a, two_b, one = (root / f"{name}-{tag}" for tag in ("a", "b", "single"))
    assert rows(two_a) == rows(two_b)
    assert (two_a / "ledger.csv").read_text() == (one / "ledger.csv").read_text()
    assert (two_a / "ledger.csv").read_text() == (two_b / "ledger.csv").read_text()
    assert np.abs(final_state(two_a) - final_state(one)).max() <= 1e-5
    assert [r["accuracy"] for r in rows(two_a)] == pytest.approx([r["accuracy"] for r in rows(one)], abs=0.02)
    assert rows(two_a)[-1]["bits_up"] == rows(one)[-1]["bits_up"]
    if name in PEER or name in AFIND:
        assert [r["sim_seconds"] for r in rows(two_a)] == [r["sim_seconds"] for r in rows(one)]
    if name == "dispfl":  # evolved a share per rank, gathered: the same masks as one process
        masks = [algorithm_state(run)["masks"] for run in (two_a, one)]
        assert all(torch.equal(masks[0][k], masks[1][k]) for k in masks[1])


@pytest.mark.ci
@pytest.mark.parametrize("name", LM)
def test_a_language_models_token_figures_on_two_ranks_are_one_process_figures(runs, name):
    """Each rank scores its share of the held-out sequences; correct tokens and loss sums come back
    together, so accuracy, loss and perplexity are per token as in one process."""
    root = runs[name]
    two, one = rows(root / f"{name}-a"), rows(root / f"{name}-single")
    assert [r["round"] for r in two] == [r["round"] for r in one] and "perplexity" in one[-1]
    for a, b in zip(two, one, strict=True):
        assert a["accuracy"] == b["accuracy"]  # counted tokens: exact (sequences-rounded, it was not)
        for key in ("loss", "perplexity"):  # from parameters that agree within 1e-7, summed in rank order
            assert a[key] == pytest.approx(b[key], rel=1e-5)


@pytest.mark.ci
def test_environment_records_the_world_size_and_backend(runs):
    def environment(run: str) -> dict:
        return json.loads((runs["fedavg"] / run / "environment.json").read_text())

    two, one = environment("fedavg-a"), environment("fedavg-single")
    assert (two["world_size"], two["backend"], two["device"]) == (2, "gloo", "cpu")
    assert (one["world_size"], one["backend"], one["device"]) == (1, None, "cpu")


@pytest.mark.ci
@pytest.mark.parametrize("name", [*SPLIT, "gossip", *(p for p in PEER if p != "fedavg_ft"), *LM])
def test_ranks_train_only_their_share(runs, name):
    """Every executor call on either rank saw 3 rows, the rank's share of the 6 participants or clients:
    the split family's client steps and server copies, the decentralized family's local training (Ditto's
    personal models too) and evaluation fine-tunes, the language model's adapters on either side of the
    cut."""
    seen = runs[name].parent / "seen"
    for rank in (0, 1):
        stages = json.loads((seen / f"{name}-a.rank{rank}.json").read_text())
        stages.pop("scored", None), stages.pop("probed", None)
        assert stages and set(stages.values()) == {3}, stages


@pytest.mark.ci
@pytest.mark.parametrize("name", ["pens", "federico", "fedfomo", *AFIND, "ditto"])
def test_ranks_score_only_their_share(runs, name):
    """The received models' probe or validation losses (AFIND+'s losses before and after training, Ditto's
    with AFIND+): each rank scores a share of the pairs, and the shares add up to the pairs one process
    scores."""
    seen = runs[name].parent / "seen"
    ranks = [json.loads((seen / f"{name}-a.rank{rank}.json").read_text())["scored"] for rank in (0, 1)]
    single = json.loads((seen / f"{name}-single.json").read_text())["scored"]
    assert sum(ranks) == single and 0 < min(ranks) <= max(ranks) < single, (ranks, single)


@pytest.mark.ci
@pytest.mark.parametrize("name", [*AFIND, "ditto"])
def test_ranks_probe_only_their_share(runs, name):
    """AFIND+'s probes (each requester's own proxy, then its rows of the similarity matrix or its probed
    pairs; Ditto selects with AFIND+): each rank probes for its 3 of the 6 requesters, and the shares
    add up to what one process probes."""
    seen = runs[name].parent / "seen"
    ranks = [json.loads((seen / f"{name}-a.rank{rank}.json").read_text())["probed"] for rank in (0, 1)]
    single = json.loads((seen / f"{name}-single.json").read_text())["probed"]
    assert sum(ranks) == single and 0 < min(ranks) <= max(ranks) < single, (ranks, single)
    if name != "afind_pairs":  # a nested vmap over the requesters: exactly half each
        assert ranks[0] == ranks[1], ranks


@pytest.mark.ci
@pytest.mark.parametrize("name", ["hist_q4", "hist_randk", "gossip_q4"])
def test_stochastic_codecs_on_two_ranks_draw_one_process_noise(codec_runs, name):
    """The same ledger and final model as one process: each rank draws its rows' noise from the link's
    seeds for the whole cohort (another draw would move the model by far more than 1e-5)."""
    root = codec_runs[name]
    two_a, two_b, one = (root / f"{name}-{tag}" for tag in ("a", "b", "single"))
    assert rows(two_a) == rows(two_b)
    assert (two_a / "ledger.csv").read_text() == (one / "ledger.csv").read_text()
    assert np.abs(final_state(two_a) - final_state(one)).max() <= 1e-5
    assert [r["sim_seconds"] for r in rows(two_a)] == [r["sim_seconds"] for r in rows(one)]
    assert [r["train_loss"] for r in rows(two_a)] == pytest.approx(
        [r["train_loss"] for r in rows(one)], abs=1e-5
    )


def adversary_configs(tmp_path: Path) -> dict[str, dict]:
    """FedAvg under the ``adversary`` block, malicious rows on both ranks or on one: rank-local attacks
    (``scaling``'s default n/m counts the round, not the rank; ``gaussian`` draws by client; data
    poisoning), and the omniscient ones, which gather the honest rows, each before a robust reducer or
    the mean (``fraction`` 0.7: the participants change every round)."""
    star = {"name": "fedavg", "batch_size": 16, "fraction": 1.0, "optimizer": {"lr": 0.1}}
    cases = {
        "adv_scaling_median": (star, {"clients": [1, 2, 4], "attack": "scaling"}, ["median"]),  # n/m: 2
        "adv_gaussian_mean": (star, {"clients": [2, 3], "attack": "gaussian"}, []),
        "adv_backdoor_trimmed": (
            star,
            {"clients": [0, 5], "attack": "backdoor", "options": {"scale": 2.0}},
            [{"name": "trimmed_mean", "options": {"trim": 0.2}}],
        ),
        "adv_alie_krum": (
            star,
            {"clients": [0, 1], "attack": "alie"},
            [{"name": "krum", "options": {"byzantine": 1}}],
        ),  # every malicious row on rank 0
        "adv_min_max_mean": ({**star, "fraction": 0.7}, {"clients": 0.34, "attack": "min_max"}, []),
        "adv_ipm_mean": (  # nobody honest from round 2: the malicious rows' own changes, gathered
            star,
            {"clients": list(range(6)), "attack": "ipm", "start_round": 2, "options": {"epsilon": 4.0}},
            [],
        ),
    }
    return {
        name: {**base(tmp_path, **algorithm), "adversary": adversary, "aggregation": {"stages": chain}}
        for name, (algorithm, adversary, chain) in cases.items()
    }


ADVERSARY = ["adv_scaling_median", "adv_gaussian_mean", "adv_backdoor_trimmed", "adv_alie_krum"]
ADVERSARY += ["adv_min_max_mean", "adv_ipm_mean"]


@pytest.fixture(scope="module")
def adversary_runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("adversary")
    return launch_and_run(tmp, adversary_configs(tmp))


@pytest.mark.ci
@pytest.mark.parametrize("name", ADVERSARY)
def test_an_adversary_on_two_ranks_is_one_process_adversary(adversary_runs, name):
    """The attacks and the reducer on rows spread over two ranks: the one-process model within 1e-5, and
    its figures (``malicious``, ``malicious_kept``, a backdoor's attack success rate)."""
    root = adversary_runs[name]
    two_a, two_b, one = (root / f"{name}-{tag}" for tag in ("a", "b", "single"))
    assert rows(two_a) == rows(two_b)
    assert (two_a / "ledger.csv").read_text() == (one / "ledger.csv").read_text()
    assert np.abs(final_state(two_a) - final_state(one)).max() <= 1e-5
    two, single = rows(two_a), rows(one)
    assert [r["malicious"] for r in two] == [r["malicious"] for r in single]
    assert sum(r["malicious"] for r in single) > 0
    for key in ("malicious_kept", "attack_success", "accuracy", "train_loss"):
        assert [r.get(key) for r in two] == pytest.approx([r.get(key) for r in single], abs=1e-5), key


@pytest.mark.ci
def test_only_rank_zero_writes(runs):
    names = sorted(p.name for p in runs["fedavg"].iterdir())
    assert names == sorted(f"{name}-{tag}" for name in runs for tag in ("a", "b", "single"))


class Rank(Group):
    """Rank ``rank`` of ``size`` (its rows only; no collective is called here)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


@pytest.mark.parametrize("total,size", [(7, 2), (2, 3), (10, 4), (0, 2)])
def test_cohorts_cover_rows_in_rank_order(total, size):
    for kind in ("of", "clients"):
        cohorts = [getattr(Cohorts(Rank(r, size)), kind)(total) for r in range(size)]
        assert [i for c in cohorts for i in range(c.start, c.stop)] == list(range(total))
        assert max(map(len, cohorts)) - min(map(len, cohorts)) <= 1


@pytest.mark.slow
def test_a_killed_rank_stops_the_other_and_resume_on_one_process_finishes_the_same(tmp_path):
    """SIGKILL rank 1 mid-run: rank 0 exits within the timeout with one line and a non-zero code, the last
    complete checkpoint stays, and resuming on one process ends where an uninterrupted run ends."""
    cfg = base(tmp_path, name="fedavg", batch_size=16, optimizer={"lr": 0.1})
    cfg.update(rounds=150, engine={"dist_timeout": 20})
    cfg["output"].update(checkpoint_every=2, name="killed")
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(fedge.__file__).parents[1]), env.get("PYTHONPATH", "")])
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                children.started(
                    [sys.executable, "-m", "fedge", "run", str(path), "-q"],
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"},
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            for r in range(2)
        ]
        metrics = tmp_path / "runs" / "killed" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
            if time.monotonic() > deadline or procs[0].poll() is not None:
                children.fail(procs[0], "rank 0 did not reach round 5")
            time.sleep(0.05)
        procs[1].kill()
        killed_at = time.monotonic()
        stderr = children.finish(procs[0], timeout=60)[1]
        assert time.monotonic() - killed_at < 20 + 10
        assert procs[0].returncode not in (0, None)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: distributed: rank 0:"), stderr[-2000:]
        children.finish(procs[1], timeout=children.REAP)
    run_dir = metrics.parent
    kept = checkpoint.load(run_dir / "checkpoint.pt", load_config(run_dir / "config.yaml"))
    assert 2 <= kept.state["round"] < 150
    resumed = fedge.resume(run_dir)
    reference = fedge.run(cfg, ["output.name=reference"])
    assert (run_dir / "ledger.csv").read_text() == (reference.run_dir / "ledger.csv").read_text()
    assert np.abs(final_state(run_dir) - final_state(reference.run_dir)).max() <= 1e-5
    assert [r["round"] for r in resumed.metrics] == list(range(1, 151))


def split_adversary_configs(tmp_path: Path) -> dict[str, dict]:
    """Split runs under the ``adversary`` block, malicious rows on both ranks or on one: the cut attacks
    and data poisoning act on a rank's own rows (``smashed_noise`` draws by client, occurrence and step),
    ``scaling``'s default n/m counts the round, and ``alie`` gathers the honest client models before the
    median (SplitFed v1 draws clients with replacement); FSL-SAGE's alignment store holds poisoned data;
    CSE-FSL's backdoor trains and server-passes on the stamped view, its success rate on every rank."""
    cases = {
        "split_adv_noise_cse_fsl": ("cse_fsl", {"clients": [1, 4], "attack": "smashed_noise"}, []),
        "split_adv_scaling_splitfed_v2": ("splitfed_v2", {"clients": [0, 1, 3], "attack": "scaling"}, []),
        "split_adv_label_flip_fsl_an": ("fsl_an", {"clients": [2, 5], "attack": "label_flip"}, []),
        "split_adv_alie_splitfed_v1": ("splitfed_v1", {"clients": [0, 1], "attack": "alie"}, ["median"]),
        "split_adv_flip_fsl_sage": ("fsl_sage", {"clients": [3], "attack": "smashed_flip"}, []),
        "split_adv_backdoor_cse_fsl": (
            "cse_fsl", {"clients": [1, 4], "attack": "backdoor", "options": {"target": 0, "scale": 2.0}}, [],
        ),
    }  # fmt: skip
    out = {}
    for name, (algorithm, adversary, chain) in cases.items():
        config = split_config(tmp_path, algorithm)
        out[name] = {**config, "adversary": adversary, "aggregation": {"stages": chain}}
    return out


SPLIT_ADVERSARY = list(split_adversary_configs(Path(".")))


@pytest.fixture(scope="module")
def split_adversary_runs(tmp_path_factory) -> Path:
    """Each case once on 2 ranks (one launch) and once in this process; the runs' root."""
    tmp = tmp_path_factory.mktemp("split_adversary")
    cases = split_adversary_configs(tmp)
    (tmp / "seen").mkdir()
    launch(2, [(cfg, f"{name}-two") for name, cfg in cases.items()], tmp / "seen")
    for name, cfg in cases.items():
        fedge.run(cfg, [f"output.name={name}-single"])
    return tmp / "runs"


@pytest.mark.ci
@pytest.mark.parametrize("name", SPLIT_ADVERSARY)
def test_a_split_adversary_on_two_ranks_is_one_process_adversary(split_adversary_runs, name):
    """Malicious split clients on rows spread over two ranks: the one-process ledger, model within 1e-5
    and figures (``malicious``, ``malicious_kept``)."""
    two_dir, one_dir = (split_adversary_runs / f"{name}-{tag}" for tag in ("two", "single"))
    assert (two_dir / "ledger.csv").read_text() == (one_dir / "ledger.csv").read_text()
    assert np.abs(final_state(two_dir) - final_state(one_dir)).max() <= 1e-5
    two, single = rows(two_dir), rows(one_dir)
    assert [r["malicious"] for r in two] == [r["malicious"] for r in single]
    assert sum(r["malicious"] for r in single) > 0
    for key in ("malicious_kept", "accuracy", "train_loss", "attack_success"):
        assert [r.get(key) for r in two] == pytest.approx([r.get(key) for r in single], abs=1e-5), key


def peer_and_cell_adversary_configs(tmp_path: Path) -> dict[str, dict]:
    """Malicious peers and cell members on two ranks: peers poison the gathered sent rows on every rank
    (gossip's ``sign_flip`` before ClippedGossip; a backdoor, whose success rates the evaluation blocks
    gather; AFIND+'s ``alie`` behind honest probe answers, and its poisoned proxies in each rank's share
    of the requesters, and a backdoor probed on the stamped view; FedFomo's poisoned last-round models,
    Dis-PFL's masked noise); HFedAvg's 9 clients in 3 cells sit
    5 + 4 on the ranks, so cell 1 (clients 3 to 5) spans both: ``sign_flip`` before the edge median,
    ``alie`` gathers the cell's honest uploads, a backdoor (HIST's ``gaussian``: the submodels' slots,
    keys by client and edge round), and a malicious edge (``alie`` over the cells every rank holds
    reduced) before the cloud's median."""
    peers = {"local_epochs": 1, "batch_size": 16, "peers": 2}
    cells = {"cells": 3, "split": "partition", "edge_rounds": 2, "local_steps": 2, "batch_size": 8}
    cases = {
        "peer_adv_gossip_clipped": (
            {"name": "gossip", **peers},
            {"clients": [1, 4], "attack": "sign_flip", "options": {"scale": 4.0}},
            [{"name": "clipped_gossip", "at": ["peer"]}],
        ),
        "peer_adv_gossip_backdoor": (
            {"name": "gossip", **peers},
            {"clients": [2, 3], "attack": "backdoor", "options": {"target": 0, "scale": 2.0}},
            [],
        ),
        "peer_adv_afind_alie": (
            {"name": "afind", **peers, "k0": 2},
            {"clients": [0, 3], "attack": "alie"},
            [],
        ),
        "peer_adv_afind_probes_poisoned": (
            {"name": "afind", **peers, "k0": 2},
            {"clients": [2, 5], "attack": "sign_flip", "probes": "poisoned"},
            [],
        ),
        "peer_adv_afind_backdoor": (
            {"name": "afind", **peers, "k0": 2},
            {"clients": [1, 4], "attack": "backdoor", "options": {"target": 0}, "probes": "poisoned"},
            [],
        ),
        "peer_adv_fedfomo_sign_flip": (
            {"name": "fedfomo", **peers},
            {"clients": [1, 4], "attack": "sign_flip", "options": {"scale": 4.0}},
            [],
        ),
        "peer_adv_dispfl_gaussian": (
            {"name": "dispfl", **peers},
            {"clients": [0, 3], "attack": "gaussian"},
            [],
        ),
        "cell_adv_hfedavg_median": (
            {"name": "hfedavg", **cells},
            {"clients": [1, 4], "attack": "sign_flip", "options": {"scale": 2.0}},
            [{"name": "median", "at": ["edge"]}],
        ),
        "cell_adv_hfedavg_alie": ({"name": "hfedavg", **cells}, {"clients": [0, 4], "attack": "alie"}, []),
        "cell_adv_hfedavg_backdoor": (
            {"name": "hfedavg", **cells},
            {"clients": [3, 5], "attack": "backdoor", "options": {"target": 0, "scale": 2.0}},
            [],
        ),
        "cell_adv_hist_gaussian": ({"name": "hist", **cells}, {"clients": [2, 3], "attack": "gaussian"}, []),
        "cell_adv_hfedavg_edge_alie": (
            {"name": "hfedavg", **cells},
            {"clients": [4], "edges": [0], "attack": "alie"},
            [{"name": "median", "at": ["cloud"]}],
        ),
    }
    out = {}
    for name, (algorithm, adversary, chain) in cases.items():
        config = {**base(tmp_path, **algorithm), "adversary": adversary, "aggregation": {"stages": chain}}
        if algorithm["name"] in ("hfedavg", "hist"):
            config["partition"] = {**config["partition"], "num_clients": 9}
        out[name] = config
    return out


PEER_CELL_ADVERSARY = list(peer_and_cell_adversary_configs(Path(".")))


@pytest.fixture(scope="module")
def peer_cell_adversary_runs(tmp_path_factory) -> Path:
    """Each case once on 2 ranks (one launch) and once in this process; the runs' root."""
    tmp = tmp_path_factory.mktemp("peer_cell_adversary")
    cases = peer_and_cell_adversary_configs(tmp)
    (tmp / "seen").mkdir()
    launch(2, [(cfg, f"{name}-two") for name, cfg in cases.items()], tmp / "seen")
    for name, cfg in cases.items():
        fedge.run(cfg, [f"output.name={name}-single"])
    return tmp / "runs"


@pytest.mark.ci
@pytest.mark.parametrize("name", PEER_CELL_ADVERSARY)
def test_peer_and_cell_adversaries_on_two_ranks_are_one_process_adversary(peer_cell_adversary_runs, name):
    """Malicious peers and cell members on rows spread over two ranks: the one-process ledger, model
    within 1e-5 and every figure (``malicious``, ``malicious_kept``, ``malicious_selected``, selection
    counts, accuracy, ``attack_success``) within 1e-5."""
    two_dir, one_dir = (peer_cell_adversary_runs / f"{name}-{tag}" for tag in ("two", "single"))
    assert (two_dir / "ledger.csv").read_text() == (one_dir / "ledger.csv").read_text()
    assert np.abs(final_state(two_dir) - final_state(one_dir)).max() <= 1e-5
    two, single = rows(two_dir), rows(one_dir)
    assert sum(r["malicious"] for r in single) > 0
    assert [sorted(r) for r in two] == [sorted(r) for r in single]
    for a, b in zip(two, single, strict=True):
        for key, value in b.items():
            assert a[key] == (pytest.approx(value, abs=1e-5) if isinstance(value, float) else value), key
