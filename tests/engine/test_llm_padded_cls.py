"""Padded sentence classification (``data.sequences: lines``): a line per sample, right-padded; BERT masks
the pad positions as transformers does with an attention mask, the cut never sends them, and the executors
agree."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiers import parametrize_first_by_default

transformers = pytest.importorskip("transformers")

from llm_cases import WORDS, bert_run, cli_run, executors_agree, trained  # noqa: E402

import fedge  # noqa: E402
from fedge.data.sources.textcls import load_textcls  # noqa: E402
from fedge.errors import ConfigError, DataError  # noqa: E402
from fedge.models import build_model, split  # noqa: E402
from fedge.models.encoder import bert_config  # noqa: E402
from fedge.runner.loop import build_run  # noqa: E402

SEQ = 48


@pytest.fixture(scope="module")
def sentences(tmp_path_factory):
    """Two labels of seeded sentences of 1 to 7 words (most shorter than ``SEQ`` bytes)."""
    folder = tmp_path_factory.mktemp("sentences")
    rng = np.random.default_rng(0)
    records = []
    for i in range(120):
        label = ("pos", "neg")[i % 2]
        vocabulary = WORDS[:6] if label == "pos" else WORDS[5:]
        words = [vocabulary[j] for j in rng.integers(0, len(vocabulary), size=rng.integers(1, 8))]
        records.append({"text": " ".join(words), "label": label})
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return folder


def lines_run(root, algorithm: dict, **overrides) -> dict:
    """``bert_run`` on padded lines of ``SEQ`` tokens."""
    data = {"seq_len": SEQ, "sequences": "lines", **overrides.pop("data", {})}
    return bert_run(root, algorithm, data=data, **overrides)


def test_a_padded_batch_gives_transformers_outputs_with_its_attention_mask_at_every_cut():
    torch.manual_seed(0)
    ours = build_model("bert", (16,), 5, layers=3, hidden=32, heads=4, lora_rank=0)
    torch.manual_seed(0)
    reference = transformers.BertForSequenceClassification(bert_config(256, 5, 16, 3, 32, 4, None)).eval()
    x = torch.randint(1, 256, (4, 16))
    for row, length in enumerate((16, 5, 1, 9)):
        x[row, length:] = 0
    real = x != 0
    masked = reference.bert(x, attention_mask=real.long()).last_hidden_state
    unmasked = reference.bert(x).last_hidden_state
    assert float((masked - unmasked).detach()[real].abs().max()) > 0.01  # the mask matters to real tokens
    torch.testing.assert_close(ours(x), reference(x, attention_mask=real.long()).logits, rtol=1e-5, atol=1e-5)
    for cut in ours.cut_points:
        client, server = split(ours, cut)
        z = client(x)
        assert torch.equal(z.ne(0).any(-1), real)  # pad positions cross the cut as zero vectors
        torch.testing.assert_close(server(z), ours(x), rtol=1e-5, atol=1e-5)
    hidden = split(ours, 3)[0](x)  # every encoder layer on the client side
    torch.testing.assert_close(hidden[real], masked[real], rtol=1e-5, atol=1e-5)


def test_lines_are_samples_cut_and_right_padded_with_the_pad_id(tmp_path):
    (tmp_path / "a.txt").write_text("short\n\n  a line longer than ten bytes  \n")
    records = [{"text": "two\nlines", "label": "x"}, {"text": "yy", "label": "x"}]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    raw = {"data": {"name": "textcls", "root": str(tmp_path), "seq_len": 10, "sequences": "lines"}}
    data = load_textcls(fedge.resolve_config(raw).data, 0)
    assert data.pad_id == 0 and data.input_shape == (10,)
    rows = {bytes(r[r != 0].tolist()).decode(): int(y) for r, y in zip(
        torch.cat([data.x_train, data.x_test]), torch.cat([data.y_train, data.y_test]), strict=True
    )}  # fmt: skip
    assert rows == {"short": 0, "a line lon": 0, "two lines": 1, "yy": 1}  # cut, stripped, one per record
    assert data.x_train.shape[0] == 2 and data.x_test.shape[0] == 2  # each document's last line held out
    (tmp_path / "c.txt").write_text("nul \0 byte\n")
    with pytest.raises(DataError, match="c.txt holds the pad token id 0"):
        load_textcls(fedge.resolve_config(raw).data, 0)


def test_lines_are_refused_where_nothing_reads_padding(sentences):
    raw = lines_run(sentences, {"name": "splitfed_v2"}, model={"name": "mlp", "options": {}})
    with pytest.raises(ConfigError, match="the model mlp reads no padding") as error:
        build_run(fedge.resolve_config(raw))
    assert error.value.key == "data.sequences" and "\n" not in str(error.value)


def test_the_ledger_counts_real_tokens_only(sentences):
    """SplitFed v2, one round: smashed_up and grad_down = real tokens x hidden x 32 bits, labels one per
    sequence; the padded positions (more than half of them here) are not counted."""
    built, _ = trained(lines_run(sentences, {"name": "splitfed_v2"}), rounds=1)
    data = built.context.data
    x = data.dataset.x_train[np.concatenate([data.client_train[k] for k in range(3)])]
    real = int((x != 0).sum())
    assert real < 0.6 * x.numel()
    totals = {kind: bits for (kind, _), bits in built.context.ledger.totals().items()}
    assert totals["smashed_up"] == totals["grad_down"] == real * 32 * 32
    assert totals["labels_up"] == len(x) * 32


@parametrize_first_by_default("name", ["splitfed_v1", "cse_fsl", "light_fedsl", "fedavg"])
def test_executors_agree_on_padded_sequences(sentences, name):
    algorithm = {"name": name, **({"h": 2} if name == "cse_fsl" else {})}
    executors_agree(lambda engine: lines_run(sentences, algorithm, engine=engine))


def test_light_fedsl_counts_the_kept_entries_of_real_tokens(sentences):
    """One batch of 8 sequences per client per round: without dropout the cut sends their real tokens
    (fewer than the 3 x 8 x SEQ positions), with p = 0.5 about half of those entries."""
    up = {}
    for p in (0.0, 0.5):
        built, _ = trained(lines_run(sentences, {"name": "light_fedsl", "cut_dropout": p}), rounds=1)
        up[p] = {kind: bits for (kind, _), bits in built.context.ledger.totals().items()}["smashed_up"]
    assert up[0.0] % (32 * 32) == 0 and up[0.0] < 3 * 8 * SEQ * 32 * 32
    assert 0.4 < up[0.5] / up[0.0] < 0.6


def test_from_the_cli_a_run_and_a_pad_byte_in_the_data(sentences, tmp_path):
    path = tmp_path / "lines.json"
    result = cli_run(lines_run(sentences, {"name": "splitfed_v2"}, output={"dir": str(tmp_path / "r")}), path)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r" / "splitfed_v2-textcls" / "summary.json").read_text())
    assert 0.0 <= summary["final_accuracy"] <= 1.0
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.txt").write_text("fine\n")
    (bad / "b.txt").write_text("a \0 inside\n")
    result = cli_run(lines_run(bad, {"name": "splitfed_v2"}, output={"dir": str(tmp_path / "s")}), path)
    assert result.exit_code == 2
    assert "b.txt holds the pad token id 0" in result.output and not (tmp_path / "s").exists()


def test_a_hugging_face_tokenizer_frames_each_line_with_its_special_tokens(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cut", "layer", "client", "server"]
    folder = tmp_path / "tokenizer"
    transformers.BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(folder)
    (tmp_path / "pos.txt").write_text("the cut\nthe cut layer client server the cut\n")
    (tmp_path / "neg.txt").write_text("server\nclient client\n")
    data_cfg = {"name": "textcls", "root": str(tmp_path), "seq_len": 6, "sequences": "lines",
                "tokenizer": str(folder)}  # fmt: skip
    data = load_textcls(fedge.resolve_config({"data": data_cfg}).data, 0)
    assert data.pad_id == 0
    rows = {tuple(r.tolist()) for r in torch.cat([data.x_train, data.x_test])}
    assert rows == {
        (2, 5, 6, 3, 0, 0),  # [CLS] the cut [SEP], padded
        (2, 5, 6, 7, 8, 3),  # the long line truncated inside [CLS] ... [SEP]
        (2, 9, 3, 0, 0, 0),
        (2, 8, 8, 3, 0, 0),
    }


def test_windows_are_framed_by_the_tokenizers_special_tokens(tmp_path):
    """A Hugging Face BERT tokenizer frames each window as ``[CLS] window [SEP]`` (seq_len in all, as a
    pretrained pooler reads a sample); a seq_len with no room for text is refused in one line."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cut", "layer", "client", "server"]
    folder = tmp_path / "tokenizer"
    transformers.BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(folder)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "pos.txt").write_text("the cut layer client server the cut layer")
    (corpus / "neg.txt").write_text("server client layer cut the")
    data_cfg = {"name": "textcls", "root": str(corpus), "seq_len": 5, "tokenizer": str(folder)}
    data = load_textcls(fedge.resolve_config({"data": data_cfg}).data, 0)
    rows = [tuple(r.tolist()) for r in torch.cat([data.x_train, data.x_test])]
    assert sorted(rows) == sorted([
        (2, 9, 8, 7, 3), (2, 5, 6, 7, 3), (2, 8, 9, 5, 3),  # 3 text tokens each, the tails dropped
    ])  # fmt: skip
    with pytest.raises(ConfigError, match="no room for a text") as error:
        load_textcls(fedge.resolve_config({"data": {**data_cfg, "seq_len": 2}}).data, 0)
    assert error.value.key == "data.seq_len"
