"""The pieces of a split model: client trunk, server part, optional aux head, and their initial state.

State names: the client's tensors carry the prefixes ``trunk.`` and ``aux.`` (the children of
``local``, the trunk followed by its aux head); the server's tensors keep the full model's names. So
the composed model's state is ``{**prefixed(client, "trunk."), **server}``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from fedge.algorithms.base import Context
from fedge.comm import nodes
from fedge.config import AuxConfig
from fedge.engine import Criterion, buffers_of, cross_entropy, parameters_of
from fedge.errors import ConfigError
from fedge.models import SplitModel, aux_head, block_cut, output_shape, split
from fedge.models.encoder import first_token_aux_head
from fedge.models.transformer import TransformerLM, check_trained_sides, token_aux_head
from fedge.rng import global_stream, torch_rng
from fedge.runtime.storage import hold_frozen_base
from fedge.tensors import Tensors


@dataclass
class SplitParts:
    """The full model, its two parts, the trunk(+aux) local model, and the input and smashed shapes."""

    model: SplitModel
    trunk: nn.Sequential
    server: nn.Sequential
    local: nn.Sequential
    input_shape: tuple[int, ...]
    smashed_shape: tuple[int, ...]
    cut: int
    criterion: Criterion = cross_entropy  # the training loss of the aux head and the server part

    @property
    def has_aux(self) -> bool:
        return "aux" in dict(self.local.named_children())

    @property
    def aux(self) -> nn.Module:
        """The local model's aux head (an error for a model without one)."""
        return self.local.get_submodule("aux")


def resolve_cut(ctx: Context, model: SplitModel) -> int:
    """``model.cut``, else the model's paper cut; an error naming ``model.cut`` when there is neither."""
    cut = block_cut(model, ctx.config.model.cut) if ctx.config.model.cut is not None else model.default_cut
    if cut is None:
        raise ConfigError(
            "model.cut",
            f"split learning needs a cut and {model.name} has no default; valid: 1..{len(model) - 1}",
        )
    return cut


def build_parts(ctx: Context, with_aux: bool) -> SplitParts:
    """Build the model once, cut it, and (for local-loss algorithms) attach the aux head. The frozen base
    of a transformer is metered once per device: each client holds its side's, the server its side's.

    The aux head is ``model.aux`` or, when that is unset, the paper's default linear head (CSE-FSL's "MLP" aux
    of Table III; Table V uses it). Its initial weights come from the stream ``(seed, "aux-init")``.
    Algorithms without an aux head ignore ``model.aux``, so one config can serve a whole ``fedge compare``.
    """
    model = ctx.build_model().to(ctx.device)
    cut = resolve_cut(ctx, model)
    trunk, server = split(model, cut)
    if isinstance(model, TransformerLM):
        check_trained_sides(trunk, server)
    hold_frozen_base(ctx.network, nodes.clients(range(ctx.data.num_clients)), model, trunk)
    hold_frozen_base(ctx.network, nodes.SERVER, model, server)
    shape = output_shape(trunk, ctx.data.input_shape)
    children: OrderedDict[str, nn.Module] = OrderedDict(trunk=trunk)
    if with_aux:
        spec = ctx.config.model.aux or AuxConfig()
        head: nn.Module
        with global_stream(ctx.seed, "aux-init"):
            if isinstance(model, TransformerLM) and model.classifier:  # the first token's hidden state
                head = first_token_aux_head(spec.kind, shape, ctx.data.num_classes, spec.hidden)
            elif isinstance(model, TransformerLM):  # per-token logits from the cut's hidden states
                head = token_aux_head(spec.kind, shape, ctx.data.num_classes, spec.hidden)
            else:
                head = aux_head(spec.kind, shape, ctx.data.num_classes, spec.channels, spec.hidden)
        children["aux"] = head.to(ctx.device)
    local = nn.Sequential(children)
    return SplitParts(model, trunk, server, local, tuple(ctx.data.input_shape), shape, cut, ctx.criterion)


def initial_state(parts: SplitParts, init: str, seed: int) -> tuple[Tensors, Tensors, Tensors, Tensors]:
    """Client params, client buffers, server params, server buffers at t = 0.

    ``normal0.05`` redraws every parameter (biases included) from N(0, 0.05^2) with the stream
    ``(seed, "split-init")`` in name order (the authors' code's init; the paper gives none); ``torch_default``
    keeps the modules' own init.
    """
    client, server = parameters_of(parts.local), parameters_of(parts.server)
    if init == "normal0.05":
        gen = torch_rng(seed, "split-init")
        for tensors in (client, server):
            for name in sorted(tensors):
                t = tensors[name]
                draw = torch.randn(t.shape, generator=gen, dtype=t.dtype) * 0.05
                tensors[name] = draw.to(t.device)
    return client, buffers_of(parts.local), server, buffers_of(parts.server)


def composed(client: Tensors, server: Tensors) -> Tensors:
    """The full model's state from the client state (its ``trunk.`` entries) and the server state."""
    trunk = {name[len("trunk.") :]: t for name, t in client.items() if name.startswith("trunk.")}
    return {**trunk, **server}


def trunk_only(client: Tensors) -> Tensors:
    """The client state's trunk entries (prefix kept)."""
    return {name: t for name, t in client.items() if name.startswith("trunk.")}


def aux_only(client: Tensors) -> Tensors:
    """The client state's aux-head entries (prefix kept)."""
    return {name: t for name, t in client.items() if name.startswith("aux.")}
