"""Clients folded into one batch: LoRA transformers trained with every client's samples in one plain pass."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from llm_cases import lm_config, needs_llm, write_corpus
from tiers import parametrize_first_by_default
from torch.func import vmap

import fedge
from fedge.engine import folded
from fedge.engine.folded import FoldedKernel, clients_per_fold, folds_clients
from fedge.models.lora import LoRALinear
from fedge.models.transformer import causal_attention
from fedge.runner.loop import build_run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _model(corpus, **options):
    raw = lm_config(corpus, {"name": "fedavg"})
    raw["model"]["options"].update(options)
    return build_run(fedge.resolve_config(raw)).context.build_model()


@needs_llm
def test_a_lora_transformer_folds_and_a_fully_trained_one_does_not(corpus):
    assert folds_clients(_model(corpus))
    assert not folds_clients(_model(corpus, lora_rank=0))  # its norms and projections train: not per row


def test_folded_lora_equals_each_clients_own_projection():
    torch.manual_seed(0)
    clients, batch, seq, width = 3, 2, 5, 8
    layer = LoRALinear(torch.randn(12, width), torch.randn(12), rank=4, alpha=8.0)
    a, b = torch.randn(clients, 4, width), torch.randn(clients, 12, 4)
    x = torch.randn(clients * batch, seq, width)
    layer.lora_A, layer.lora_B = torch.nn.Parameter(a), torch.nn.Parameter(b)
    together = layer(x).reshape(clients, batch, seq, 12)
    for c in range(clients):
        layer.lora_A, layer.lora_B = torch.nn.Parameter(a[c]), torch.nn.Parameter(b[c])
        assert (together[c] - layer(x.reshape(clients, batch, seq, width)[c])).abs().max() <= 1e-5


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_fused_attention_on_plain_tensors_equals_the_written_out_one_under_vmap(kv_heads):
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 4, 7, 8), torch.randn(3, 2, kv_heads, 7, 8), torch.randn(3, 2, kv_heads, 7, 8)
    plain, _ = causal_attention(None, q, k, v, None)
    mapped = vmap(lambda q, k, v: causal_attention(None, q, k, v, None)[0])(q, k, v)
    assert plain.shape == (3, 2, 7, 4, 8)
    assert (plain - mapped).abs().max() <= 1e-6


def test_a_pass_on_a_cpu_folds_about_2048_positions_and_elsewhere_all():
    assert clients_per_fold(torch.device("cpu"), 16 * 8) == 16
    assert clients_per_fold(torch.device("cpu"), 10_000) == 1
    assert clients_per_fold(torch.device("meta"), 16 * 8) is None


def _trained(raw):
    built = build_run(fedge.resolve_config(raw))
    losses = [built.algorithm.run_round(t)["train_loss"] for t in range(1, raw["rounds"] + 1)]
    return built, losses


def _state(algorithm) -> dict:
    if hasattr(algorithm, "params"):
        return dict(algorithm.params)
    return {**algorithm.client["params"], **algorithm.server.params}


@needs_llm
@parametrize_first_by_default("name", ["fedavg", "splitfed_v2", "cse_fsl"])
@parametrize_first_by_default("positions", [2048, 128])  # every client in one pass; one client a pass
def test_folded_vmapped_and_sequential_runs_agree(corpus, name, positions, monkeypatch):
    """The batched executor folds the clients (``engine.fused``, the default) or vmaps them; both agree
    with the sequential executor to 1e-5 over 2 rounds, with identical ledgers."""
    monkeypatch.setattr(folded, "CPU_FOLD_POSITIONS", positions)
    algorithm = {"name": name, **({"h": 2} if name == "cse_fsl" else {})}
    runs = {}
    for way, engine in {
        "sequential": {"executor": "sequential"},
        "folded": {"executor": "batched"},
        "vmapped": {"executor": "batched", "fused": False},
    }.items():
        with mock.patch.object(
            FoldedKernel, "__call__", autospec=True, side_effect=FoldedKernel.__call__
        ) as spy:
            runs[way] = _trained(lm_config(corpus, algorithm, engine=engine))
        if name == "fedavg":  # a step kernel exists only for whole local epochs
            assert spy.called == (way == "folded")
    (ref, ref_losses) = runs["sequential"]
    for way in ("folded", "vmapped"):
        built, losses = runs[way]
        ours, theirs = _state(built.algorithm), _state(ref.algorithm)
        assert max(float((ours[k] - theirs[k]).abs().max()) for k in theirs) <= 1e-5
        assert losses == pytest.approx(ref_losses, abs=1e-5)
        assert built.context.ledger.totals() == ref.context.ledger.totals()


@needs_llm
def test_a_run_with_lora_dropout_keeps_the_vmapped_path(corpus):
    """Folding cannot draw each client's own dropout masks, so random layers keep ``vmap``."""
    raw = lm_config(corpus, {"name": "fedavg"})
    raw["model"]["options"]["lora_dropout"] = 0.2
    with mock.patch.object(FoldedKernel, "__call__", autospec=True) as spy:
        _trained(raw)
    assert not spy.called


@needs_llm
def test_a_folded_step_trims_the_padding_of_a_short_last_batch(corpus):
    """Three clients of 70 sequences in batches of 8: the ninth step holds 6 real rows per client, and the
    folded kernel computes those rows only (the sequential executor does the same; the runs agree above)."""
    built = build_run(fedge.resolve_config(lm_config(corpus, {"name": "fedavg"})))
    assert built.context.data.client_sizes().tolist() == [70, 70, 70]
    shapes = []
    original = FoldedKernel.__call__

    def recording(self, params, buffers, opt_state, x, y, weight, lr, keys):
        shapes.append((tuple(x.shape[:2]), float(weight.sum())))
        return original(self, params, buffers, opt_state, x, y, weight, lr, keys)

    with mock.patch.object(FoldedKernel, "__call__", recording):
        built.algorithm.run_round(1)
    assert shapes == [((3, 8), 24.0)] * 8 + [((3, 6), 18.0)]
