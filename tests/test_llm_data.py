"""Text data for language models: byte tokens, packing with every token predicted once, a held-out tail
per document, and the real file formats (plain text, JSONL, LEAF Shakespeare json)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from llm_cases import write_corpus

from fedge.config import DataConfig
from fedge.data.partition import partition_labels
from fedge.data.sources import load_dataset
from fedge.data.sources.text import pack
from fedge.data.tokenizer import ByteTokenizer
from fedge.errors import ConfigError, DataError


def test_bytes_are_tokens_and_round_trip():
    tokens = ByteTokenizer().encode("héllo")
    assert tokens.dtype == np.int64 and list(tokens[:2]) == [104, 195]
    assert ByteTokenizer().decode(tokens) == "héllo"


def test_packing_predicts_every_token_once():
    windows = pack(np.arange(23), 5)
    assert windows.shape == (4, 6)
    inputs, targets = windows[:, :-1], windows[:, 1:]
    assert list(targets.reshape(-1)) == list(range(1, 21))  # each token after the first is a target once
    assert list(inputs.reshape(-1)) == list(range(20))


def test_text_files_one_group_per_file_with_a_held_out_tail(tmp_path):
    root = write_corpus(tmp_path / "corpus")
    data = load_dataset(DataConfig(name="text", root=root, seq_len=16, test_fraction=0.25), 0)
    assert data.x_train.dtype == torch.int64 and data.input_shape == (16,) and data.num_classes == 256
    assert torch.equal(data.x_train[:, 1:], data.y_train[:, :-1])
    assert sorted(set(data.train_groups)) == sorted(set(data.test_groups)) == [0, 1, 2]
    text = (root / "doc0.txt").read_bytes()
    windows = (len(text) - 1) // 16
    test = round(0.25 * windows)
    assert (data.train_groups == 0).sum() == windows - test and (data.test_groups == 0).sum() == test
    tail = torch.tensor(list(text[(windows - test) * 16 : windows * 16 + 1]))
    held = torch.cat(
        [data.x_test[data.test_groups == 0].reshape(-1), data.y_test[data.test_groups == 0][-1, -1:]]
    )
    assert torch.equal(held, tail)  # the document's last windows, in order
    jsonl = [json.loads(line)["text"] for line in (root / "doc2.jsonl").read_text().splitlines()]
    first = data.x_train[data.train_groups == 2][0]
    assert bytes(first.tolist()).decode() == "\n".join(jsonl)[:16]
    assert partition_labels(data.y_train.numpy()).shape == (data.num_train,)


def test_the_embedded_corpus_is_the_standard_library():
    data = load_dataset(DataConfig(name="pystdlib", seq_len=32, text_bytes=2048), 0)
    assert len(set(data.train_groups)) >= 40
    assert bytes(data.x_train[0].tolist()).decode("utf-8", "replace").strip()


def test_leaf_shakespeare_json_groups_by_role(tmp_path):
    line = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to su"
    assert len(line) == 80
    for split, roles in (("train", ("HAMLET", "OPHELIA")), ("test", ("HAMLET",))):
        (tmp_path / split).mkdir()
        users = {r: {"x": [line, line[1:] + "f"], "y": ["f", "f"]} for r in roles}
        (tmp_path / split / "all_data.json").write_text(
            json.dumps({"users": list(roles), "user_data": users})
        )
    data = load_dataset(DataConfig(name="shakespeare", root=tmp_path, seq_len=80), 0)
    assert data.x_train.shape == (4, 80) and list(data.train_groups) == [0, 0, 1, 1]
    assert bytes(data.y_train[0, -1:].tolist()) == b"f" and bytes(data.x_train[0].tolist()).decode() == line


def test_bad_text_input_is_one_line(tmp_path):
    with pytest.raises(DataError, match="data.root"):
        load_dataset(DataConfig(name="text"), 0)
    (tmp_path / "a.jsonl").write_text('{"body": 1}\n')
    with pytest.raises(DataError, match=r"a.jsonl:1: .*'text' field"):
        load_dataset(DataConfig(name="text", root=tmp_path), 0)
    (tmp_path / "a.jsonl").write_text('{"text": "short"}\n')
    with pytest.raises(DataError, match="fewer than 65 tokens"):
        load_dataset(DataConfig(name="text", root=tmp_path), 0)


def test_a_hugging_face_tokenizer_folder_gives_its_ids_and_vocabulary(tmp_path):
    """data.tokenizer: a tokenizer folder (as save_pretrained writes it; a hub name reads the cache)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet)
    bpe.train_from_iterator(["the cut layer client server token " * 50], trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(tmp_path / "tok")
    root = write_corpus(tmp_path / "corpus")
    cfg = DataConfig(name="text", root=root, seq_len=8, tokenizer=str(tmp_path / "tok"))
    data = load_dataset(cfg, 0)
    assert data.num_classes == len(transformers.AutoTokenizer.from_pretrained(tmp_path / "tok"))
    assert data.x_train.shape[1] == 8 and int(data.x_train.max()) < data.num_classes
    in_bytes = load_dataset(DataConfig(name="text", root=root, seq_len=8), 0)
    assert len(data.x_train) < len(in_bytes.x_train)  # merged tokens: fewer windows than with bytes
    with pytest.raises(ConfigError, match="data.download: true") as error:
        load_dataset(DataConfig(name="text", root=root, tokenizer=str(tmp_path / "missing")), 0)
    assert error.value.key == "data.tokenizer"
