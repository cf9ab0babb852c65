"""Lightweight FedSL on a LoRA transformer: cut dropout on token activations, a q-bit cut-layer gradient,
pruned adapters; exact traffic, executor agreement, and pruning that zeroes what it says."""

from __future__ import annotations

import pytest
import torch
from tiers import parametrize_first_by_default

pytest.importorskip("transformers")

from llm_cases import lm_config, trained, write_corpus  # noqa: E402

import fedge  # noqa: E402
from fedge.algorithms.split.pruning import sparsity_target  # noqa: E402
from fedge.rng import torch_rng  # noqa: E402
from fedge.runner.loop import build_run  # noqa: E402

SEQ, HIDDEN, BATCH = 16, 32, 32  # llm_cases' tiny GPT-2; 70 sequences a client: round 3 pads its batch
LIGHT = {"name": "light_fedsl", "batch_size": BATCH, "final_sparsity": 0.5, "cut_dropout": 0.3,
         "quant_bits": 8, "codec_down": "q4", "agg_interval": 2, "optimizer": {"lr": 0.05}}  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def test_the_ledger_counts_kept_token_activations_and_the_quantized_gradient_exactly(corpus):
    """Per round and client with ``c`` real sequences (batches of 32, one per round, the last of an epoch
    short): the entries kept by the shared-seed mask (each of ``c x seq x hidden`` kept with probability
    1 - p) go up at 32 bits; their gradient comes down at a sign and 4 level bits each plus one 64-bit
    range; targets ``c x seq x 32``; in an aggregation round every client's adapters up and down at 32."""
    rounds, p = 3, LIGHT["cut_dropout"]
    built, _ = trained(lm_config(corpus, LIGHT, rounds=rounds), rounds)
    data, algorithm = built.context.data, built.algorithm
    attention = "trunk.block1.layer.attn.c_attn"
    assert algorithm.prunable == [f"{attention}.lora_A", f"{attention}.lora_B"]
    adapters = 4 * (HIDDEN + 3 * HIDDEN)  # r = 4 on c_attn: A 4 x 32, B 96 x 4
    smashed = gradient = targets = short = 0
    for t in range(1, rounds + 1):
        for k, size in enumerate(data.client_sizes().tolist()):
            steps = -(-size // BATCH)
            c = BATCH if (t - 1) % steps < steps - 1 else size - BATCH * (steps - 1)
            draws = torch.rand((c, SEQ, HIDDEN), generator=torch_rng(3, "cut-dropout", t, k))
            kept = int((draws >= p).sum())
            smashed += kept * 32
            gradient += kept * (1 + 4) + 64
            targets += c * SEQ * 32
            short += c < BATCH
    assert short == 3  # round 3: every client's padded batch; its padding rows send nothing
    totals = {kind: bits for (kind, _), bits in built.context.ledger.totals().items()}
    assert totals["smashed_up"] == smashed
    assert totals["grad_down"] == gradient
    assert totals["labels_up"] == targets
    assert totals["model_up"] == totals["model_down"] == 3 * adapters * 32  # one aggregation (t = 2)


@parametrize_first_by_default("arch", ["gpt2", "llama"])
def test_batched_and_sequential_executors_agree(corpus, arch):
    runs = []
    for executor in ("sequential", "batched"):
        raw = lm_config(corpus, LIGHT, arch=arch, rounds=3, engine={"executor": executor})
        runs.append(trained(raw, rounds=3))
    (seq, seq_metrics), (bat, bat_metrics) = runs
    for key in ("params", "masks"):
        a, b = seq.algorithm.clients[key], bat.algorithm.clients[key]
        assert max(float((a[n].double() - b[n].double()).abs().max()) for n in a) <= 1e-5
    a, b = seq.algorithm.server.params, bat.algorithm.server.params
    assert max(float((a[n] - b[n]).abs().max()) for n in a) <= 1e-5
    assert seq.context.ledger.totals() == bat.context.ledger.totals()
    for x, y in zip(seq_metrics, bat_metrics, strict=True):
        assert x.train_loss == pytest.approx(y.train_loss, abs=1e-5)
        assert x.extra["sparsity"] == y.extra["sparsity"]
    assert seq.algorithm.evaluate()["perplexity"] == pytest.approx(
        bat.algorithm.evaluate()["perplexity"], rel=1e-5
    )


def test_pruning_zeroes_the_adapter_entries_its_masks_name(corpus):
    """After every round each client's adapters are exactly zero where its mask says pruned; a round that
    prunes leaves exactly ``round(rho_t N)`` of the ``N`` adapter entries pruned (Eq. 10's schedule); an
    aggregation round's mask is the non-zero pattern of the mean; a pruned entry stays pruned until then."""
    cfg = {**LIGHT, "agg_interval": 3}
    rounds = 4
    built = build_run(fedge.resolve_config(lm_config(corpus, cfg, rounds=rounds)))
    algorithm = built.algorithm
    before = None
    for t in range(1, rounds + 1):
        algorithm.run_round(t)
        params, masks = algorithm.clients["params"], algorithm.clients["masks"]
        total = sum(m[0].numel() for m in masks.values())
        pruned = [sum(int((~m[k]).sum()) for m in masks.values()) for k in range(3)]
        for name, mask in masks.items():
            assert bool((params[name][~mask] == 0).all()), name
        if t == 1:  # B starts at zero: the trigger waits until the exact zeros fall below rho_t
            assert pruned == [0, 0, 0]
        elif t % cfg["agg_interval"]:
            rho = sparsity_target(t, rounds, cfg["final_sparsity"])
            assert pruned == [round(rho * total)] * 3
            for name, mask in masks.items():
                assert bool((~before[name] <= ~mask).all()), name  # once pruned, pruned
        else:
            for name, mask in masks.items():
                assert torch.equal(mask, params[name] != 0), name
        before = {name: mask.clone() for name, mask in masks.items()}
    assert algorithm.evaluate()["model_sparsity"] > 0.0


def test_full_fine_tuning_prunes_the_trained_projections(corpus):
    full = {"options": {"layers": 2, "hidden": HIDDEN, "heads": 2, "lora_rank": 0}}
    built, _ = trained(lm_config(corpus, LIGHT, model=full, rounds=2), 2)
    assert built.algorithm.prunable == [
        "trunk.block1.layer.attn.c_attn.weight", "trunk.block1.layer.attn.c_proj.weight",
        "trunk.block1.layer.mlp.c_fc.weight", "trunk.block1.layer.mlp.c_proj.weight",
    ]  # fmt: skip
    assert built.algorithm.evaluate()["model_sparsity"] > 0.0
