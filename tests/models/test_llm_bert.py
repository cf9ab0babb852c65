"""BERT-family sequence classifiers as split models: transformers' own logits at every cut, the textcls
data (full windows labeled by class, no padding), executor agreement, exact traffic, one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from tiers import parametrize_first_by_default
from torch.func import functional_call, vmap

transformers = pytest.importorskip("transformers")

from llm_cases import bert_run, executors_agree, trained, write_corpus  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import fedge  # noqa: E402
from fedge.data.tokenizer import make_tokenizer  # noqa: E402
from fedge.engine import parameters_of  # noqa: E402
from fedge.errors import ConfigError, DataError  # noqa: E402
from fedge.models import build_model, split  # noqa: E402
from fedge.models.encoder import bert_config  # noqa: E402
from fedge.runner.loop import build_run  # noqa: E402

SIZES = {"layers": 3, "hidden": 32, "heads": 4}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@parametrize_first_by_default("lora_rank", [0, 4])
def test_every_cut_computes_what_bert_for_sequence_classification_computes(lora_rank):
    """The same seed and config give transformers' BertForSequenceClassification (its sdpa attention);
    LoRA starts at the base (B = 0)."""
    torch.manual_seed(0)
    ours = build_model("bert", (16,), 5, **SIZES, lora_rank=lora_rank)
    torch.manual_seed(0)
    reference = transformers.BertForSequenceClassification(bert_config(256, 5, 16, 3, 32, 4, None)).eval()
    x = torch.randint(1, 256, (4, 16))  # 0 is the pad id: no padding here
    expected = reference(x).logits
    assert expected.shape == (4, 5)
    torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)
    assert ours.cut_points == [1, 2, 3]
    for cut in ours.cut_points:
        client, server = split(ours, cut)
        torch.testing.assert_close(server(client(x)), expected, rtol=1e-5, atol=1e-5)


def test_lora_trains_adapters_and_the_classifier_over_one_base_under_vmap():
    torch.manual_seed(0)
    model = build_model("bert", (16,), 3, layers=2, hidden=32, heads=2, lora_rank=4)
    params = parameters_of(model)
    assert {n.rsplit(".", 2)[-2] for n in params if ".lora_" in n} == {"query", "value"}
    assert {n for n in params if ".lora_" not in n} == {"head.classifier.weight", "head.classifier.bias"}
    clients = []
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        clients.append({k: torch.randn(p.shape, generator=g) * 0.1 for k, p in params.items()})
    stacked = {k: torch.stack([c[k] for c in clients]) for k in clients[0]}
    x = torch.randint(0, 256, (2, 3, 16))
    batched = vmap(lambda p, xs: functional_call(model, p, (xs,)))(stacked, x)
    for i, state in enumerate(clients):
        torch.testing.assert_close(batched[i], functional_call(model, state, (x[i],)), rtol=1e-5, atol=1e-5)


def test_textcls_labels_full_windows_by_file_or_jsonl_label(tmp_path):
    (tmp_path / "a.txt").write_text("a" * 50)
    (tmp_path / "b.txt").write_text("b" * 40)
    lines = [
        {"text": "x" * 30, "label": "pos"},
        {"text": "y" * 30, "label": "neg"},
        {"text": "z" * 20, "label": "pos"},
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    cfg = fedge.resolve_config({"data": {"name": "textcls", "root": str(tmp_path), "seq_len": 10}})
    from fedge.data.sources.textcls import load_textcls

    data = load_textcls(cfg.data, 0)
    labels = ["a.txt", "b.txt", "neg", "pos"]
    assert data.num_classes == 4 and data.input_shape == (10,)
    x = torch.cat([data.x_train, data.x_test])
    y = torch.cat([data.y_train, data.y_test])
    # every window is full and uniform in its document's character: no padding, no tail
    expected = {"a.txt": "a", "b.txt": "b", "neg": "y", "pos": "xz"}
    for row, label in zip(x, y, strict=True):
        assert set(bytes(row.tolist()).decode()) <= set(expected[labels[int(label)]] + "\n")
    counts = torch.bincount(y, minlength=4).tolist()
    assert counts == [5, 4, 3, 5]  # 50 / 10, 40 / 10, 30 / 10, (30 + 1 + 20) // 10
    tokenizer = make_tokenizer("bytes", False)
    assert tokenizer.vocab_size == 256
    with pytest.raises(DataError, match="fewer than 64 tokens"):
        load_textcls(
            fedge.resolve_config({"data": {"name": "textcls", "root": str(tmp_path), "seq_len": 64}}).data, 0
        )


@parametrize_first_by_default("name", ["splitfed_v2", "cse_fsl", "fedavg"])
def test_batched_and_sequential_executors_agree_on_bert(corpus, name):
    algorithm = {"name": name, **({"h": 2} if name == "cse_fsl" else {})}
    (seq, _), (bat, _) = executors_agree(lambda engine: bert_run(corpus, algorithm, engine=engine))
    state = lambda a: a.params if hasattr(a, "params") else {**a.client["params"], **a.server.params}  # noqa: E731
    a, b = state(seq.algorithm), state(bat.algorithm)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5
    assert seq.algorithm.evaluate()["accuracy"] == pytest.approx(bat.algorithm.evaluate()["accuracy"])
    if name == "cse_fsl":
        assert any(k.startswith("aux.") for k in seq.algorithm.client["params"])


@pytest.mark.ci
@pytest.mark.parametrize("name", ["splitfed_v1", "light_fedsl", "gossip", "hfedavg"])
def test_the_other_families_run_on_bert_and_their_executors_agree(corpus, name):
    """One label per sequence fits every family's model contract: split with a server copy per client,
    lightweight FedSL (pruned adapters, cut dropout), decentralized and hierarchical."""
    algorithm = {"name": name, **({"cells": 1} if name == "hfedavg" else {})}
    executors_agree(lambda engine: bert_run(corpus, algorithm, engine=engine))


def test_the_ledger_counts_hidden_states_labels_gradients_and_adapters_exactly(corpus):
    """SplitFed v2, one round: smashed_up and grad_down = tokens x hidden x 32 bits per sequence (every
    sequence a full window: no pad position exists to exclude), labels_up = one 32-bit label per
    sequence, model traffic = participants x client adapters x 32 bits."""
    built, _ = trained(bert_run(corpus, {"name": "splitfed_v2"}), rounds=1)
    data, algorithm = built.context.data, built.algorithm
    sequences = int(data.client_sizes().sum())
    assert data.input_shape == (16,) and data.dataset.y_train.dim() == 1
    adapters = sum(t.numel() for t in algorithm.client["params"].values())
    assert adapters == 2 * 4 * (32 + 32)  # LoRA r = 4 on block 1's query and value
    totals = {kind: bits for (kind, _), bits in built.context.ledger.totals().items()}
    assert totals["smashed_up"] == sequences * 16 * 32 * 32
    assert totals["grad_down"] == sequences * 16 * 32 * 32
    assert totals["labels_up"] == sequences * 32
    assert totals["model_down"] == totals["model_up"] == 3 * adapters * 32


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"model": {"cut": 3}}, "model.cut"),
        ({"model": {"options": {"layers": 2, "hidden": 32, "heads": 2, "positions": 8}}}, "data.seq_len"),
    ],
)
def test_bad_cuts_and_sequences_fail_in_one_line(corpus, change, key):
    with pytest.raises(ConfigError) as error:
        build_run(fedge.resolve_config(bert_run(corpus, {"name": "splitfed_v2"}, **change)))
    assert error.value.key == key and "\n" not in str(error.value)


def test_a_checkpoint_of_another_architecture_is_refused(tmp_path):
    transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="unknown architecture 'gpt2'") as error:
        build_model("bert", (16,), 3, pretrained=str(tmp_path))
    assert error.value.key == "model.options.pretrained"


def test_a_tiny_run_end_to_end_from_the_cli(corpus, tmp_path):
    from fedge.cli.commands import app

    path = tmp_path / "bert.json"
    path.write_text(
        json.dumps(bert_run(corpus, {"name": "cse_fsl", "h": 2}, output={"dir": str(tmp_path / "runs")}))
    )
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    assert "final accuracy" in result.output and "smashed_up" in result.output
    summary = json.loads((tmp_path / "runs" / "cse_fsl-textcls" / "summary.json").read_text())
    assert "final_perplexity" not in summary and 0.0 <= summary["final_accuracy"] <= 1.0
    listed = CliRunner().invoke(app, ["list"])
    assert "bert" in listed.output and "1:block1, 2:block2" in listed.output and "textcls" in listed.output
