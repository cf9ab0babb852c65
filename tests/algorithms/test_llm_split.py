"""Split and federated fine-tuning of transformer LMs with LoRA: the papers' mathematics on a shared
frozen base (equal to centralized fine-tuning with one client), executor agreement, exact traffic."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from tiers import parametrize_first_by_default

pytest.importorskip("transformers")

from llm_cases import lm_config, trained, write_corpus  # noqa: E402

import fedge  # noqa: E402
from fedge.algorithms.split.parts import composed  # noqa: E402
from fedge.engine import cross_entropy  # noqa: E402
from fedge.runner.loop import build_run  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def centralized_lora(built, rounds: int, batch_size: int, lr: float) -> tuple[dict, int]:
    """Hand-written LoRA fine-tuning of the whole model (autograd, ``torch.optim.SGD``) on the batches the
    run's one client draws; the adapters after it and the number of steps taken."""
    ctx = built.context
    model = ctx.build_model()
    sgd = torch.optim.SGD(model.parameters(), lr=lr)
    steps = 0
    for t in range(1, rounds + 1):
        plan = ctx.data.batch_plan([0], t, 1, batch_size)
        for s in range(int(plan.steps[0])):
            idx = plan.client_batch(0, s)
            sgd.zero_grad()
            cross_entropy(model(ctx.data.x_train[idx]), ctx.data.y_train[idx]).mean().backward()
            sgd.step()
            steps += 1
    return {name: p.detach() for name, p in model.named_parameters()}, steps


@parametrize_first_by_default("executor", ["sequential", "batched"])
def test_one_client_splitfed_v2_with_lora_equals_centralized_lora(corpus, executor):
    """SplitFed v2 (no clipping) with one client: the cut changes the traffic, not the mathematics."""
    algorithm = {"name": "splitfed_v2", "clip_norm": None, "batch_size": 8, "optimizer": {"lr": 0.05}}
    raw = lm_config(corpus, algorithm, clients=1, engine={"executor": executor})
    split_run, _ = trained(raw, rounds=2)
    reference, steps = centralized_lora(split_run, 2, 8, 0.05)
    assert steps >= 20
    state = composed(split_run.algorithm.client["params"], split_run.algorithm.server.params)
    assert set(state) == set(reference) and all(".lora_" in name for name in state)
    assert max_diff(state, reference) <= 1e-6
    untrained = {name: p.detach() for name, p in split_run.context.build_model().named_parameters()}
    assert max_diff(state, untrained) > 1e-3  # the adapters moved: the equality is not of two no-ops


@pytest.mark.ci
def test_one_client_fedavg_lora_with_one_local_step_equals_centralized_lora(corpus):
    algorithm = {"name": "fedavg", "batch_size": 512, "optimizer": {"lr": 0.05}}
    raw = lm_config(corpus, algorithm, clients=1)
    fedavg_run, _ = trained(raw, rounds=20)
    reference, steps = centralized_lora(fedavg_run, 20, 512, 0.05)
    assert steps == 20
    assert max_diff(fedavg_run.algorithm.params, reference) <= 1e-6


def _state(algorithm) -> dict:
    if hasattr(algorithm, "params"):
        return algorithm.params
    return {**algorithm.client["params"], **algorithm.server.params}


@parametrize_first_by_default(
    ("arch", "name"),
    [
        ("gpt2", "fedavg"),
        ("llama", "fedavg"),
        ("gpt2", "cse_fsl"),
        ("llama", "cse_fsl"),
        ("gpt2", "splitfed_v1"),
    ],
)
def test_batched_and_sequential_executors_agree_on_lora(corpus, arch, name):
    algorithm = {"name": name, "optimizer": {"lr": 0.05}}
    if name == "cse_fsl":
        algorithm["h"] = 2
    runs = []
    for executor in ("sequential", "batched"):
        raw = lm_config(corpus, algorithm, arch=arch, engine={"executor": executor})
        runs.append(trained(raw, rounds=3))
    (seq, seq_metrics), (bat, bat_metrics) = runs
    assert max_diff(_state(seq.algorithm), _state(bat.algorithm)) <= 1e-5
    assert seq.context.ledger.totals() == bat.context.ledger.totals()
    for a, b in zip(seq_metrics, bat_metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
    assert seq.algorithm.evaluate()["perplexity"] == pytest.approx(
        bat.algorithm.evaluate()["perplexity"], rel=1e-5
    )


def test_the_ledger_counts_hidden_states_targets_gradients_and_adapters_exactly(corpus):
    """Per round of SplitFed v2: smashed_up and grad_down = tokens x hidden x 32 bits of every real
    sequence, labels_up = tokens x 32 bits, model_down and model_up = participants x adapters x 32 bits."""
    raw = lm_config(corpus, {"name": "splitfed_v2", "batch_size": 8})
    built, _ = trained(raw, rounds=1)
    data, algorithm = built.context.data, built.algorithm
    sequences = int(data.client_sizes().sum())  # one local epoch over every client's sequences
    tokens, hidden = data.input_shape[0], 32
    adapters = sum(t.numel() for t in algorithm.client["params"].values())
    assert adapters == 4 * (32 + 96)  # LoRA r = 4 on block 1's c_attn: A 4x32, B 96x4
    totals = {kind: bits for (kind, _), bits in built.context.ledger.totals().items()}
    assert totals["smashed_up"] == sequences * tokens * hidden * 32
    assert totals["grad_down"] == sequences * tokens * hidden * 32
    assert totals["labels_up"] == sequences * tokens * 32
    assert totals["model_down"] == totals["model_up"] == 3 * adapters * 32


def test_full_fine_tuning_trains_every_weight_and_lora_only_adapters(corpus):
    lora, _ = trained(lm_config(corpus, {"name": "fedavg"}), rounds=1)
    full, _ = trained(
        lm_config(corpus, {"name": "fedavg"}, model={"options": {"layers": 2, "lora_rank": 0}}), 1
    )
    assert all(".lora_" in name for name in lora.algorithm.params)
    assert not any(".lora_" in name for name in full.algorithm.params)
    assert "block1.embed.wte.weight" in full.algorithm.params
    model_bits = {k: b for (k, _), b in full.context.ledger.totals().items()}["model_up"]
    assert model_bits == 3 * sum(t.numel() for t in full.algorithm.params.values()) * 32


def test_the_preflight_refuses_full_model_copies_where_adapters_fit(corpus, monkeypatch):
    """Every participant holds a full copy under full fine-tuning, only adapters under LoRA (beside the
    frozen base, counted once: 66 MiB in all here, one client's activations at a time)."""
    from fedge.errors import ConfigError
    from fedge.runner import preflight

    monkeypatch.setattr(preflight, "available_bytes", lambda device: 80 * 2**20)
    options, small_eval = {"layers": 6, "hidden": 256, "heads": 4}, {"batch_size": 8}
    one_at_a_time = {"executor": "sequential"}
    full = {"options": {**options, "lora_rank": 0}}
    raw = lm_config(corpus, {"name": "fedavg"}, model=full, eval=small_eval, engine=one_at_a_time)
    with pytest.raises(ConfigError, match="clients' models") as error:
        build_run(fedge.resolve_config(raw))
    assert error.value.key == "partition.num_clients" and "\n" not in str(error.value)
    lora = lm_config(
        corpus, {"name": "fedavg"}, model={"options": options}, eval=small_eval, engine=one_at_a_time
    )
    build_run(fedge.resolve_config(lora))


def test_the_batched_executor_trains_as_many_clients_at_once_as_a_quarter_of_the_memory_holds(
    corpus, monkeypatch
):
    """The chunk is the clients whose training activations fit in a quarter of the memory available,
    and the pre-flight counts that chunk: with room, the three clients train together; where three
    clients' activations would not fit but one client's does, they train one at a time and the run
    is accepted."""
    from fedge.errors import ConfigError
    from fedge.runner import preflight

    options = {"options": {"layers": 6, "hidden": 256, "heads": 4}}
    batched = lm_config(
        corpus, {"name": "fedavg"}, model=options, eval={"batch_size": 8}, engine={"executor": "batched"}
    )
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 2**40)
    roomy = build_run(fedge.resolve_config(batched)).context.executor
    rows = 8
    assert roomy.sample_bytes > 0 and roomy.clients_at_once(3, rows) == 3
    one_client = rows * roomy.sample_bytes
    monkeypatch.setattr(preflight, "available_bytes", lambda device: int(2.5 * one_client))
    built = build_run(fedge.resolve_config(batched))
    tight_bytes = built.context.executor.sample_bytes
    assert built.context.executor.clients_at_once(3, rows) == 1
    config, data = built.config, built.context.data
    parts = preflight.state_parts(config, data) + preflight.activation_parts(config, data, tight_bytes, 3)
    with pytest.raises(ConfigError, match="of 3 clients at once"):  # three at once would not have fitted
        preflight.check(parts, int(2.5 * one_client), force=False)


@parametrize_first_by_default("executor", ["sequential", "batched"])
def test_a_split_step_past_the_activation_budget_recomputes_its_graph_a_chunk_at_a_time(
    corpus, executor, monkeypatch
):
    """With the budget below two clients' activations, SplitFed v2's clients keep no graph between the
    upload and the returned gradient and recompute it one client at a time: the same numbers (LoRA
    dropout on, so the recomputed pass must draw the same masks), the same ledger. One client at a time
    runs the sequential kernels (PyTorch's fused attention) where the kept graph was vmapped, so the
    numbers agree to rounding."""
    from fedge.engine import executors
    from fedge.runner import preflight

    options = {"options": {"layers": 2, "hidden": 32, "heads": 2, "lora_rank": 4, "lora_dropout": 0.2}}
    algorithm = {"name": "splitfed_v2", "clip_norm": None}
    raw = lm_config(corpus, algorithm, model=options, engine={"executor": executor})
    kept, kept_metrics = trained(raw, rounds=2)
    recompute = mock.patch.object(executors.Executor, "_recomputed_vjp", autospec=True,
                                  side_effect=executors.Executor._recomputed_vjp)  # fmt: skip
    monkeypatch.setattr(executors.Executor, "activation_budget", 1)  # one client at a time
    monkeypatch.setattr(preflight, "available_bytes", lambda device: None)  # the runner keeps that budget
    with recompute as spy:
        again, again_metrics = trained(raw, rounds=2)
    assert spy.call_count > 0 and all(call.args[-1] == 1 for call in spy.call_args_list)
    assert max_diff(_state(kept.algorithm), _state(again.algorithm)) <= 1e-6
    assert kept.context.ledger.totals() == again.context.ledger.totals()
    losses = [(m["train_loss"], n["train_loss"]) for m, n in zip(kept_metrics, again_metrics, strict=True)]
    assert all(a == pytest.approx(b, abs=1e-6) for a, b in losses)


@pytest.mark.ci
def test_a_recomputed_split_step_gives_idle_clients_nothing_and_the_others_their_gradients(
    tmp_path, monkeypatch
):
    """Documents of unequal length give the clients unequal numbers of steps, so late steps have idle
    rows; recomputed one client at a time (a budget below two clients), an idle client's chunk computes
    nothing and the run equals the one that keeps its graph, to rounding, with the same ledger."""
    from fedge.engine import executors
    from fedge.runner import preflight

    root = tmp_path / "docs"
    root.mkdir()
    for i, chars in enumerate((1400, 900, 500)):
        (root / f"doc{i}.txt").write_text((" ".join(["edge", "cut", "radio", "token"][i:] * 400))[:chars])
    raw = lm_config(root, {"name": "splitfed_v2", "clip_norm": None}, engine={"executor": "batched"})
    kept, kept_metrics = trained(raw, rounds=2)
    assert len(set(kept.context.data.client_sizes().tolist())) == 3
    recompute = mock.patch.object(executors.Executor, "_recomputed_vjp", autospec=True,
                                  side_effect=executors.Executor._recomputed_vjp)  # fmt: skip
    monkeypatch.setattr(executors.Executor, "activation_budget", 1)
    monkeypatch.setattr(preflight, "available_bytes", lambda device: None)
    with recompute as spy:
        again, again_metrics = trained(raw, rounds=2)
    assert spy.call_count > 0
    assert max_diff(_state(kept.algorithm), _state(again.algorithm)) <= 1e-6
    assert kept.context.ledger.totals() == again.context.ledger.totals()
    losses = [(m["train_loss"], n["train_loss"]) for m, n in zip(kept_metrics, again_metrics, strict=True)]
    assert all(a == pytest.approx(b, abs=1e-6) for a, b in losses)


@pytest.mark.parametrize("name", ["gossip", "hfedavg"])
def test_algorithms_without_a_per_token_contract_are_refused_in_one_line(corpus, name):
    from fedge.errors import ConfigError

    with pytest.raises(ConfigError, match="does not train on token sequences") as error:
        build_run(fedge.resolve_config(lm_config(corpus, {"name": name})))
    assert error.value.key == "algorithm.name"


@pytest.mark.ci
def test_the_report_and_the_summary_show_perplexity(corpus, tmp_path):
    from fedge.report.page import write_report

    raw = lm_config(corpus, {"name": "cse_fsl", "h": 2}, rounds=1, output={"dir": str(tmp_path)})
    result = fedge.run(raw)
    assert result.summary["final_perplexity"] == pytest.approx(result.metrics[-1]["perplexity"])
    assert result.summary["final_perplexity"] > 1.0
    page = write_report(result.run_dir).read_text()
    assert "final perplexity" in page
    assert f"{result.summary['final_perplexity']:.3f}" in page
