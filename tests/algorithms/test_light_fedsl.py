"""Lightweight FedSL (Algorithm 1, Eqs. 3-14): schedule, pruning, equivalence, dropout, quantized
updates, aggregation schedule, executors, latency and the traditional-FedSL baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad

import fedge
from fedge.algorithms.split.parts import composed
from fedge.algorithms.split.pruning import importance_mask, prunable_names, sparsity, sparsity_target
from fedge.comm import dropout_mask
from fedge.config import SystemConfig
from fedge.errors import ConfigError
from fedge.experiments.compare import compare
from fedge.models import build_model, count_parameters, output_shape, split
from fedge.rng import torch_rng
from fedge.runner.loop import build_run
from fedge.system import SystemModel, aggregation_latency, cut_latency

OFF = {"final_sparsity": 0.0, "quant_bits": None, "cut_dropout": 0.0, "agg_interval": 1}


def config(algorithm: dict, **overrides) -> dict:
    """Synthetic 4-class data on 4 clients; an MLP 36-16-12-4 cut after its first hidden layer."""
    raw = {
        "seed": 5,
        "rounds": 10,
        "data": {"name": "synthetic", "num_train": 240, "num_test": 80, "shape": [1, 6, 6], "num_classes": 4},
        "partition": {"kind": "iid", "num_clients": 4},
        "model": {"name": "mlp", "cut": 1, "options": {"hidden": [16, 12]}},
        "algorithm": {"name": "light_fedsl", "batch_size": 8, "optimizer": {"lr": 0.1}, **algorithm},
        "output": {"plots": False},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def built(algorithm: dict, **overrides):
    return build_run(fedge.resolve_config(config(algorithm, **overrides)))


def run(algorithm: dict, rounds: int, **overrides):
    b = built(algorithm, **overrides)
    return b, [b.algorithm.run_round(t) for t in range(1, rounds + 1)]


def full_state(algorithm) -> dict[str, torch.Tensor]:
    client = algorithm.client
    return composed(client["params"], algorithm.server.params)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def ledger_rows(b, kind: str) -> list[tuple[int, str, int]]:
    rows = []
    for line in b.context.ledger.to_csv().splitlines()[1:]:
        t, src, dst, k, _, bits = line.split(",")
        if k == kind:
            rows.append((int(t), src if src != "server" else dst, int(bits)))
    return rows


# ---- the cubic schedule (Eq. 10, Lemma 1) ----


def test_sparsity_schedule_values():
    total, rho_f = 40, 0.7
    rho = np.array([sparsity_target(t, total, rho_f) for t in range(1, total + 1)])
    assert rho[-1] == pytest.approx(rho_f) and rho[0] == pytest.approx(rho_f * (1 - (39 / 40) ** 3))
    steps = np.diff(rho)
    assert (steps > 0).all() and (np.diff(steps) < 0).all()  # increasing, increments shrinking
    assert rho.sum() == pytest.approx(rho_f * (total - (total - 1) ** 2 / (4 * total)))
    assert rho.sum() < total * rho_f
    assert sparsity_target(50, total, rho_f) == pytest.approx(rho_f)  # flat after T


# ---- pruning masks (Eq. 9, Algorithm 1 lines 14-17) ----


def test_importance_mask_zeroes_the_lowest_w_times_g_globally_and_zeros_first():
    gen = torch.Generator().manual_seed(0)
    weights = {"a": torch.randn(4, 5, generator=gen), "b": torch.randn(7, generator=gen)}
    grads = {"a": torch.randn(4, 5, generator=gen), "b": torch.randn(7, generator=gen)}
    weights["b"][2] = 0.0
    grads["a"][0, 0] = 0.0  # a live weight scoring 0 still ranks above the zero weight
    masks = importance_mask(weights, grads, 9)
    scores = torch.cat([(weights[k] * grads[k]).abs().flatten() for k in ("a", "b")])
    scores[20 + 2] = -1.0
    pruned = torch.cat([(masks[k] == 0).flatten() for k in ("a", "b")])
    assert int(pruned.sum()) == 9
    assert set(torch.nonzero(pruned).flatten().tolist()) == set(torch.argsort(scores)[:9].tolist())
    assert sparsity({k: weights[k] * masks[k] for k in weights}) == pytest.approx(9 / 27)
    first = importance_mask(weights, grads, 1)  # the zero weight goes before the live one scoring 0
    assert first["b"][2] == 0 and first["a"][0, 0] == 1 and int(sum(m.sum() for m in first.values())) == 26


def test_prunable_tensors_are_conv_and_linear_weights_only():
    model = build_model("vgg", (1, 8, 8), 10, depth=11, width=0.25)
    trunk, _ = split(model, 2)
    assert prunable_names(trunk, "trunk.") == ["trunk.conv1.conv.weight", "trunk.conv2.conv.weight"]


def zero_sets(algorithm) -> list[set[int]]:
    """Per client, the flat indices of its exactly-zero prunable weights."""
    params = algorithm.clients["params"]
    flat = torch.cat([params[name].reshape(params[name].shape[0], -1) for name in algorithm.prunable], 1)
    return [set(torch.nonzero(row == 0).flatten().tolist()) for row in flat]


def test_pruning_follows_the_schedule_persists_and_restarts_after_aggregation():
    b = built({"final_sparsity": 0.6, "schedule_rounds": 8, "agg_interval": 4, "quant_bits": 4})
    algorithm = b.algorithm
    n = sum(algorithm.clients["params"][name][0].numel() for name in algorithm.prunable)
    history = []
    for t in range(1, 6):
        metrics = algorithm.run_round(t)
        history.append((metrics, zero_sets(algorithm), algorithm.evaluate()["model_sparsity"]))
        if t < 4:  # every client pruned exactly round(rho_t N) weights
            expected = round(sparsity_target(t, 8, 0.6) * n) / n
            assert algorithm._sparsities(algorithm.clients["params"]) == pytest.approx([expected] * 4)
    for t in (1, 2):  # pruned weights stay zero (masked, quantized updates) until the aggregation
        for before, after in zip(history[t - 1][1], history[t][1], strict=True):
            assert before <= after
    assert history[3][0]["aggregated"] == 1.0
    after_aggregation = history[3][2]
    assert after_aggregation < history[3][0]["sparsity"]  # masks differ: the average is denser
    assert history[4][0]["sparsity"] == pytest.approx(round(sparsity_target(5, 8, 0.6) * n) / n)


@pytest.mark.ci
@pytest.mark.parametrize("interval", [1, 5])
def test_pruned_weights_stay_pruned_over_a_long_run(monkeypatch, interval):
    """Every client's trained model (read before any aggregation) holds at least round(rho_t N) zeros in
    every round, and once the schedule is flat its non-zero count never rises. Resetting the masks at
    aggregation broke both with I = 1 (the mean sat at the target count, nothing pruned, the unmasked
    gradient revived the zeros)."""
    rounds, schedule = 200, 60
    b = built({"final_sparsity": 0.5, "schedule_rounds": schedule, "agg_interval": interval}, rounds=rounds)
    algorithm = b.algorithm
    n = sum(algorithm.clients["params"][name][0].numel() for name in algorithm.prunable)

    def nonzeros(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum((params[name] != 0).flatten(1).sum(1) for name in algorithm.prunable)

    trained: list[torch.Tensor] = []
    aggregate = algorithm._aggregate

    def counted(t: int, state: dict) -> tuple:
        trained.append(nonzeros(state["params"]))
        return aggregate(t, state)

    monkeypatch.setattr(algorithm, "_aggregate", counted)
    previous = None
    for t in range(1, rounds + 1):
        algorithm.run_round(t)
        counts = trained.pop() if trained else nonzeros(algorithm.clients["params"])
        target = round(sparsity_target(t, schedule, 0.5) * n)
        assert (n - counts >= target).all(), (t, counts.tolist(), target)
        if t > schedule:
            assert (counts <= previous).all(), (t, counts.tolist(), previous.tolist())
        previous = counts
    assert trained == [] and (n - previous == round(0.5 * n)).all()


# ---- equivalence with centralized SGD ----


def centralized_step(algorithm, state, t: int, lr: float, p: float) -> dict[str, torch.Tensor]:
    """One SGD step of the full model on the mean of the clients' batch losses of round ``t`` (float64),
    with the cut dropout masks the clients draw from their shared streams."""
    index, weight = algorithm.batches(t)
    data, parts = algorithm.ctx.data, algorithm.parts

    def own(module, params):
        return {name: params[name] for name, _ in module.named_parameters()}

    def loss(params):
        total = 0.0
        for k in range(index.shape[0]):
            rows = index[k][weight[k] > 0]
            x, y = data.x_train[rows].double(), data.y_train[rows]
            z = functional_call(parts.trunk, own(parts.trunk, params), (x,))
            if p:
                mask = dropout_mask(tuple(z.shape), p, torch_rng(algorithm.ctx.seed, "cut-dropout", t, k))
                z = z * mask.double() / (1 - p)
            total = total + F.cross_entropy(functional_call(parts.server, own(parts.server, params), (z,)), y)
        return total / index.shape[0]

    grads = grad(loss)(state)
    return {k: v - lr * grads[k] for k, v in state.items()}


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_one_round_is_a_centralized_sgd_step_without_compression(p):
    """rho_f = 0, q = None, I = 1, no BatchNorm: a round is one SGD step on the mean of the K batch
    losses, the server's Eq. 7 included; with dropout, the same step through the same cut masks."""
    b = built({**OFF, "cut_dropout": p}, partition={"kind": "dirichlet", "alpha": 0.5, "min_size": 20})
    algorithm = b.algorithm
    state = {k: v.double() for k, v in full_state(algorithm).items()}
    for t in range(1, 4):
        algorithm.run_round(t)
        state = centralized_step(algorithm, state, t, 0.1, p)
        assert max_diff(full_state(algorithm), state) < 1e-6


def test_fedsl_is_light_fedsl_with_every_compression_off():
    light, light_metrics = run(OFF, 3)
    base, base_metrics = run({"name": "fedsl"}, 3)
    assert max_diff(full_state(light.algorithm), full_state(base.algorithm)) == 0.0
    assert light.context.ledger.totals() == base.context.ledger.totals()
    assert [m["train_loss"] for m in light_metrics] == [m["train_loss"] for m in base_metrics]


# ---- dropout and quantization in the algorithm ----


def test_dropout_sends_only_the_kept_entries_both_ways():
    p = 0.4
    b, _ = run({**OFF, "cut_dropout": p}, 2)
    smashed, grads = ledger_rows(b, "smashed_up"), ledger_rows(b, "grad_down")
    assert [bits for *_, bits in smashed] == [bits for *_, bits in grads]
    for (t, node, bits), label in zip(smashed, ledger_rows(b, "labels_up"), strict=True):
        k = int(node.split(":")[1])
        mask = dropout_mask((8, 16), p, torch_rng(5, "cut-dropout", t, k))
        assert bits == 32 * int(mask.sum()) and label[2] == 32 * 8
    kept = sum(bits for *_, bits in smashed) / (32 * 16 * 8 * 8)
    assert abs(kept - (1 - p)) < 3 * np.sqrt(p * (1 - p) / (16 * 8 * 8))


def test_client_update_is_a_q_bit_quantized_gradient():
    """With q bits (whole vector) each client's step takes at most 2^q magnitudes, zero included."""
    bits = 2
    b = built({**OFF, "quant_bits": bits, "agg_interval": 10})
    before = {k: v.clone() for k, v in b.algorithm.clients["params"].items()}
    b.algorithm.run_round(1)
    after = b.algorithm.clients["params"]
    for k in range(4):
        step = torch.cat([((before[n][k] - after[n][k]) / 0.1).flatten() for n in before]).abs()
        ordered = torch.sort(step).values
        clusters = 1 + int((torch.diff(ordered) > 1e-3 * float(ordered[-1])).sum())
        assert 2 <= clusters <= 2**bits


def test_quantized_pruned_and_dropped_runs_are_reproducible():
    knobs = {"final_sparsity": 0.5, "quant_bits": 4, "cut_dropout": 0.3, "agg_interval": 3}
    one, _ = run(knobs, 4)
    two, _ = run(knobs, 4)
    assert max_diff(full_state(one.algorithm), full_state(two.algorithm)) == 0.0
    other, _ = run(knobs, 4, seed=6)
    assert max_diff(full_state(one.algorithm), full_state(other.algorithm)) > 0


# ---- aggregation schedule (Eq. 14) ----


def test_aggregation_happens_exactly_every_I_rounds():
    b, metrics = run({"agg_interval": 3}, 7)
    assert sorted({t for t, *_ in ledger_rows(b, "model_up")}) == [3, 6]
    assert sorted({t for t, *_ in ledger_rows(b, "model_down")}) == [3, 6]
    assert [m["aggregated"] for m in metrics] == [0, 0, 1, 0, 0, 1, 0]
    assert len(ledger_rows(b, "model_up")) == 2 * 4


def test_with_I_equal_1_all_client_models_are_identical_after_every_round():
    b = built({"agg_interval": 1, "final_sparsity": 0.5})
    for t in range(1, 4):
        b.algorithm.run_round(t)
        for tensor in b.algorithm.clients["params"].values():
            assert torch.equal(tensor, tensor[:1].expand_as(tensor))


# ---- executors and resume ----


def test_batched_and_sequential_executors_agree():
    knobs = {"final_sparsity": 0.5, "quant_bits": 4, "cut_dropout": 0.3, "agg_interval": 3}
    partition = {"kind": "dirichlet", "alpha": 0.5, "min_size": 12}
    runs = [run(knobs, 6, engine={"executor": e}, partition=partition) for e in ("sequential", "batched")]
    (seq, seq_metrics), (bat, bat_metrics) = runs
    assert max_diff(full_state(seq.algorithm), full_state(bat.algorithm)) < 1e-5
    assert seq.context.ledger.totals() == bat.context.ledger.totals()
    for a, b in zip(seq_metrics, bat_metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        assert a["sparsity"] == b["sparsity"]


def test_state_dict_resumes_to_the_same_run():
    knobs = {"final_sparsity": 0.5, "quant_bits": 4, "cut_dropout": 0.3, "agg_interval": 3}
    straight, _ = run(knobs, 5)
    first, _ = run(knobs, 2)
    second = built(knobs)
    second.algorithm.load_state_dict(first.algorithm.state_dict())
    for t in range(3, 6):
        second.algorithm.run_round(t)
    assert max_diff(full_state(straight.algorithm), full_state(second.algorithm)) == 0.0


# ---- latency (Fig. 4) ----


def vgg19_cut(cut: int) -> tuple[int, int]:
    """Smashed values per sample and client parameters of CIFAR VGG-19-BN cut after ``cut`` convs."""
    with torch.device("meta"):
        trunk, _ = split(build_model("vgg", (3, 32, 32), 10), cut)
    return int(np.prod(output_shape(trunk, (3, 32, 32)))), count_parameters(trunk)


def test_fig4_latency_matches_the_spec_table_and_orderings():
    """Fig. 4 for VGG-19 as we read it (b = 64, fp32, client at 300 m): smashed up + gradient down."""
    system = SystemModel(SystemConfig(distances="linspace"), 5, seed=0)
    table = {4: [0.752, 0.526, 0.226], 8: [0.376, 0.263, 0.113], 12: [0.188, 0.132, 0.056]}
    uploads = {}
    for cut, expected in table.items():
        values, params = vgg19_cut(cut)
        latency = [cut_latency(system, 1, 64, values, p) for p in (0.0, 0.3, 0.7)]
        assert latency == pytest.approx(expected, abs=2e-3)
        uploads[cut] = aggregation_latency(system, 1, 32 * params)
    assert values == 2048 and uploads[4] < uploads[8] < uploads[12]  # model traffic orders the other way
    assert uploads[4] == pytest.approx(32 * 259_776 / 35.88e6 + 32 * 259_776 / 59.08e6, rel=0.02)


def test_round_latency_is_the_slowest_cut_exchange_plus_aggregation():
    """Compute made free: the clock advances by max_k(up_k/r_up + down_k/r_down) + T_agg, and the cut
    exchange scales with the kept share of the activations."""
    system = {"distances": "linspace", "cycles_per_flop": 1e-9}
    latencies = {}
    for p in (0.0, 0.5):
        b, metrics = run({**OFF, "cut_dropout": p, "agg_interval": 2}, 2, system=system)
        link = b.context.system.link(1)
        up = np.zeros(4)
        down = np.zeros(4)
        for kind, target in (("smashed_up", up), ("labels_up", up), ("grad_down", down)):
            for t, node, bits in ledger_rows(b, kind):
                if t == 1:
                    target[int(node.split(":")[1])] += bits
        assert metrics[0]["latency_comm_s"] == pytest.approx(
            float((up / link.up_bps + down / link.down_bps).max())
        )
        assert metrics[0]["latency_round_s"] == pytest.approx(metrics[0]["latency_comm_s"], rel=1e-6)
        model_bits = ledger_rows(b, "model_up")[0][2]
        assert metrics[1]["latency_agg_s"] == pytest.approx(
            aggregation_latency(b.context.system, 2, model_bits)
        )
        assert b.context.system.clock.seconds == pytest.approx(sum(m["latency_round_s"] for m in metrics))
        latencies[p] = metrics[0]["latency_comm_s"]
    assert 0.4 < latencies[0.5] / latencies[0.0] < 0.6


def test_smashed_latency_falls_with_a_deeper_cut_of_a_mini_vgg():
    """Mini-VGG (VGG-13 at width 1/4 on 8x8 input): cuts 2 / 4 / 6 send 256 / 128 / 64 values per sample."""
    model = {"name": "vgg", "options": {"depth": 13, "width": 0.25, "batch_norm": False}}
    data = {"shape": [1, 8, 8]}
    comm, bits = {}, {}
    for cut in (2, 4, 6):
        b, metrics = run({**OFF, "batch_size": 4}, 1, model={**model, "cut": cut}, data=data)
        comm[cut] = metrics[0]["latency_comm_s"]
        bits[cut] = ledger_rows(b, "smashed_up")[0][2]
    assert bits == {2: 32 * 256 * 4, 4: 32 * 128 * 4, 6: 32 * 64 * 4}
    assert comm[2] > comm[4] > comm[6]


def test_sparse_model_codec_shows_the_pruning_in_uploads_and_storage():
    dense, _ = run({"final_sparsity": 0.8, "schedule_rounds": 2, "agg_interval": 2}, 2)
    sparse, _ = run(
        {"final_sparsity": 0.8, "schedule_rounds": 2, "agg_interval": 2, "model_codec": "sparse"}, 2
    )
    assert max_diff(full_state(dense.algorithm), full_state(sparse.algorithm)) == 0.0
    assert sum(b for *_, b in ledger_rows(sparse, "model_up")) < sum(
        b for *_, b in ledger_rows(dense, "model_up")
    )


# ---- config, runs and comparisons ----


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"optimizer": {"lr": 0.1, "momentum": 0.9}}, "algorithm.optimizer.momentum"),
        ({"cut_dropout": 1.0}, "algorithm.cut_dropout"),
        ({"quant_bits": 0}, "algorithm.quant_bits"),
        ({"batch_size": 500, "drop_last": True}, "algorithm.batch_size"),
    ],
)
def test_bad_values_name_their_key(change, key):
    with pytest.raises(ConfigError) as info:
        built(change)
    assert info.value.key == key


@pytest.mark.ci
def test_simulated_time_reaches_metrics_summary_and_compare(tmp_path):
    raw = config({}, rounds=3, output={"dir": str(tmp_path), "plots": False})
    outcome = compare(fedge.resolve_config(raw), ["fedsl", "light_fedsl"], seeds=1)
    for name, row in zip(("fedsl", "light_fedsl"), outcome.rows, strict=True):
        result = outcome.runs[name][0]
        lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert lines[-1]["sim_seconds"] > 0 and lines[-1]["sim_joules"] > 0
        assert result.summary["sim_seconds"] == lines[-1]["sim_seconds"]
        assert row["sim_seconds_mean"] == result.summary["sim_seconds"] and row["sim_joules_mean"] > 0
    assert outcome.dropped == {}
    light = outcome.runs["light_fedsl"][0].metrics[-1]
    assert (
        light["bits_by_kind"]["smashed_up"]
        < outcome.runs["fedsl"][0].metrics[-1]["bits_by_kind"]["smashed_up"]
    )
