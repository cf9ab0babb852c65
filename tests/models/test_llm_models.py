"""Transformer LMs as split models: faithful to transformers' own forward, LoRA over a frozen base held
once, and one-line errors for what cannot be built."""

from __future__ import annotations

import json

import pytest
import torch
from torch.func import functional_call, vmap

transformers = pytest.importorskip("transformers")

from fedge.engine import buffers_of, parameters_of  # noqa: E402
from fedge.errors import ConfigError  # noqa: E402
from fedge.models import build_model, model_cut_points, split  # noqa: E402
from fedge.models.lora import LoRALinear  # noqa: E402
from fedge.models.transformer import TransformerLM, causal_attention, check_trained_sides, hf_config  # noqa: E402

TINY = {"layers": 2, "hidden": 32, "heads": 4}
LLAMA = {**TINY, "kv_heads": 2, "intermediate": 48}


def tiny(name: str, seed: int = 0, **options) -> TransformerLM:
    torch.manual_seed(seed)
    return build_model(name, (16,), 64, **{**(LLAMA if name == "llama" else TINY), **options})


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_split_blocks_compute_what_transformers_computes(name):
    """Blocks cut anywhere compose to the transformers model's own logits (its sdpa attention and mask),
    drawn from the same seed and config."""
    ours = tiny(name, lora_rank=0)
    sizes = LLAMA if name == "llama" else TINY
    config = hf_config(name, 64, 16, sizes["layers"], sizes["hidden"], sizes["heads"],
                       sizes.get("kv_heads"), sizes.get("intermediate"))  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    x = torch.randint(0, 64, (3, 16))
    expected = reference(x).logits.transpose(1, 2)
    torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)
    for cut in ours.cut_points:
        client, server = split(ours, cut)
        torch.testing.assert_close(server(client(x)), expected, rtol=1e-5, atol=1e-5)


def test_lora_holds_the_base_once_and_trains_only_adapters():
    model = tiny("gpt2", lora_rank=4)
    params = parameters_of(model)
    assert set(params) == {f"block{i}.layer.attn.c_attn.lora_{m}" for i in (1, 2) for m in "AB"}
    assert buffers_of(model) == {}
    frozen = sum(t.numel() for t in model.frozen_tensors())
    assert frozen > 20 * sum(t.numel() for t in params.values())
    full = tiny("gpt2", lora_rank=0)  # the same base with the head untied: its weights all trained
    assert sum(t.numel() for t in parameters_of(full).values()) == frozen + 64 * 32  # LoRA: tied, once
    x = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(model(x), full(x))  # B = 0: LoRA starts at the base model
    moved = model.to(torch.float64)
    assert all(t.dtype == torch.float64 for t in moved.frozen_tensors())
    llama = tiny("llama", lora_rank=0).to(torch.float64)  # the shared rotary table moves with the blocks
    assert llama[0].positions.rotary.inv_freq.dtype == torch.float64
    assert llama(torch.randint(0, 64, (2, 16))).dtype == torch.float64


def test_stacked_adapters_under_vmap_equal_each_client_with_the_shared_base():
    model = tiny("llama", lora_rank=4)
    lora = next(m for m in model.modules() if isinstance(m, LoRALinear))
    clients = []
    for seed in (1, 2, 3):
        g = torch.Generator().manual_seed(seed)
        clients.append({k: torch.randn(p.shape, generator=g) * 0.1 for k, p in parameters_of(model).items()})
    stacked = {k: torch.stack([c[k] for c in clients]) for k in clients[0]}
    x = torch.randint(0, 64, (3, 2, 16))
    batched = vmap(lambda p, xs: functional_call(model, p, (xs,)))(stacked, x)
    for i, state in enumerate(clients):
        torch.testing.assert_close(batched[i], functional_call(model, state, (x[i],)), rtol=1e-5, atol=1e-5)
    assert lora.weight.dim() == 2  # the base stayed one unstacked tensor


def test_causal_attention_matches_sdpa_with_grouped_heads():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 5, 8, generator=g) for h in (4, 2, 2))
    out, _ = causal_attention(None, q, k, v, None, scaling=0.3)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.3
    )
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_cut_points_are_the_decoder_blocks():
    assert model_cut_points("gpt2", (16,), 10) == [(1, "block1"), (2, "block2")]
    assert [c for c, _ in model_cut_points("llama", (16,), 10)] == [1, 2]
    with pytest.raises(ConfigError, match=r"valid cuts are 1\.\.2 for gpt2"):
        split(tiny("gpt2"), 3)
    with pytest.raises(ConfigError, match="server side of this cut has no adapters") as error:
        check_trained_sides(*split(tiny("gpt2"), 2))  # LoRA on attention: the head has none
    assert error.value.key == "model.cut"


def test_errors_name_their_key(tmp_path):
    with pytest.raises(ConfigError, match="longer than the model's 8 positions") as error:
        tiny("gpt2", positions=8)
    assert error.value.key == "data.seq_len"
    with pytest.raises(ConfigError) as error:
        tiny("gpt2", lora_targets=("nothing",))
    assert error.value.key == "model.options.lora_targets"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 64}))
    with pytest.raises(ConfigError, match="unknown architecture 'bert'") as error:
        tiny("gpt2", pretrained=str(tmp_path))
    assert error.value.key == "model.options.pretrained"
    with pytest.raises(ConfigError, match="download: true") as error:
        tiny("gpt2", pretrained=str(tmp_path / "missing"))
    with pytest.raises(ConfigError) as error:
        build_model("gpt2", (1, 8, 8), 10)
    assert error.value.key == "model.name"


def test_a_saved_checkpoint_loads_as_pretrained(tmp_path):
    """The pretrained path (here a local folder; a hub name downloads only with download: true). GPT-2's
    ``gelu_new`` runs as the one fused kernel of the same formula."""
    torch.manual_seed(1)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    assert config.activation_function == "gelu_new"
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    model = tiny("gpt2", pretrained=str(tmp_path))
    assert {type(m).__name__ for m in model.modules()} >= {"GELUTanh"}
    saved = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    x = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(model(x), saved(x).logits.transpose(1, 2), rtol=1e-5, atol=1e-5)
