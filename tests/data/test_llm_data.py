"""Text data for language models: byte tokens, packing with every token predicted once, a held-out tail
per document, and the real file formats (plain text, JSONL, LEAF Shakespeare json)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from llm_cases import write_corpus

import fedge
from fedge.config import DataConfig
from fedge.data.partition import partition_labels
from fedge.data.sources import gutenberg, load_dataset
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


EDITION = """The Project Gutenberg Etext of Shakespeare's First Folio

1603

THE TRAGEDY OF HAMLET, PRINCE OF DENMARK

by William Shakespeare

Dramatis Personae

  Claudius, King of Denmark.

ACT I. SCENE I.
Elsinore. A platform before the Castle.

Enter two Sentinels-[first,] Francisco, [who paces up and down

  Ber. Who's there?
  Fran. Nay, answer me. Stand and unfold yourself, for I would know the name
    of him that comes so late and so unbidden to the watch tonight. The night is cold
    and the air bites shrewdly; it is very cold, and I am sick at heart, for the
    bell then beating one has struck, and the star that is westward from the pole
    had made his course to illume that part of heaven where now it burns. Who goes
    there, I say again, and what is your business on this platform at this hour,
    when honest men are in their beds and only ghosts and sentinels walk abroad?
    Speak, or I will call the officers of the guard and have you taken at once,
    for I am charged to let no stranger pass before the morning comes, and so
    to the watch tonight.
  Ber. Long live the King!

<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM SHAKESPEARE IS COPYRIGHT>>

1593

THE COMEDY OF ERRORS

by William Shakespeare

ACT I. SCENE I.

Duke. Merchant of Syracusa, plead no more; I am not partial to infringe our laws;
the enmity and discord which of late sprung from the rancorous outrage of your duke.
ACT I. SCENE II.

Aegeon. Proceed, Solinus, to procure my fall, and by the doom of death end woes and all.
"""


def test_leaf_json_is_built_from_gutenbergs_edition_as_leaf_reads_it(tmp_path):
    """Roles per (work, speaker) with indented speeches and their continuations (and a work read flush
    left), 80-character windows with the next character, LEAF's 80/20 split by sample with no window
    shared between train and test; the reader then takes the json as LEAF's."""
    roles = gutenberg.roles(EDITION)
    assert set(roles) == {
        "THE_TRAGEDY_OF_HAMLET,_PRINCE_OF_DENMARK_Ber",
        "THE_TRAGEDY_OF_HAMLET,_PRINCE_OF_DENMARK_Fran",
        "THE_COMEDY_OF_ERRORS_Duke",
        "THE_COMEDY_OF_ERRORS_Aegeon",
    }
    assert roles["THE_TRAGEDY_OF_HAMLET,_PRINCE_OF_DENMARK_Ber"] == "Who's there? Long live the King!"
    fran = roles["THE_TRAGEDY_OF_HAMLET,_PRINCE_OF_DENMARK_Fran"]
    assert fran.startswith("Nay, answer me.") and fran.endswith("to the watch tonight.") and "  " not in fran
    assert roles["THE_COMEDY_OF_ERRORS_Duke"].endswith("of your duke.")  # the heading closed the speech
    (tmp_path / gutenberg.RAW_NAME).write_text(EDITION)
    data = load_dataset(DataConfig(name="shakespeare", root=tmp_path, seq_len=80), 0)
    train = json.loads((tmp_path / "train" / "all_data_train.json").read_text())
    test = json.loads((tmp_path / "test" / "all_data_test.json").read_text())
    assert train["users"] == [  # Ber's 32 characters and Aegeon's 80 hold no window of 80 and the next
        "THE_TRAGEDY_OF_HAMLET,_PRINCE_OF_DENMARK_Fran",
        "THE_COMEDY_OF_ERRORS_Duke",
    ]
    count = len(fran) - 80
    kept = int(0.8 * count)
    record = train["user_data"]["THE_TRAGEDY_OF_HAMLET,_PRINCE_OF_DENMARK_Fran"]
    assert record["x"][0] == fran[:80] and record["y"][0] == fran[80] and len(record["x"]) == kept
    held = test["user_data"]["THE_TRAGEDY_OF_HAMLET,_PRINCE_OF_DENMARK_Fran"]
    assert held["x"][0] == fran[kept + 80 : kept + 160] and len(held["x"]) == count - kept - 80
    assert train["num_samples"] == [len(train["user_data"][u]["x"]) for u in train["users"]]
    assert data.x_train.shape == (sum(train["num_samples"]), 80)
    assert fran[:80] in {bytes(row.tolist()).decode() for row in data.x_train}
    assert len(set(data.train_groups)) == 2


def test_shakespeare_downloads_gutenbergs_edition_only_when_asked(tmp_path, monkeypatch):
    bundle = tmp_path / "edition.zip"
    with zipfile.ZipFile(bundle, "w") as z:
        z.writestr("100.txt", EDITION)
    monkeypatch.setattr(gutenberg, "URLS", (bundle.as_uri(),))
    folder = tmp_path / "cache"
    with pytest.raises(DataError, match="data.download=true"):
        load_dataset(DataConfig(name="shakespeare", root=folder, seq_len=40), 0)
    data = load_dataset(DataConfig(name="shakespeare", root=folder, seq_len=40, download=True), 0)
    assert len(set(data.train_groups)) == 2 and data.x_train.shape[1] == 40
    assert sorted(p.name for p in folder.iterdir()) == ["100.txt", "test", "train"]  # the zip is gone
    shutil.rmtree(folder / "train")  # a conversion stopped before train/: rebuilt from the 100.txt kept
    bundle.unlink()
    rebuilt = load_dataset(DataConfig(name="shakespeare", root=folder, seq_len=40, download=True), 0)
    assert torch.equal(rebuilt.x_train, data.x_train) and torch.equal(rebuilt.y_test, data.y_test)


@pytest.mark.ci
def test_the_shakespeare_example_runs_its_first_round_on_gutenbergs_layout(tmp_path):
    """``examples/llm-shakespeare.yaml`` validates and runs a round on a generated ``100.txt`` in
    data.root (two roles with samples here, so two clients, both in the round)."""
    (tmp_path / gutenberg.RAW_NAME).write_text(EDITION)
    overrides = [f"data.root={tmp_path}", "data.download=false", "partition.num_clients=2", "rounds=1",
                 "algorithm.clients_per_round=2", "algorithm.local_steps=2", "eval.every=1",
                 f"output.dir={tmp_path / 'runs'}", "output.plots=false"]  # fmt: skip
    result = fedge.run(str(Path(__file__).parents[2] / "examples" / "llm-shakespeare.yaml"), overrides)
    row = result.metrics[-1]
    assert row["round"] == 1 and np.isfinite(row["train_loss"]) and row["perplexity"] > 1.0
    assert result.summary["bits_up"] > 0


def test_a_tokenizer_json_without_added_tokens_is_one_line(tmp_path):
    """transformers reads ``added_tokens`` unguarded: a ``tokenizer.json`` without it raised a KeyError."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(tmp_path / "tok")
    spec = tmp_path / "tok" / "tokenizer.json"
    spec.write_text(
        json.dumps({k: v for k, v in json.loads(spec.read_text()).items() if k != "added_tokens"})
    )
    root = write_corpus(tmp_path / "corpus")
    with pytest.raises(ConfigError, match=r"cannot load .*tok.*added_tokens") as error:
        load_dataset(DataConfig(name="text", root=root, seq_len=8, tokenizer=str(tmp_path / "tok")), 0)
    assert error.value.key == "data.tokenizer" and "\n" not in str(error.value)
