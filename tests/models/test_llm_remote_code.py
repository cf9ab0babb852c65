"""A model or tokenizer folder whose config names code of its own (an ``auto_map``) is refused in one
line before transformers reads it, whatever standard input answers, unless the run allows remote code."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from llm_cases import cli_run, lm_config, write_corpus
from typer.testing import CliRunner

from fedge.cli.commands import app
from fedge.models.transformer import ARCHITECTURES, pretrained_config

transformers = pytest.importorskip("transformers")

AUTO_MAP = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel",
            "AutoTokenizer": ["evil.EvilTokenizer", None]}  # fmt: skip


def evil_folder(folder, marker, config_file: str = "config.json"):
    """A GPT-2 folder whose ``config_file`` names classes transformers lacks and maps them to ``evil.py``,
    which writes ``marker`` when it is imported (transformers asks on standard input whether to run it)."""
    folder.mkdir()
    transformers.GPT2Config(vocab_size=256, n_positions=16, n_embd=32, n_layer=2, n_head=2).save_pretrained(
        folder
    )
    target = folder / config_file
    content = json.loads(target.read_text()) if target.is_file() else {}
    own = {"model_type": "evil"} if config_file == "config.json" else {"tokenizer_class": "EvilTokenizer"}
    target.write_text(json.dumps({**content, **own, "auto_map": AUTO_MAP}))  # classes transformers lacks
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return folder


def run_with_stdin(raw, path, answer: str):
    path.write_text(json.dumps(raw))
    return CliRunner().invoke(app, ["run", str(path)], input=answer)


@pytest.mark.parametrize("answer", ["y\n", "yes\n", ""])
def test_a_model_folder_with_code_of_its_own_is_refused_whatever_stdin_says(tmp_path, answer):
    marker = tmp_path / "ran"
    folder = evil_folder(tmp_path / "model", marker)
    raw = lm_config(
        write_corpus(tmp_path / "corpus"), {"name": "fedavg"}, output={"dir": str(tmp_path / "runs")}
    )
    raw["model"]["options"] = {"pretrained": str(folder), "lora_rank": 4}
    result = run_with_stdin(raw, tmp_path / "run.json", answer)
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "\n" not in message, message
    assert message.startswith("error: model.options.pretrained:") and "config.json has an auto_map" in message
    assert "model.options.trust_remote_code" in message
    assert not marker.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("config_file", ["tokenizer_config.json", "config.json"])
def test_a_tokenizer_folder_with_code_of_its_own_is_refused(tmp_path, config_file):
    marker = tmp_path / "ran"
    folder = evil_folder(tmp_path / "tok", marker, config_file)
    corpus = write_corpus(tmp_path / "corpus")
    raw = lm_config(
        corpus, {"name": "fedavg"}, data={"tokenizer": str(folder)}, output={"dir": str(tmp_path)}
    )
    result = run_with_stdin(raw, tmp_path / "run.json", "y\n")
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "\n" not in message and message.startswith("error: data.tokenizer:"), message
    assert f"{config_file} has an auto_map" in message and not marker.exists()


def test_trust_remote_code_passes_through_to_transformers(tmp_path):
    """``model.options.trust_remote_code: true`` lifts the refusal and lets transformers decide; without it
    every load says ``trust_remote_code=False``."""
    folder = tmp_path / "model"
    transformers.GPT2Config(n_layer=1).save_pretrained(folder)
    content = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**content, "auto_map": AUTO_MAP}))
    real = transformers.AutoConfig.from_pretrained
    with mock.patch.object(transformers.AutoConfig, "from_pretrained") as load:
        load.side_effect = lambda name, **kwargs: real(name, **{**kwargs, "trust_remote_code": False})
        pretrained_config(str(folder), False, ARCHITECTURES, trust=True)
        assert load.call_args.kwargs["trust_remote_code"] is True
    plain = tmp_path / "plain"
    transformers.GPT2Config(n_layer=1).save_pretrained(plain)
    with mock.patch.object(transformers.AutoConfig, "from_pretrained", side_effect=real) as load:
        pretrained_config(str(plain), False, ARCHITECTURES)
        assert load.call_args.kwargs["trust_remote_code"] is False


def test_trust_remote_code_is_a_model_option(tmp_path):
    """The model registry accepts the option (a run with it set finishes)."""
    raw = lm_config(write_corpus(tmp_path / "corpus"), {"name": "fedavg"}, output={"dir": str(tmp_path)})
    raw["model"]["options"]["trust_remote_code"] = True
    result = cli_run({**raw, "rounds": 1}, tmp_path / "run.json")
    assert result.exit_code == 0, result.output
