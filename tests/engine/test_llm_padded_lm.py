"""Padded language-model samples (``data.sequences: lines`` on ``text`` / ``pystdlib``): a line per sample,
right-padded, its pad targets ignored; a causal LM's real tokens compute as unpadded, its pad positions
cross the cut as nothing, the ledger counts real tokens and targets, and the executors agree."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiers import parametrize_first_by_default

transformers = pytest.importorskip("transformers")

from llm_cases import WORDS, cli_run, executors_agree, lm_config, trained  # noqa: E402

import fedge  # noqa: E402
from fedge.data.dataset import IGNORED_TARGET  # noqa: E402
from fedge.data.sources.text import load_text  # noqa: E402
from fedge.engine import cross_entropy  # noqa: E402
from fedge.engine.evaluate import evaluate_model  # noqa: E402
from fedge.errors import ConfigError, DataError  # noqa: E402
from fedge.models import build_model, split  # noqa: E402

SEQ = 24
TINY = {"layers": 3, "hidden": 32, "lora_rank": 0}
ARCHES = {"gpt2": {"heads": 2}, "llama": {"heads": 4, "kv_heads": 2, "intermediate": 48}}


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """Three documents of 40 seeded lines of 1 to 7 words (most shorter than ``SEQ`` bytes)."""
    folder = tmp_path_factory.mktemp("lines")
    for f in range(3):
        rng = np.random.default_rng(f)
        vocabulary = WORDS[: len(WORDS) - f]
        text = [" ".join(rng.choice(vocabulary, size=rng.integers(1, 8))) for _ in range(40)]
        (folder / f"doc{f}.txt").write_text("\n".join(text) + "\n")
    return folder


def lines_run(root, algorithm: dict, **overrides) -> dict:
    """``lm_config`` on padded lines of ``SEQ`` tokens."""
    data = {"seq_len": SEQ, "sequences": "lines", **overrides.pop("data", {})}
    return lm_config(root, algorithm, data=data, **overrides)


def load(root, **data) -> fedge.data.dataset.Dataset:
    raw = {"data": {"name": "text", "root": str(root), "seq_len": 8, "sequences": "lines", **data}}
    return load_text(fedge.resolve_config(raw).data, 0)


def test_a_line_is_a_sample_its_next_tokens_the_targets_and_its_padding_ignored(tmp_path):
    (tmp_path / "a.txt").write_text("hello\n\n x \n  a line longer than nine bytes \nok\n")
    records = [{"text": "two\nlines"}, {"text": "yy"}]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    data = load(tmp_path)
    assert data.pad_id == 0 and data.input_shape == (8,)
    x, y = torch.cat([data.x_train, data.x_test]), torch.cat([data.y_train, data.y_test])
    text = lambda ids: bytes(ids.tolist()).decode()  # noqa: E731
    # "x" (one token) predicts nothing and is skipped; a long line is cut to 9 tokens
    samples = {text(r[r != 0]) for r in x}
    assert samples == {"hell", "a line l", "o", "two line", "y"}
    for row, targets in zip(x, y, strict=True):
        real = row != 0
        assert torch.equal(real, targets != IGNORED_TARGET)  # a position is real as input and target alike
        assert text(row[real])[1:] == text(targets[real])[:-1]  # each target is the next token
    assert text(y[0][y[0] != IGNORED_TARGET]) == "ello"
    assert data.x_train.shape[0] == 3 and data.x_test.shape[0] == 2  # each document's tail held out
    (tmp_path / "c.txt").write_text("nul \0 byte\n")
    with pytest.raises(DataError, match="text: c.txt holds the pad token id 0"):
        load(tmp_path)


def test_a_document_without_a_line_to_learn_from_is_refused_and_lines_need_text(tmp_path):
    (tmp_path / "a.txt").write_text("fine line\n")
    (tmp_path / "b.txt").write_text("x\ny\n\n")
    with pytest.raises(DataError, match="b.txt has no line of two tokens"):
        load(tmp_path)
    for name in ("shakespeare", "mnist"):
        with pytest.raises(ConfigError, match="is for text data") as error:
            fedge.resolve_config({"data": {"name": name, "sequences": "lines"}})
        assert error.value.key == "data.sequences"


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_real_tokens_compute_as_unpadded_and_pad_positions_cross_the_cut_as_zero(arch):
    torch.manual_seed(0)
    model = build_model(arch, (16,), 64, **TINY, **ARCHES[arch], pad_id=0)
    lengths = (16, 5, 1, 9)
    x = torch.randint(1, 64, (4, 16))
    for row, length in enumerate(lengths):
        x[row, length:] = 0
    real = x != 0
    logits = model(x)
    for row, length in enumerate(lengths):  # each sequence alone, unpadded
        alone = model(x[row : row + 1, :length])
        torch.testing.assert_close(logits[row : row + 1, :, :length], alone, rtol=1e-5, atol=1e-5)
    for cut in model.cut_points:
        client, server = split(model, cut)
        z = client(x)
        assert torch.equal(z.ne(0).any(-1), real)  # pad positions cross the cut as zero vectors
        at_real = real.unsqueeze(1).expand_as(logits)
        torch.testing.assert_close(server(z)[at_real], logits[at_real], rtol=1e-5, atol=1e-5)


def test_a_sample_loss_is_the_mean_over_its_real_targets_and_evaluation_counts_real_tokens():
    torch.manual_seed(1)
    logits = torch.randn(3, 11, 6)
    y = torch.randint(0, 11, (3, 6))
    y[1, 2:] = IGNORED_TARGET
    y[2, 5:] = IGNORED_TARGET
    per_sample = cross_entropy(logits, y)
    for row, length in enumerate((6, 2, 5)):
        alone = F.cross_entropy(logits[row : row + 1, :, :length], y[row : row + 1, :length])
        assert float(per_sample[row]) == pytest.approx(float(alone), abs=1e-6)
    unpadded = torch.randint(0, 11, (3, 6))  # an unpadded sequence: exactly PyTorch's mean
    mean = F.cross_entropy(logits, unpadded, reduction="none").mean(1)
    assert torch.equal(cross_entropy(logits, unpadded), mean)
    model = build_model("gpt2", (6,), 11, **TINY, heads=2, pad_id=0)
    x = torch.randint(1, 11, (3, 6))
    x[y == IGNORED_TARGET] = 0
    params = dict(model.named_parameters())
    scored = evaluate_model(model, params, dict(model.named_buffers()), x, y, batch_size=2)
    with torch.no_grad():
        out = model(x)
    real = y != IGNORED_TARGET
    expected_loss = float(F.cross_entropy(out, y, reduction="sum")) / int(real.sum())
    expected_accuracy = int((out.argmax(1) == y)[real].sum()) / int(real.sum())
    assert scored.loss == pytest.approx(expected_loss, rel=1e-6)
    assert scored.accuracy == pytest.approx(expected_accuracy)
    assert scored.extra["perplexity"] == pytest.approx(np.exp(expected_loss), rel=1e-6)


def test_the_ledger_counts_real_tokens_and_their_targets_only(lines):
    """SplitFed v2, one round (every client's samples once): smashed_up and grad_down = real tokens x
    hidden x 32 bits, labels_up = real targets x 32; the padding (about a third here) is not counted."""
    built, _ = trained(lines_run(lines, {"name": "splitfed_v2"}), rounds=1)
    data = built.context.data
    ix = np.concatenate([data.client_train[k] for k in range(3)])
    x, y = data.dataset.x_train[ix], data.dataset.y_train[ix]
    real = int((x != 0).sum())
    assert real == int((y != IGNORED_TARGET).sum()) and real < 0.8 * x.numel()
    totals = {kind: bits for (kind, _), bits in built.context.ledger.totals().items()}
    assert totals["smashed_up"] == totals["grad_down"] == real * 32 * 32
    assert totals["labels_up"] == real * 32


@parametrize_first_by_default("name", ["splitfed_v1", "cse_fsl", "light_fedsl", "fedavg"])
def test_executors_agree_on_padded_lines(lines, name):
    algorithm = {"name": name, **({"h": 2} if name == "cse_fsl" else {})}
    executors_agree(lambda engine: lines_run(lines, algorithm, engine=engine))


@pytest.mark.ci
def test_executors_agree_on_a_padded_llama(lines):
    executors_agree(lambda engine: lines_run(lines, {"name": "cse_fsl", "h": 2}, arch="llama", engine=engine))


def test_light_fedsl_sends_the_kept_entries_of_real_tokens_and_every_real_target(lines):
    up = {}
    for p in (0.0, 0.5):
        built, _ = trained(lines_run(lines, {"name": "light_fedsl", "cut_dropout": p}), rounds=1)
        up[p] = {kind: bits for (kind, _), bits in built.context.ledger.totals().items()}
    real = up[0.0]["labels_up"] // 32
    assert up[0.0]["smashed_up"] == real * 32 * 32 and real < 3 * 8 * SEQ
    assert up[0.5]["labels_up"] == up[0.0]["labels_up"]
    assert 0.4 < up[0.5]["smashed_up"] / up[0.0]["smashed_up"] < 0.6


def test_from_the_cli_a_run_and_a_pad_id_on_packed_text(lines, tmp_path):
    path = tmp_path / "lines.json"
    result = cli_run(lines_run(lines, {"name": "splitfed_v2"}, output={"dir": str(tmp_path / "r")}), path)
    assert result.exit_code == 0, result.output
    metrics = (tmp_path / "r" / "splitfed_v2-text" / "metrics.jsonl").read_text()
    rows = [json.loads(r) for r in metrics.splitlines()]
    assert all(np.isfinite(r["test_loss"]) for r in rows if "test_loss" in r)
    packed = lm_config(lines, {"name": "splitfed_v2"}, output={"dir": str(tmp_path / "s")})
    packed["model"]["options"]["pad_id"] = 0
    result = cli_run(packed, path)
    assert result.exit_code == 2 and "model.options.pad_id" in result.output
    assert not (tmp_path / "s").exists()


def test_label_smoothing_gives_a_language_model_one_loss_per_sample(lines):
    """train.label_smoothing reduces a sequence as the plain loss does (it once returned per-token losses,
    which a batch's sample weights could not multiply), and a run with it trains."""
    from fedge.runner.loop import _criterion

    raw = lines_run(lines, {"name": "splitfed_v2"}, train={"label_smoothing": 0.1})
    smoothed = _criterion(fedge.resolve_config(raw), None)
    torch.manual_seed(2)
    logits, y = torch.randn(3, 11, 6), torch.randint(0, 11, (3, 6))
    y[1, 3:] = IGNORED_TARGET
    per_sample = smoothed(logits, y)
    assert per_sample.shape == (3,)
    alone = F.cross_entropy(logits[1:2, :, :3], y[1:2, :3], label_smoothing=0.1)
    assert float(per_sample[1]) == pytest.approx(float(alone), abs=1e-6)
    _, metrics = trained(raw, rounds=2)
    assert np.isfinite(metrics[-1]["train_loss"]) and metrics[-1]["train_loss"] != metrics[0]["train_loss"]
