"""The split family: the protocol's mathematics, executor agreement, and the CSE-FSL / SplitFed knobs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiers import parametrize_first_by_default

import fedge
from fedge.algorithms.split.parts import composed
from fedge.errors import ConfigError
from fedge.runner.loop import build_run


def config(algorithm: dict, **overrides) -> dict:
    """Synthetic 4-class data on 5 Dirichlet clients of unequal sizes; a small MLP cut after one layer."""
    raw = {
        "seed": 5,
        "rounds": 2,
        "data": {
            "name": "synthetic",
            "num_train": 300,
            "num_test": 100,
            "shape": [1, 6, 6],
            "num_classes": 4,
        },
        "partition": {"kind": "dirichlet", "num_clients": 5, "alpha": 0.5, "min_size": 12},
        "model": {"name": "mlp", "cut": 1, "options": {"hidden": [16, 12]}},
        "algorithm": {"batch_size": 8, "optimizer": {"lr": 0.1}, **algorithm},
        "output": {"plots": False},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def trained(raw: dict, rounds: int | None = None):
    """The algorithm of ``raw`` after its rounds (built without a run directory)."""
    built = build_run(fedge.resolve_config(raw))
    metrics = [built.algorithm.run_round(t) for t in range(1, (rounds or raw["rounds"]) + 1)]
    return built, metrics


def model_state(algorithm) -> dict[str, torch.Tensor]:
    """The composed model's parameters (trunk + server) and the aux head's."""
    aux = {k: v for k, v in algorithm.client["params"].items() if k.startswith("aux.")}
    return {**composed(algorithm.client["params"], algorithm.server.params), **aux}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
@pytest.mark.parametrize("algorithm", [{"name": "splitfed_v1"}, {"name": "splitfed_v2", "clip_norm": None}])
def test_one_client_without_aux_equals_centralized_sgd(algorithm, executor):
    """Split learning changes the traffic, not the mathematics: one client, no aux head = centralized SGD.

    Plain SGD, the papers' optimiser (momentum buffers restart every round, as in FedAvg).
    """
    common = {"batch_size": 16, "optimizer": {"lr": 0.1, "weight_decay": 1e-3}}
    one = {"partition": {"kind": "iid", "num_clients": 1}, "engine": {"executor": executor}}
    split_run, _ = trained(config({**algorithm, **common}, **one))
    central, _ = trained(config({"name": "centralized", **common}, **one))
    params, _ = central.algorithm.bank.client(0)
    split_params = composed(split_run.algorithm.client["params"], split_run.algorithm.server.params)
    assert max_diff(split_params, params) < 1e-6
    assert split_run.algorithm.evaluate()["accuracy"] == central.algorithm.evaluate()["accuracy"]


VARIANTS = {
    "v1-momentum": {"name": "splitfed_v1", "optimizer": {"lr": 0.1, "momentum": 0.5}},
    "v2-clipped": {"name": "splitfed_v2", "clip_norm": 0.5},
    "v2-client-after-client": {"name": "splitfed_v2", "server_order": "client_after_client"},
    "an-post-step": {"name": "fsl_an", "smashed_from": "post_step", "copies_eval": "copy0"},
    "cse-h2": {"name": "cse_fsl", "h": 2},
    "cse-h3-random-drop": {"name": "cse_fsl", "h": 3, "server_order": "random", "drop_incomplete_block": 1},
    "cse-agg-every": {"name": "cse_fsl", "h": 2, "agg_every": 3, "aggregation": "uniform"},
    "cse-theory": {
        "name": "cse_fsl",
        "server_trigger": "every_l_rounds",
        "server_every": 1,
        "zb_step": "server_backprop",
        "participation": "with_replacement",
        "clients_per_round": 6,
        "local_steps": 4,
        "server_optimizer": {"lr": 0.05},
    },
}


@parametrize_first_by_default("variant", list(VARIANTS), ids=list(VARIANTS))
def test_batched_and_sequential_executors_agree(variant):
    runs = {}
    for executor in ("sequential", "batched"):
        built, metrics = trained(config(VARIANTS[variant], engine={"executor": executor}), rounds=3)
        runs[executor] = (built, metrics)
    (seq, seq_metrics), (bat, bat_metrics) = runs["sequential"], runs["batched"]
    assert max_diff(model_state(seq.algorithm), model_state(bat.algorithm)) < 1e-5
    assert seq.context.ledger.totals() == bat.context.ledger.totals()
    assert seq.algorithm.evaluate()["loss"] == pytest.approx(bat.algorithm.evaluate()["loss"], abs=1e-5)
    for a, b in zip(seq_metrics, bat_metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        assert a["uploads"] == b["uploads"]
    assert seq_metrics[-1]["uploads_total"] > 0


@pytest.mark.ci
def test_executors_agree_with_a_conv_trunk_and_a_cnn_aux_head():
    model = {"name": "lenet5", "cut": 2, "aux": {"kind": "cnn_mlp", "channels": 3}, "options": {}}
    data = {"shape": [1, 16, 16]}
    states = []
    for executor in ("sequential", "batched"):
        raw = config({"name": "fsl_an"}, model=model, data=data, engine={"executor": executor})
        built, _ = trained(raw)
        states.append(model_state(built.algorithm))
    assert "aux.conv.weight" in states[0]
    assert max_diff(*states) < 1e-5


def ledger_counts(built, kind: str) -> dict[str, int]:
    """Number of ledger entries of ``kind`` per node."""
    csv = built.context.ledger.to_csv().splitlines()[1:]
    counts: dict[str, int] = {}
    for line in csv:
        _, src, dst, k, _, _ = line.split(",")
        if k == kind:
            node = src if src != "server" else dst
            counts[node] = counts.get(node, 0) + 1
    return counts


def test_cse_uploads_every_h_batches_and_never_gets_a_gradient():
    raw = config({"name": "cse_fsl", "h": 3, "batch_size": 10}, partition={"kind": "iid"})
    built, metrics = trained(raw, rounds=1)
    sizes = built.context.data.client_sizes()
    batches = -(-sizes // 10)
    assert ledger_counts(built, "smashed_up") == {f"client:{i}": b // 3 for i, b in enumerate(batches)}
    assert metrics[0]["uploads"] == sum(batches // 3)
    assert "grad_down" not in {k for k, _ in built.context.ledger.totals()}
    assert built.context.ledger.storage["server"]["server_model"] == 32 * (16 * 12 + 12 + 12 * 4 + 4)


def test_server_copies_per_participant_for_mc_and_an_only():
    storages = {}
    for name in ("splitfed_v1", "splitfed_v2", "fsl_an", "cse_fsl"):
        built = build_run(fedge.resolve_config(config({"name": name})))
        storages[name] = built.context.ledger.storage["server"]["server_model"]
    one = storages["splitfed_v2"]
    assert storages == {"splitfed_v1": 5 * one, "splitfed_v2": one, "fsl_an": 5 * one, "cse_fsl": one}


@pytest.mark.ci
def test_cse_learns_from_the_aux_loss_alone_on_digits():
    """CSE-FSL without server gradients: no gradient ever comes back, yet the composed model learns."""
    raw = {
        "seed": 0,
        "rounds": 6,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 5},
        "model": {"name": "mlp", "cut": 1, "options": {"hidden": [64, 32]}},
        "algorithm": {"name": "cse_fsl", "h": 2, "batch_size": 10, "optimizer": {"lr": 0.05}},
        "output": {"plots": False},
    }
    built, _ = trained(raw)
    metrics = built.algorithm.evaluate()
    assert metrics["accuracy"] > 0.85 and metrics["aux_accuracy"] > 0.85


def test_server_order_random_is_seeded_and_changes_only_the_server():
    base = {"name": "cse_fsl", "h": 1}
    ordered, _ = trained(config(base), rounds=1)
    shuffled, _ = trained(config({**base, "server_order": "random"}), rounds=1)
    again, _ = trained(config({**base, "server_order": "random"}), rounds=1)
    client = ordered.algorithm.client["params"]
    assert max_diff(client, shuffled.algorithm.client["params"]) == 0.0  # clients never wait for the server
    assert max_diff(ordered.algorithm.server.params, shuffled.algorithm.server.params) > 0
    assert max_diff(shuffled.algorithm.server.params, again.algorithm.server.params) == 0.0


def test_client_after_client_order_differs_from_round_robin_for_the_shared_model():
    results = {}
    for order in ("round_robin", "client_after_client"):
        built, _ = trained(config({"name": "splitfed_v2", "server_order": order}), rounds=1)
        results[order] = model_state(built.algorithm)
    assert max_diff(results["round_robin"], results["client_after_client"]) > 1e-4


def test_with_replacement_draws_run_independently_and_merge_weights_duplicates():
    raw = config(
        {"name": "cse_fsl", "participation": "with_replacement", "clients_per_round": 8, "local_steps": 2},
        seed=1,
    )
    built, metrics = trained(raw, rounds=1)
    uploads = ledger_counts(built, "model_up")
    assert sum(uploads.values()) == 8 and len(uploads) < 8  # duplicates drawn, each a separate run
    assert metrics[0]["uploads"] == 8 * 2
    merged = {**raw, "algorithm": {**raw["algorithm"], "duplicates": "merge"}}
    _, merged_metrics = trained(merged, rounds=1)
    assert merged_metrics[0]["participants"] == len(uploads)


def test_every_l_rounds_trigger_runs_the_server_in_rounds_l_plus_1_2l_plus_1():
    raw = config(
        {
            "name": "cse_fsl",
            "server_trigger": "every_l_rounds",
            "server_every": 2,
            "zb_step": "server_backprop",
            "local_steps": 3,
        }
    )
    built, metrics = trained(raw, rounds=5)
    rounds = sorted(
        {
            int(line.split(",")[0])
            for line in built.context.ledger.to_csv().splitlines()[1:]
            if ",grad_down," in line
        }
    )
    assert rounds == [3, 5]  # theory t = t - 1 = 2, 4
    assert [m["uploads"] for m in metrics] == [0, 0, 5, 0, 5]


def test_cse_rejects_knobs_of_the_other_trigger():
    with pytest.raises(ConfigError, match="algorithm.h"):
        raw = config({"name": "cse_fsl", "server_trigger": "every_l_rounds", "h": 2})
        build_run(fedge.resolve_config(raw))
    with pytest.raises(ConfigError, match="algorithm.zb_step"):
        build_run(fedge.resolve_config(config({"name": "cse_fsl", "zb_step": "server_backprop"})))


def test_partial_participation_needs_a_count_and_enough_clients():
    with pytest.raises(ConfigError, match="algorithm.clients_per_round"):
        build_run(fedge.resolve_config(config({"name": "fsl_an", "participation": "without_replacement"})))
    raw = config({"name": "fsl_an", "participation": "without_replacement", "clients_per_round": 9})
    with pytest.raises(ConfigError, match="algorithm.clients_per_round"):
        build_run(fedge.resolve_config(raw))


def test_a_model_without_default_cut_needs_model_cut():
    raw = config({"name": "splitfed_v1"})
    raw["model"].pop("cut")
    with pytest.raises(ConfigError, match="model.cut"):
        build_run(fedge.resolve_config(raw))


def test_learning_rate_decay_and_server_step_division():
    raw = config(
        {
            "name": "cse_fsl",
            "lr_decay": 0.5,
            "lr_decay_every": 2,
            "server_optimizer": {"lr": 0.2},
            "server_lr_divide_by_m": True,
        }
    )
    algorithm = build_run(fedge.resolve_config(raw)).algorithm
    assert [algorithm.learning_rates(t) for t in (1, 2, 3, 5)] == [
        (0.1, 0.04),
        (0.1, 0.04),
        (0.05, 0.02),
        (0.025, 0.01),
    ]


def test_normal_init_is_seeded_and_identical_for_every_copy():
    raw = config({"name": "fsl_an", "init": "normal0.05"})
    a = build_run(fedge.resolve_config(raw)).algorithm
    b = build_run(fedge.resolve_config(raw)).algorithm
    params = {**a.client["params"], **a.server.params}
    assert max_diff(params, {**b.client["params"], **b.server.params}) == 0.0
    values = torch.cat([p.flatten() for p in params.values()])
    assert abs(float(values.std()) - 0.05) < 0.005 and abs(float(values.mean())) < 0.005


def test_mid_round_aggregation_uploads_every_agg_every_steps():
    raw = config({"name": "fsl_an", "agg_every": 2, "batch_size": 10}, partition={"kind": "iid"})
    built, _ = trained(raw, rounds=1)
    steps = -(-built.context.data.client_sizes() // 10)
    expected = {f"client:{i}": int(-(-s // 2)) for i, s in enumerate(steps)}
    assert ledger_counts(built, "model_up") == expected
    assert ledger_counts(built, "model_down") == expected


def test_pre_and_post_step_smashed_data_differ():
    pre, _ = trained(config({"name": "cse_fsl"}), rounds=1)
    post, _ = trained(config({"name": "cse_fsl", "smashed_from": "post_step"}), rounds=1)
    assert max_diff(pre.algorithm.client["params"], post.algorithm.client["params"]) == 0.0
    assert max_diff(pre.algorithm.server.params, post.algorithm.server.params) > 0


def test_state_dict_resumes_to_the_identical_run():
    raw = config({"name": "splitfed_v2", "optimizer": {"lr": 0.1, "momentum": 0.9}})
    straight, _ = trained(raw, rounds=3)
    first, _ = trained(raw, rounds=2)
    state = copy.deepcopy(first.algorithm.state_dict())
    resumed = build_run(fedge.resolve_config(raw))
    resumed.algorithm.load_state_dict(state)
    resumed.algorithm.run_round(3)
    assert max_diff(model_state(straight.algorithm), model_state(resumed.algorithm)) == 0.0
    assert straight.algorithm.totals == resumed.algorithm.totals


def test_rounds_advance_the_simulated_clock():
    built, _ = trained(config({"name": "cse_fsl", "h": 2}), rounds=1)
    clock = built.context.system.clock
    assert clock.seconds > 0 and clock.joules > 0


def test_data_crop_cuts_the_image_centre():
    raw = config({"name": "cse_fsl"}, data={"shape": [2, 10, 10], "crop": 6})
    built = build_run(fedge.resolve_config(raw))
    assert built.context.data.input_shape == (2, 6, 6)
    full = build_run(fedge.resolve_config(config({"name": "cse_fsl"}, data={"shape": [2, 10, 10]})))
    assert torch.equal(built.context.data.x_train, full.context.data.x_train[:, :, 2:8, 2:8])
    with pytest.raises(ConfigError, match="data.crop"):
        build_run(fedge.resolve_config(config({"name": "cse_fsl"}, data={"crop": 12})))


def test_uniform_aggregation_divisor_all_clients_shrinks_partial_rounds():
    raw = config(
        {
            "name": "cse_fsl",
            "participation": "without_replacement",
            "clients_per_round": 2,
            "aggregation": "uniform",
            "aggregate_divisor": "all_clients",
            "optimizer": {"lr": 1e-9},
        }
    )
    before = build_run(fedge.resolve_config(raw)).algorithm.client["params"]
    after, _ = trained(raw, rounds=1)
    ratio = np.array([float(after.algorithm.client["params"][k].norm() / before[k].norm()) for k in before])
    assert np.allclose(ratio, 2 / 5, atol=1e-4)


def test_unshared_aux_heads_stay_on_their_clients():
    raw = config({"name": "cse_fsl", "aggregate_aux": False})
    built, _ = trained(raw, rounds=2)
    kinds = {k for k, _ in built.context.ledger.totals()}
    assert "aux_up" not in kinds and "aux_down" not in kinds and "model_up" in kinds
    algorithm = built.algorithm
    initial = build_run(fedge.resolve_config(raw)).algorithm.client["params"]
    heads = [algorithm.local_aux[c]["aux.linear.weight"] for c in range(5)]
    assert all(not torch.equal(heads[0], h) for h in heads[1:])  # each client trained its own head
    assert torch.equal(algorithm.client["params"]["aux.linear.weight"], initial["aux.linear.weight"])
    assert "aux_accuracy" not in algorithm.evaluate()
    resumed = build_run(fedge.resolve_config(raw)).algorithm
    resumed.load_state_dict(copy.deepcopy(algorithm.state_dict()))
    assert torch.equal(resumed.local_aux[3]["aux.linear.weight"], heads[3])


def test_global_lr_steps_part_of_the_way_to_the_average():
    start = build_run(fedge.resolve_config(config({"name": "fsl_an"}))).algorithm.client["params"]
    full, _ = trained(config({"name": "fsl_an"}), rounds=1)
    half, _ = trained(config({"name": "fsl_an", "global_lr": 0.5}), rounds=1)
    expected = {k: start[k] + 0.5 * (full.algorithm.client["params"][k] - start[k]) for k in start}
    assert max_diff(half.algorithm.client["params"], expected) < 1e-6


def test_freeze_client_after_keeps_the_clients_and_trains_the_server():
    raw = config({"name": "splitfed_v2", "freeze_client_after": 1})
    one, _ = trained(raw, rounds=1)
    two, _ = trained(raw, rounds=2)
    assert max_diff(one.algorithm.client["params"], two.algorithm.client["params"]) < 1e-6  # averaging only
    assert max_diff(one.algorithm.server.params, two.algorithm.server.params) > 0
