"""Hugging Face causal language models as split models, fine-tuned with LoRA or in full.

A decoder-only transformer becomes a :class:`~fedge.models.SplitModel` of ``N + 1`` blocks: ``block1``
holds the token (and, for GPT-2, position) embeddings and decoder layer 1, ``block2`` .. ``blockN`` the
other decoder layers, ``head`` the final norm and the language-model head. A cut ``k`` (1..N) gives the
client the embeddings and decoder layers 1..k, the server the rest and the head; the smashed data are the
hidden states ``[batch, sequence, hidden]`` after layer k.

The model reads token ids ``[batch, sequence]`` and returns logits ``[batch, vocabulary, sequence]``
(the class dimension second, as ``torch.nn.functional.cross_entropy`` takes it), so fedge's per-sample
cross-entropy is every token's loss and its mean over a sequence is the sample's loss
(:func:`~fedge.engine.cross_entropy`). Attention is causal, with no attention mask: packed text has no
padding, and a right-padded sequence (``data.sequences: lines``; the run sets ``pad_id`` from the data)
needs none, since no real token attends to a later position. Its pad positions, whose targets are
ignored, leave every block as the zero vector: that is how they cross the cut, never sent, as a BERT
encoder's do (:mod:`fedge.models.encoder`). Dropout inside the transformer is off (LoRA's own
``lora_dropout`` is the random layer).

Architectures: GPT-2 (``gpt2``) and the LLaMA family (``llama``, ``qwen2``, ``mistral``: RMSNorm,
rotary positions, grouped-query attention). A model is built from a config (random initial weights
from the run's seed, any size) or, with ``pretrained``, from a checkpoint: a local folder, or a hub
name that is downloaded only with ``download: true``.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal, get_type_hints

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt
from torch import nn

from fedge.errors import ConfigError
from fedge.files.remote_code import refuse_loaded, refuse_local
from fedge.models.base import SplitModel
from fedge.models.layers import Probability
from fedge.models.lora import FoldsClients, add_adapters, freeze

LLAMA_FAMILY = ("llama", "qwen2", "mistral")
ARCHITECTURES = ("gpt2", *LLAMA_FAMILY)
LANGUAGE_MODELS = ("gpt2", "llama")  # the model registry's names of these builders
# LoRA's usual attention targets per architecture (peft's defaults)
ATTENTION = {"gpt2": ("c_attn",), **{arch: ("q_proj", "v_proj") for arch in LLAMA_FAMILY}}
NonNegative = Annotated[int, Field(ge=0)]
TRUST_HINT = " (model.options.trust_remote_code: true allows it)"
_SIZES_ONLY = contextvars.ContextVar("fedge_sizes_only", default=False)


@contextlib.contextmanager
def sizes_only() -> Iterator[None]:
    """Within it, a pretrained model is built from its checkpoint's config alone, its weights not read:
    what the memory pre-flight counts on the meta device (transformers refuses ``from_pretrained`` there),
    with the parameters, buffers and adapters the loaded model has."""
    token = _SIZES_ONLY.set(True)
    try:
        yield
    finally:
        _SIZES_ONLY.reset(token)


def from_checkpoint(
    auto: Any, pretrained: str, config: Any, download: bool, trust: bool, **kwargs: Any
) -> Any:
    """``auto.from_pretrained`` of the checkpoint, or (within :func:`sizes_only`) ``auto.from_config`` of
    its ``config``, no weights read."""
    if _SIZES_ONLY.get():
        return auto.from_config(config, trust_remote_code=trust, **kwargs)
    return auto.from_pretrained(
        pretrained, config=config, local_files_only=not download, trust_remote_code=trust, **kwargs
    )


ATTENTION_NAME = "fedge_causal"


def causal_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal softmax attention written with plain tensor operations (a transformers attention function).

    ``scaled_dot_product_attention`` has no batching rule on the CPU: under ``vmap`` over clients it runs
    client after client. Spelled out (scores, causal mask, softmax, weighted values) it batches over
    clients as every other product does, with the same result up to rounding. Key/value heads are
    repeated for grouped-query attention; packed sequences carry no padding mask.
    """
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    if not torch._C._functorch.is_functorch_wrapped_tensor(query):  # plain tensors: PyTorch's fused kernel
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=query.shape[-3] != key.shape[-3]
        )
        return out.transpose(-3, -2).contiguous(), None
    groups = query.shape[-3] // key.shape[-3]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    scores = (query @ key.transpose(-1, -2)) * scale
    rows, cols = scores.shape[-2:]
    future = torch.ones(rows, cols, dtype=torch.bool, device=scores.device).triu(cols - rows + 1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1, dtype=torch.float32)
    return (weights.to(query.dtype) @ value).transpose(-3, -2).contiguous(), None


def _register_attention(transformers: Any) -> None:
    """Make :func:`causal_attention` known to transformers under :data:`ATTENTION_NAME`."""
    transformers.AttentionInterface.register(ATTENTION_NAME, causal_attention)


def _output(value: Any) -> torch.Tensor:
    """A decoder layer's hidden states (older transformers return a tuple)."""
    return value[0] if isinstance(value, tuple) else value


class _Positions(nn.Module):
    """Rotary position embeddings (cos, sin) of positions ``0..T-1``, shared by the LLaMA blocks."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        self.rotary = rotary

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(hidden.shape[-2], device=hidden.device)[None]
        return self.rotary(hidden, positions)


def real_positions(hidden: torch.Tensor) -> torch.Tensor:
    """True where a hidden state ``[..., sequence, hidden]`` is a real token, not the zero vector of a pad
    position (a real token's hidden state is a norm's or a residual sum's output, never exactly zero)."""
    return hidden.ne(0).any(dim=-1)


def real_tokens(block: nn.Module, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """A block's real positions: ids other than its ``pad_id`` in the first block (``x`` ids), nonzero
    hidden states after it. On the meta device of the shape check, where the frozen base keeps its own
    device, every position is real (there are no values to read)."""
    if not hasattr(block, "embed"):
        return real_positions(x)
    real = x.long().ne(block.pad_id)
    if real.device != hidden.device:
        return torch.ones(real.shape, dtype=torch.bool, device=hidden.device)
    return real


class DecoderBlock(FoldsClients, nn.Module):
    """One decoder layer, preceded in the first block by the embeddings. With a ``pad_id`` (right-padded
    sequences), pad positions leave the block as zero vectors (module docstring)."""

    def __init__(
        self, layer: nn.Module, embed: nn.Module | None, positions: _Positions | None, pad_id: int | None
    ):
        super().__init__()
        if embed is not None:
            self.embed = embed
        self.layer = layer
        self.pad_id = pad_id
        object.__setattr__(self, "positions", positions)  # shared, not a child: its tensors are frozen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x) if hasattr(self, "embed") else x
        if self.positions is None:
            out = _output(self.layer(hidden))
        else:
            out = _output(self.layer(hidden, position_embeddings=self.positions(hidden)))
        if self.pad_id is None:
            return out
        return out * real_tokens(self, x, out)[..., None].to(out.dtype)


class GPT2Embedding(nn.Module):
    """GPT-2's token plus learned position embeddings."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Embedding):
        super().__init__()
        self.wte, self.wpe = tokens, positions

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        return self.wte(ids) + self.wpe(torch.arange(ids.shape[-1], device=ids.device))


class TokenEmbedding(nn.Module):
    """Token embeddings alone (the LLaMA family: positions enter in attention)."""

    def __init__(self, tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = tokens

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids.long())


class LMHead(FoldsClients, nn.Module):
    """The final norm and the language-model head; logits with the vocabulary second."""

    def __init__(self, norm: nn.Module, head: nn.Module):
        super().__init__()
        self.norm, self.lm_head = norm, head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).transpose(-1, -2)


class TokenHead(nn.Module):
    """CSE-FSL's auxiliary head for a language model: per-token logits from the cut's hidden states
    ``[sequence, hidden]`` (one Linear, or Linear-ReLU-Linear with ``hidden``), vocabulary second."""

    def __init__(self, width: int, vocab: int, hidden: int | None = None):
        super().__init__()
        if hidden is None:
            self.linear = nn.Linear(width, vocab)
        else:
            self.linear = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, vocab))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden).transpose(-1, -2)


def token_aux_head(kind: str, smashed_shape: tuple[int, ...], vocab: int, hidden: int | None) -> TokenHead:
    """The aux head ``model.aux`` names, on a transformer's hidden states (``linear`` or ``mlp``)."""
    if kind not in ("linear", "mlp"):
        raise ConfigError("model.aux.kind", f"a language model's aux head is linear or mlp; got {kind!r}")
    if kind == "mlp" and hidden is None:
        raise ConfigError("model.aux.hidden", "required by the mlp aux head")
    return TokenHead(smashed_shape[-1], vocab, hidden if kind == "mlp" else None)


def check_trained_sides(client: nn.Module, server: nn.Module) -> None:
    """A cut must leave trained tensors on both sides (LoRA targets only in the head's block leave the
    server with none): a one-line error naming ``model.cut``."""
    for side, part in (("client", client), ("server", server)):
        if not any(True for _ in part.parameters()):
            raise ConfigError("model.cut", f"the {side} side of this cut has no adapters to train; move it")


class TransformerLM(SplitModel):
    """A causal LM as blocks (module docstring). Its frozen tensors (the base model under LoRA, and every
    constant buffer) are plain attributes outside the functional state; they follow ``.to()``."""

    classifier = False  # True for a sequence classifier (logits per sequence, not per token)

    def __init__(self, blocks: OrderedDict[str, nn.Module], *, name: str, frozen: list[tuple[nn.Module, str]],
                 positions: int, lora: dict[str, Any] | None, config: Any = None):  # fmt: skip
        super().__init__(blocks, name=name)
        self.frozen = frozen
        self.config = config  # the transformers config the blocks were built from
        self.max_positions = positions
        self.lora = lora

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's signature
        super()._apply(fn, recurse)
        moved: dict[int, torch.Tensor] = {}
        for module, name in self.frozen:
            value = getattr(module, name)
            object.__setattr__(module, name, moved.setdefault(id(value), fn(value)))
        return self

    def frozen_tensors(self) -> list[torch.Tensor]:
        """The frozen tensors, each once (tied weights counted once)."""
        seen: dict[int, torch.Tensor] = {}
        for module, name in self.frozen:
            value = getattr(module, name)
            seen.setdefault(id(value), value)
        return list(seen.values())


def frozen_values(model: nn.Module, part: nn.Module | None = None) -> int:
    """Values of the floating frozen tensors that ``part`` (default: all of ``model``) reads, each once
    (tied weights once): what a device holding that part keeps of the frozen base. 0 for a model that
    holds nothing frozen (any model but a :class:`TransformerLM`)."""
    if not isinstance(model, TransformerLM):
        return 0
    inside = {id(module) for module in (model if part is None else part).modules()}
    seen: dict[int, torch.Tensor] = {}
    for module, name in model.frozen:
        value = getattr(module, name)
        if id(module) in inside and value.is_floating_point():
            seen.setdefault(id(value), value)
    return sum(value.numel() for value in seen.values())


def hf_config(arch: str, vocab: int, positions: int, layers: int, hidden: int, heads: int,
               kv_heads: int | None, intermediate: int | None) -> Any:  # fmt: skip
    """A transformers config of ``arch`` with the given sizes, every dropout off.

    GPT-2 built from sizes uses the exact GELU (``x * Phi(x)``, Hendrycks & Gimpel), the activation the
    GPT papers name, rather than the tanh approximation of it that OpenAI's checkpoints were trained
    with (``gelu_new``): a random-weight model has no trained activation to match, and PyTorch's CPU
    kernel for the exact form is the faster one (on an AVX2 core, 2,048 x 1,536 activations: 2.8 ms
    forward and 3.9 ms backward against 11.3 and 11.2 ms for the tanh form, whose ``tanh`` dominates; a
    W9 round spends 10-15 % of its time there). A pretrained checkpoint keeps its own activation
    (:func:`_fused_activation`)."""
    import transformers

    if arch == "gpt2":
        return transformers.GPT2Config(
            vocab_size=vocab, n_positions=positions, n_embd=hidden, n_layer=layers, n_head=heads,
            n_inner=intermediate, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0,
            eos_token_id=0, activation_function="gelu",
        )  # fmt: skip
    classes = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}
    return getattr(transformers, classes[arch])(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
        max_position_embeddings=positions, attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
        pad_token_id=None, tie_word_embeddings=False,
    )  # fmt: skip


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "model.name", "transformer models need the llm extra: pip install 'fedge[llm]'"
        ) from None
    return transformers


def _hf_model(
    arch: str, spec: dict[str, Any], pretrained: str | None, download: bool, trust: bool
) -> nn.Module:
    """The transformers causal LM, from a checkpoint or from ``spec`` sizes (random weights); ``trust``:
    the checkpoint may run code of its own."""
    transformers = _import_transformers()
    _register_attention(transformers)
    if pretrained is None:
        config = hf_config(arch, **spec)
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION_NAME)
    config = pretrained_config(pretrained, download, ARCHITECTURES, trust)
    for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout"):
        if hasattr(config, key):
            setattr(config, key, 0.0)
    _fused_activation(config)
    auto = transformers.AutoModelForCausalLM
    return from_checkpoint(auto, pretrained, config, download, trust, attn_implementation=ATTENTION_NAME)


def _fused_activation(config: Any) -> None:
    """GPT-2's ``gelu_new`` (its tanh-approximated GELU written as seven element-wise operations) as
    transformers' one fused kernel of the same formula, ``gelu_pytorch_tanh``: the checkpoint's function,
    computed in one pass over the activations instead of seven (they agree to float rounding)."""
    if getattr(config, "activation_function", None) == "gelu_new":
        config.activation_function = "gelu_pytorch_tanh"


def pretrained_config(
    pretrained: str, download: bool, supported: tuple[str, ...] | list[str], trust: bool = False
) -> Any:
    """A checkpoint's transformers config (the hub only with ``download``), refused in one line when it
    cannot be read, names an architecture outside ``supported``, or (unless ``trust``) asks to run code of
    its own (an ``auto_map``: :mod:`fedge.files.remote_code`)."""
    transformers = _import_transformers()
    refuse_local(pretrained, "model.options.pretrained", trust, TRUST_HINT)
    try:
        config = transformers.AutoConfig.from_pretrained(
            pretrained, local_files_only=not download, trust_remote_code=trust
        )
    except (OSError, ValueError) as error:
        hint = "" if download else " (set model.options.download: true to fetch it)"
        raise ConfigError("model.options.pretrained", f"cannot load {pretrained!r}{hint}: {error}") from None
    if config.model_type not in supported:
        raise ConfigError(
            "model.options.pretrained",
            f"unknown architecture {config.model_type!r}; supported: {', '.join(supported)}",
        )
    refuse_loaded(config, pretrained, "model.options.pretrained", trust, TRUST_HINT)
    return config


def adapt(
    modules: nn.Module, targets: tuple[str, ...] | list[str], rank: int, alpha: float, dropout: float
) -> dict[str, Any]:
    """LoRA adapters on the ``targets`` projections of ``modules``; the run's record of them. A target
    list that matches nothing is refused in one line."""
    if not add_adapters(modules, targets, rank, alpha, dropout):
        raise ConfigError("model.options.lora_targets", f"no projection named {', '.join(targets)}")
    return {"rank": rank, "alpha": alpha, "dropout": dropout, "targets": list(targets)}


class NoDropout(nn.Identity):
    """A zero-rate dropout that is not a random layer (transformers read its ``p``)."""

    p = 0.0


def _no_dropout(model: nn.Module) -> None:
    """Replace the transformer's zero-rate dropout layers (no noise streams drawn for them)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Dropout) and child.p == 0:
                setattr(parent, name, NoDropout())


def _blocks(
    hf: nn.Module, arch: str, untie: bool, pad_id: int | None
) -> tuple[OrderedDict[str, nn.Module], int]:
    """The split blocks of a transformers causal LM and its number of positions; with ``untie`` a head
    tied to the embeddings gets its own copy (trained weights: each side of a cut trains its own)."""
    if arch == "gpt2":
        body = hf.transformer
        embed, layers, positions = GPT2Embedding(body.wte, body.wpe), list(body.h), None
        norm, limit = body.ln_f, hf.config.n_positions
    else:
        body = hf.model
        embed, layers = TokenEmbedding(body.embed_tokens), list(body.layers)
        positions, norm, limit = _Positions(body.rotary_emb), body.norm, hf.config.max_position_embeddings
    head = hf.lm_head
    if untie and hf.lm_head.weight is embed_weight(embed):
        head = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
        head.weight = nn.Parameter(hf.lm_head.weight.detach().clone())
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    for i, layer in enumerate(layers, start=1):
        blocks[f"block{i}"] = DecoderBlock(layer, embed if i == 1 else None, positions, pad_id)
    blocks["head"] = LMHead(norm, head)
    return blocks, limit


def embed_weight(embed: nn.Module) -> torch.Tensor:
    """The token-embedding matrix of an embedding block."""
    return embed.wte.weight if isinstance(embed, GPT2Embedding) else embed.embed_tokens.weight


def build_causal_lm(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    arch: Literal["llama", "qwen2", "mistral", "gpt2"] = "llama",
    layers: PositiveInt = 2,
    hidden: PositiveInt = 32,
    heads: PositiveInt = 2,
    kv_heads: PositiveInt | None = None,
    intermediate: PositiveInt | None = None,
    positions: PositiveInt | None = None,
    pretrained: str | None = None,
    download: bool = False,
    lora_rank: NonNegative = 8,
    lora_alpha: Annotated[float, Field(gt=0.0)] = 16.0,
    lora_dropout: Probability = 0.0,
    lora_targets: tuple[str, ...] | None = None,
    pad_id: NonNegative | None = None,
    trust_remote_code: bool = False,
) -> TransformerLM:
    """A causal transformer LM (GPT-2 or LLaMA family) of ``layers`` decoder blocks; LoRA r=8 on attention.

    Input: token ids ``[sequence]`` per sample (``num_classes`` is the vocabulary). ``lora_rank: 0`` trains
    every weight (full fine-tuning); otherwise only adapters on ``lora_targets`` (default: attention,
    ``c_attn`` / ``q_proj, v_proj``) train and the base is frozen. ``pretrained``: a checkpoint folder or
    hub name (downloaded only with ``download``); sizes then come from it. ``pad_id``: the id of
    right-padded sequences' pad positions, which the run sets from the data (``data.sequences: lines``);
    unset for packed text, where every id is a real token. ``trust_remote_code``: let a checkpoint whose
    config has an ``auto_map`` run its own Python code (refused otherwise).
    """
    if len(input_shape) != 1:
        raise ConfigError(
            "model.name", f"a language model reads token sequences; got shape {list(input_shape)}"
        )
    sequence = input_shape[0]
    spec = dict(vocab=num_classes, positions=positions or sequence, layers=layers, hidden=hidden, heads=heads,
                kv_heads=kv_heads, intermediate=intermediate)  # fmt: skip
    if pretrained is None and hidden % heads:
        raise ConfigError("model.options.heads", f"hidden {hidden} is not a multiple of heads {heads}")
    if pretrained is None and arch != "gpt2" and kv_heads is not None and heads % kv_heads:
        raise ConfigError("model.options.kv_heads", f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    hf = _hf_model(arch, spec, pretrained, download, trust_remote_code)
    arch = hf.config.model_type
    if hf.config.vocab_size < num_classes:
        raise ConfigError(
            "model.options.pretrained", f"vocabulary {hf.config.vocab_size} < the data's {num_classes} tokens"
        )
    _no_dropout(hf)
    blocks, limit = _blocks(hf, arch, untie=not lora_rank, pad_id=pad_id)
    if sequence > limit:
        raise ConfigError("data.seq_len", f"sequence {sequence} is longer than the model's {limit} positions")
    lora = None
    if lora_rank:
        targets = lora_targets or ATTENTION[arch]
        lora = adapt(nn.ModuleList(blocks.values()), targets, lora_rank, lora_alpha, lora_dropout)
    rotary = [blocks["block1"].positions] if blocks["block1"].positions is not None else []  # shared
    frozen = freeze(nn.ModuleList([*blocks.values(), *rotary]), parameters=bool(lora_rank))
    model = TransformerLM(blocks, name=arch, frozen=frozen, positions=limit, lora=lora, config=hf.config)
    model.pad_id = pad_id
    return model


def _family(arch: str | None, summary: str) -> Callable[..., TransformerLM]:
    """A zoo builder of :func:`build_causal_lm` for one architecture (``arch`` fixed) or family (None:
    the ``arch`` option picks it), with its options as keyword-only parameters for the model registry."""

    def build(input_shape: tuple[int, ...], num_classes: int, **options: Any) -> TransformerLM:
        chosen = {"arch": arch} if arch is not None else {}
        return build_causal_lm(input_shape, num_classes, **chosen, **options)

    signature = inspect.signature(build_causal_lm)
    hints = get_type_hints(build_causal_lm, include_extras=True)
    dropped = {"arch"} if arch is not None else set()
    build.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for p in signature.parameters.values() if p.name not in dropped]
    )
    build.__annotations__ = {k: v for k, v in hints.items() if k not in dropped}
    build.__doc__ = f"{summary}\n\n{build_causal_lm.__doc__}"
    return build


build_gpt2 = _family("gpt2", "GPT-2 causal LM cut after decoder block k (LoRA r=8 on c_attn by default)")
build_llama = _family(None, "LLaMA-family causal LM (llama, qwen2, mistral) cut after decoder block k")
