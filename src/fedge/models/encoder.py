"""BERT-family sequence classifiers as split models, fine-tuned with LoRA or in full.

A BERT encoder becomes a :class:`~fedge.models.transformer.TransformerLM` of ``N + 1`` blocks: ``block1``
holds the embeddings (word, position, token type, their LayerNorm) and encoder layer 1, ``block2`` ..
``blockN`` the other encoder layers, ``head`` the pooler (first token, dense, tanh) and the classifier. A
cut ``k`` (1..N) gives the client the embeddings and encoder layers 1..k, the server the rest, the pooler
and the classifier; the smashed data are the hidden states ``[batch, sequence, hidden]`` after layer k.

The model reads token ids ``[batch, sequence]`` and returns class logits ``[batch, classes]``, as
transformers' ``BertForSequenceClassification`` does with the attention mask ``ids != pad``. Sequences
may be right-padded with the model's pad id (``pad_token_id`` of its config: 0 for a model built from
sizes, the checkpoint's own otherwise; ``data.sequences: lines``). A pad position is masked out of every
attention (no real token reads it) and its hidden state is set to zero at the end of every block, so a
padded sequence gives the logits of its unpadded self. The zero vector is how a pad position crosses the
cut: it is never sent (the ledger counts real tokens only) and the receiving side, which sees no ids,
reads an all-zero hidden state as padding. A real token's hidden state is a LayerNorm output, never
exactly the zero vector, and fedge's codecs keep a zero vector zero; an entry dropped by light FedSL's
cut dropout is zero too, so a real token with every entry dropped (probability ``p ** hidden``) arrives
as nothing and is read as padding, which is what its receiver would see. Dropout inside the encoder is
off.
Under LoRA the adapters (default on ``query`` and ``value``, peft's BERT targets) and the freshly drawn
classifier train, as peft's ``modules_to_save`` does for a classification head; the rest is frozen.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated, Any

import torch
from pydantic import Field, PositiveInt
from torch import nn

from fedge.errors import ConfigError
from fedge.models.layers import Probability
from fedge.models.lora import FoldsClients, freeze
from fedge.models.transformer import (
    NonNegative,
    TransformerLM,
    _import_transformers,
    _no_dropout,
    _output,
    adapt,
    from_checkpoint,
    pretrained_config,
    real_tokens,
)

BIDIRECTIONAL = "fedge_bidirectional"
BERT_TARGETS = ("query", "value")


def bidirectional_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Softmax attention over every real position, written with plain tensor operations (batches over
    clients under ``vmap``, which ``scaled_dot_product_attention`` does not on the CPU).
    ``attention_mask``: True at the real keys, ``[..., 1, 1, sequence]`` (an unpadded sequence's is all
    True and changes no number). A masked key's score is the dtype's lowest value rather than -inf, so a
    row with no real token (a batch's filler row) stays finite; any real key outweighs it entirely."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = (query @ key.transpose(-1, -2)) * scale
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return (weights.to(query.dtype) @ value).transpose(-3, -2).contiguous(), None


class BertEmbedding(nn.Module):
    """BERT's word + position + token-type (all type 0) embeddings and their LayerNorm, positions made on
    the ids' device (transformers reads them from a buffer, which the frozen base holds on its own)."""

    def __init__(self, embeddings: nn.Module):
        super().__init__()
        self.word_embeddings = embeddings.word_embeddings
        self.position_embeddings = embeddings.position_embeddings
        self.token_type_embeddings = embeddings.token_type_embeddings
        self.LayerNorm = embeddings.LayerNorm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        positions = torch.arange(ids.shape[-1], device=ids.device)
        hidden = self.word_embeddings(ids) + self.token_type_embeddings(torch.zeros_like(ids))
        return self.LayerNorm(hidden + self.position_embeddings(positions))


class EncoderBlock(FoldsClients, nn.Module):
    """One encoder layer, preceded in the first block by the embeddings; pad positions (``pad_id`` in the
    ids, the zero vector in hidden states) are masked out of attention and leave the block as zeros."""

    def __init__(self, layer: nn.Module, embed: nn.Module | None, pad_id: int):
        super().__init__()
        if embed is not None:
            self.embed = embed
        self.layer = layer
        self.pad_id = pad_id

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x) if hasattr(self, "embed") else x
        real = real_tokens(self, x, hidden)
        out = _output(self.layer(hidden, attention_mask=real[..., None, None, :]))
        return out * real[..., None].to(out.dtype)


class ClassifierHead(nn.Module):
    """BERT's pooler (the first token's hidden state, dense, tanh) and the classifier; ``[batch, classes]``
    logits."""

    def __init__(self, pooler: nn.Module, classifier: nn.Linear):
        super().__init__()
        self.pooler, self.classifier = pooler, classifier

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # the frozen pooler reads the first token as a [..., 1, hidden] slice (a 3-d product, which unlike
        # a 2-d addmm runs in the meta-device shape check, where the frozen base keeps its device); its
        # output goes to the classifier's device (a no-op outside that check)
        pooled = self.pooler.activation(self.pooler.dense(hidden[..., :1, :]))[..., 0, :]
        return self.classifier(pooled.to(self.classifier.weight.device))


class FirstTokenHead(nn.Module):
    """CSE-FSL's auxiliary head for a sequence classifier: class logits from the first token's hidden
    state at the cut (one Linear, or Linear-ReLU-Linear with ``hidden``)."""

    def __init__(self, width: int, classes: int, hidden: int | None = None):
        super().__init__()
        if hidden is None:
            self.linear = nn.Linear(width, classes)
        else:
            self.linear = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden[..., 0, :])


def first_token_aux_head(
    kind: str, smashed_shape: tuple[int, ...], classes: int, hidden: int | None
) -> FirstTokenHead:
    """The aux head ``model.aux`` names on a sequence classifier's cut (``linear`` or ``mlp``)."""
    if kind not in ("linear", "mlp"):
        refused = f"a sequence classifier's aux head is linear or mlp; got {kind!r}"
        raise ConfigError("model.aux.kind", refused)
    if kind == "mlp" and hidden is None:
        raise ConfigError("model.aux.hidden", "required by the mlp aux head")
    return FirstTokenHead(smashed_shape[-1], classes, hidden if kind == "mlp" else None)


class SequenceClassifier(TransformerLM):
    """A BERT-family encoder with a classification head, as blocks (module docstring); ``pad_id`` is the
    token id it masks as padding."""

    classifier = True


def bert_config(vocab: int, classes: int, positions: int, layers: int, hidden: int, heads: int,
                intermediate: int | None) -> Any:  # fmt: skip
    """A transformers ``BertConfig`` of the given sizes, every dropout off."""
    transformers = _import_transformers()
    return transformers.BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=intermediate or 4 * hidden, max_position_embeddings=positions, num_labels=classes,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0, pad_token_id=0,
    )  # fmt: skip


def _hf_classifier(
    config: Any, pretrained: str | None, download: bool, classes: int, trust: bool
) -> nn.Module:
    """transformers' ``BertForSequenceClassification``, from ``config`` (random weights) or a checkpoint
    (its classifier drawn fresh for ``classes`` labels; ``trust``: it may run code of its own)."""
    transformers = _import_transformers()
    transformers.AttentionInterface.register(BIDIRECTIONAL, bidirectional_attention)
    if pretrained is None:
        auto = transformers.AutoModelForSequenceClassification
        return auto.from_config(config, attn_implementation=BIDIRECTIONAL)
    loaded = pretrained_config(pretrained, download, ("bert",), trust)
    loaded.num_labels = classes
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        setattr(loaded, key, 0.0)
    auto = transformers.AutoModelForSequenceClassification
    return from_checkpoint(auto, pretrained, loaded, download, trust, attn_implementation=BIDIRECTIONAL)


def build_bert(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    vocab: PositiveInt = 256,
    layers: PositiveInt = 2,
    hidden: PositiveInt = 32,
    heads: PositiveInt = 2,
    intermediate: PositiveInt | None = None,
    positions: PositiveInt | None = None,
    pretrained: str | None = None,
    download: bool = False,
    lora_rank: NonNegative = 8,
    lora_alpha: Annotated[float, Field(gt=0.0)] = 16.0,
    lora_dropout: Probability = 0.0,
    lora_targets: tuple[str, ...] | None = None,
    trust_remote_code: bool = False,
) -> SequenceClassifier:
    """BERT sequence classifier cut after encoder block k (LoRA r=8 on query, value; classifier trained).

    Input: token ids ``[sequence]`` per sample, ids below ``vocab`` (256: the byte tokenizer);
    ``num_classes`` is the number of labels. ``lora_rank: 0`` trains every weight. ``pretrained``: a
    checkpoint folder or hub name (downloaded only with ``download``); sizes then come from it.
    ``trust_remote_code``: let a checkpoint whose config has an ``auto_map`` run its own Python code.
    """
    if len(input_shape) != 1:
        raise ConfigError("model.name", f"bert reads token sequences; got shape {list(input_shape)}")
    sequence = input_shape[0]
    if pretrained is None and hidden % heads:
        raise ConfigError("model.options.heads", f"hidden {hidden} is not a multiple of heads {heads}")
    config = bert_config(vocab, num_classes, positions or sequence, layers, hidden, heads, intermediate)
    hf = _hf_classifier(config, pretrained, download, num_classes, trust_remote_code)
    limit = hf.config.max_position_embeddings
    if sequence > limit:
        raise ConfigError("data.seq_len", f"sequence {sequence} is longer than the model's {limit} positions")
    _no_dropout(hf)
    pad_id = 0 if hf.config.pad_token_id is None else int(hf.config.pad_token_id)
    encoder, embed = list(hf.bert.encoder.layer), BertEmbedding(hf.bert.embeddings)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    for i, layer in enumerate(encoder, start=1):
        blocks[f"block{i}"] = EncoderBlock(layer, embed if i == 1 else None, pad_id)
    blocks["head"] = ClassifierHead(hf.bert.pooler, hf.classifier)
    lora = None
    frozen_part: nn.Module = nn.ModuleList(blocks.values())
    if lora_rank:
        targets = lora_targets or BERT_TARGETS
        adapted = nn.ModuleList(list(blocks.values())[:-1] + [hf.bert.pooler])
        lora = adapt(adapted, targets, lora_rank, lora_alpha, lora_dropout)
        frozen_part = nn.ModuleList([*list(blocks.values())[:-1], hf.bert.pooler])  # the classifier trains
    frozen = freeze(frozen_part, parameters=bool(lora_rank))
    model = SequenceClassifier(
        blocks, name="bert", frozen=frozen, positions=limit, lora=lora, config=hf.config
    )
    model.pad_id = pad_id
    return model
