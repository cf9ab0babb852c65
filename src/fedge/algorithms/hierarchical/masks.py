"""HIST's masks: which hidden neurons of the fully connected layers each cell owns in a global round.

Masks are structured at neuron granularity (HIST App. B): a partitioned hidden layer's neurons are
permuted at random every global round and handed out in consecutive groups, ``s_j`` to cell ``j``; a cell
owning a neuron holds its incoming weight row, its bias and its outgoing weight column. Only every other
hidden layer of a run of fully connected layers is partitioned ("every two layers", so each submodel has
about ``1/N`` of the parameters). Everything else -- convolutions, normalisation, the output bias, FC
layers not adjacent to a partitioned hidden layer -- is *shared*: every cell trains a copy and the cloud
averages them (as HIST Sec. VI-B2 does for convolutions; docs/decisions.md, "Parameters no neuron owns
are shared"). A model without a hidden FC layer is all shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from fedge.errors import ConfigError
from fedge.system.partition_opt import uniform_sizes

# Layers that act on each value on its own: a hidden neuron between two Linears stays one neuron.
ELEMENTWISE = (nn.ReLU, nn.Dropout, nn.Identity)


@dataclass(frozen=True)
class HiddenLayer:
    """A partitioned hidden layer: the Linear ``producer`` computing it, the Linear ``consumer`` reading it.

    A neuron ``k`` is row ``k`` of ``producer.weight`` (and entry ``k`` of its bias) plus column ``k`` of
    ``consumer.weight``.
    """

    producer: str
    consumer: str
    width: int
    fan_in: int
    fan_out: int
    has_bias: bool

    @property
    def rows(self) -> tuple[str, ...]:
        """Parameters indexed by the neuron along their first dimension."""
        return (
            (f"{self.producer}.weight", f"{self.producer}.bias")
            if self.has_bias
            else (f"{self.producer}.weight",)
        )

    @property
    def column(self) -> str:
        """The parameter indexed by the neuron along its second dimension."""
        return f"{self.consumer}.weight"

    @property
    def values_per_neuron(self) -> int:
        return self.fan_in + int(self.has_bias) + self.fan_out


def partition_layout(model: nn.Module) -> tuple[HiddenLayer, ...]:
    """The hidden layers HIST partitions: every other hidden layer of each run of Linear layers.

    Leaf modules are read in registration order, which is the forward order of the zoo's block stacks.
    Two Linear layers with only element-wise layers between them enclose a candidate hidden layer; taking
    candidates in order and skipping any whose producer already had its columns partitioned gives the
    "every two layers" scheme of the paper.
    """
    leaves = [(name, m) for name, m in model.named_modules() if not list(m.children())]
    candidates = []
    previous: tuple[str, nn.Linear] | None = None
    for name, module in leaves:
        if isinstance(module, nn.Linear):
            if previous is not None:
                candidates.append((previous, (name, module)))
            previous = (name, module)
        elif not isinstance(module, ELEMENTWISE):
            previous = None
    layout: list[HiddenLayer] = []
    consumers: set[str] = set()
    for (p_name, producer), (c_name, consumer) in candidates:
        if p_name in consumers:
            continue
        consumers.add(c_name)
        layout.append(
            HiddenLayer(
                p_name,
                c_name,
                producer.out_features,
                producer.in_features,
                consumer.out_features,
                producer.bias is not None,
            )
        )
    return tuple(layout)


def partitioned_names(layout: tuple[HiddenLayer, ...]) -> set[str]:
    """Names of every parameter a partition splits (the rest are shared)."""
    return {name for layer in layout for name in (*layer.rows, layer.column)}


def layer_sizes(layout: tuple[HiddenLayer, ...], sizes: np.ndarray) -> list[np.ndarray]:
    """Neurons per cell in every partitioned layer, from the sizes chosen for the first one.

    Further layers get the same shares, rounded by largest remainder so each sums to the layer's width.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if layout and sizes.sum() != layout[0].width:
        raise ValueError(f"sizes sum to {sizes.sum()}, not to the {layout[0].width} neurons of the layer")
    out = [sizes]
    for layer in layout[1:]:
        exact = sizes * layer.width / sizes.sum()
        counts = np.floor(exact).astype(np.int64)
        counts[np.argsort(counts - exact, kind="stable")[: layer.width - counts.sum()]] += 1
        out.append(counts)
    return out


def check_cells(layout: tuple[HiddenLayer, ...], cells: int) -> None:
    """Every cell must own at least one neuron of every partitioned layer."""
    for layer in layout:
        if layer.width < cells:
            raise ConfigError(
                "algorithm.cells",
                f"{cells} cells but the hidden layer of {layer.producer} has only {layer.width} neurons",
            )


def draw_owners(
    layout: tuple[HiddenLayer, ...], sizes: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """The owning cell of every neuron of every partitioned layer: a random permutation cut in consecutive
    groups of ``sizes`` (for the first layer; see :func:`layer_sizes`)."""
    owners = []
    for layer, counts in zip(layout, layer_sizes(layout, sizes), strict=True):
        owner = np.empty(layer.width, dtype=np.int64)
        owner[rng.permutation(layer.width)] = np.repeat(np.arange(len(counts)), counts)
        owners.append(owner)
    return owners


def uniform_owner_sizes(layout: tuple[HiddenLayer, ...], cells: int) -> np.ndarray:
    """Uniform ("w/o") sizes of the first partitioned layer (empty without a partitioned layer)."""
    return uniform_sizes(layout[0].width, cells) if layout else np.zeros(0, dtype=np.int64)
