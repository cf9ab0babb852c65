"""Runs on a saved checkpoint (``model.options.pretrained``) through the runner and ``fedge run``: the
memory pre-flight counts the checkpoint from its config (transformers refuses ``from_pretrained`` on the
meta device), the model the run trains is the checkpoint's, and a base too large is refused unread."""

from __future__ import annotations

import json

import pytest
import torch
from llm_cases import bert_run, cli_run, lm_config, write_corpus
from tiers import parametrize_first_by_default

import fedge
from fedge.runner.loop import build_run

transformers = pytest.importorskip("transformers")

SEQ = 16
GPT2 = {"vocab_size": 256, "n_positions": SEQ, "n_embd": 32, "n_layer": 2, "n_head": 2}
LLAMA = {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": SEQ}  # fmt: skip
BERT = {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 2, "max_position_embeddings": SEQ, "num_labels": 3}  # fmt: skip
IDS = {"bos_token_id": 0, "eos_token_id": 0}
CHECKPOINTS = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2, **IDS)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA, **IDS)),
    "bert": lambda: transformers.BertForSequenceClassification(transformers.BertConfig(**BERT)),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A ``save_pretrained`` folder of each architecture, random weights from a fixed seed."""
    folders = {}
    for arch, make in CHECKPOINTS.items():
        torch.manual_seed(7)
        folders[arch] = tmp_path_factory.mktemp(arch)
        make().save_pretrained(folders[arch])
    return folders


def pretrained_run(corpus, folder, arch: str, lora_rank: int, **overrides) -> dict:
    """A tiny run of ``arch`` loaded from ``folder``, LoRA (``lora_rank`` > 0) or every weight trained."""
    options = {"pretrained": str(folder), "lora_rank": lora_rank}
    if arch == "bert":
        raw = bert_run(corpus, {"name": "fedavg"}, **overrides)
    else:
        raw = lm_config(corpus, {"name": "fedavg"}, arch=arch, **overrides)
    raw["model"] = {"name": "llama" if arch == "llama" else arch, "cut": 1, "options": options}
    return raw


@pytest.mark.parametrize("lora_rank", [4, 0], ids=["lora", "full"])
@parametrize_first_by_default("arch", list(CHECKPOINTS))
def test_a_run_on_a_saved_checkpoint_trains_transformers_own_model(corpus, saved, arch, lora_rank):
    """The runner (its memory pre-flight included) builds the checkpoint's model: its logits are those of
    transformers' model loaded from the folder (adapters start at zero; a fully trained head is a copy)."""
    built = build_run(fedge.resolve_config(pretrained_run(corpus, saved[arch], arch, lora_rank)))
    model = built.context.build_model().eval()
    reference = type(CHECKPOINTS[arch]()).from_pretrained(saved[arch]).eval()
    ids = torch.randint(1, 256, (3, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mine, theirs = model(ids), reference(ids).logits
    expected = theirs if arch == "bert" else theirs.transpose(1, 2)
    torch.testing.assert_close(mine, expected, rtol=1e-5, atol=1e-5)
    trained = sum(p.numel() for p in model.parameters())
    assert (trained < sum(p.numel() for p in reference.parameters())) == bool(lora_rank)


@parametrize_first_by_default(("arch", "lora_rank"), [("gpt2", 4), ("llama", 0), ("bert", 4), ("bert", 0)])
def test_fedge_run_on_a_saved_checkpoint_finishes(corpus, saved, tmp_path, arch, lora_rank):
    raw = pretrained_run(corpus, saved[arch], arch, lora_rank, rounds=1, output={"dir": str(tmp_path)})
    result = cli_run(raw, tmp_path / "run.json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in next(tmp_path.glob("*/metrics.jsonl")).read_text().splitlines()]
    assert rows[-1]["round"] == 1 and rows[-1]["train_loss"] > 0


def test_a_checkpoint_too_large_is_refused_from_its_config_alone(corpus, tmp_path):
    """A GPT-2 config of 4 x 65,536-wide layers (about 2e11 values) and no weights at all: the pre-flight
    refuses it in one line naming the model, without reading a weight (there are none to read)."""
    folder = tmp_path / "huge"
    transformers.GPT2Config(**{**GPT2, "n_embd": 65536, "n_layer": 4, "n_head": 64}).save_pretrained(folder)
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    raw = pretrained_run(corpus, folder, "gpt2", 4, output={"dir": str(tmp_path / "runs")})
    result = cli_run(raw, tmp_path / "run.json")
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "\n" not in message and message.startswith("error: model:"), message
    assert "frozen base" in message and "memory" in message
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("arch", list(CHECKPOINTS))
def test_the_preflight_counts_what_the_checkpoint_loads(corpus, saved, arch):
    """The pre-flight's count from the config alone (meta device) is the loaded model's count."""
    from fedge.models import build_model
    from fedge.models.transformer import frozen_values
    from fedge.runner.preflight import _model_values

    config = fedge.resolve_config(pretrained_run(corpus, saved[arch], arch, 4))
    classes = 3 if arch == "bert" else 256
    counted = _model_values(config, (SEQ,), classes)
    loaded = build_model(config.model.name, (SEQ,), classes, **config.model.options)
    values = sum(t.numel() for t in (*loaded.parameters(), *loaded.buffers()))
    assert counted == (values, frozen_values(loaded)) and counted[1] > 0
