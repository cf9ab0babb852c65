"""HIST (Fang, Han, Brinton): hierarchical independent submodel training (Algorithm 1, Secs. IV-V).

Every global round the cloud partitions the hidden neurons of the fully connected layers into disjoint
groups, one per cell; each cell trains only its submodel (shared layers whole) and the cloud re-assembles
the full model from the disjoint parts. Mask sizes are equal (``uniform``) or minimise the round's
latency under the cap of (19c) (``optimised``), with the OMA costs of Eq. 19 or the AirComp costs of
Eq. 36 depending on the edge aggregation.
"""

from __future__ import annotations

import numpy as np

from fedge.algorithms.base import Context, register
from fedge.algorithms.hierarchical.config import HISTConfig
from fedge.algorithms.hierarchical.hierarchy import HierarchicalFL
from fedge.algorithms.hierarchical.masks import draw_owners, partitioned_names, uniform_owner_sizes
from fedge.algorithms.hierarchical.submodel import CellViews
from fedge.comm import Link
from fedge.errors import ConfigError
from fedge.rng import numpy_rng
from fedge.system.aircomp import aircomp_cost_per_value
from fedge.system.oma import oma_cost_per_value
from fedge.system.partition_opt import greedy_sizes, milp_sizes, size_cap


def per_value_bits(link: Link, values: int) -> float:
    """Bits a link spends per value on a dense payload of ``values`` values (32 for fp32)."""
    counts = np.array([[values]], dtype=np.int64)
    return float(link.codec.bits(counts, counts)[0]) / values


@register(
    "hist", HISTConfig, "HIST: each cell trains a disjoint neuron partition of the FC layers, cloud merges"
)
class HIST(HierarchicalFL[HISTConfig]):
    """HIST with OMA or AirComp edge aggregation and uniform or latency-optimised mask sizes."""

    partitioned = True

    def __init__(self, ctx: Context, cfg: HISTConfig):
        super().__init__(ctx, cfg)
        if not self.layout:
            raise ConfigError(
                "model", f"HIST partitions hidden fully connected layers and {ctx.config.model.name} has none"
            )
        split = partitioned_names(self.layout)
        self.shared_values = sum(p.numel() for name, p in self.params.items() if name not in split)
        first = self.layout[0].width
        # values a cell gains per neuron of the first layer (further layers follow its shares)
        self.values_per_unit = sum(layer.values_per_neuron * layer.width for layer in self.layout) / first
        self.up_value_bits = per_value_bits(
            self.links.up, self.model_values
        )  # Eq. 19's bits per uploaded value

    def cell_costs(self, cpu_hz: np.ndarray, rates_bps: np.ndarray | None) -> np.ndarray:
        """Each cell's global-round latency per model value it holds: Eq. 19 with OMA rates, Eq. 36 for
        AirComp (``rates_bps`` is ``None``)."""
        cfg, radio = self.cfg, self.cfg.radio
        costs, bands = [], self.radio.cell_bandwidth_hz()
        for j in range(self.cells.num_cells):
            members = self.cells.members(j)
            if rates_bps is not None:
                cost = oma_cost_per_value(
                    cfg.edge_rounds,
                    cfg.local_steps,
                    radio.cycles_per_step,
                    self.model_values,
                    cpu_hz[members],
                    rates_bps[members],
                    self.up_value_bits,
                )
            else:
                cost = aircomp_cost_per_value(
                    cfg.edge_rounds,
                    cfg.local_steps,
                    radio.cycles_per_step,
                    self.model_values,
                    cpu_hz[members],
                    float(bands[j]),
                    radio.subcarrier_hz,
                    radio.symbol_s,
                )
            costs.append(cost)
        return np.array(costs)

    def mask_sizes(self, round_: int, cpu_hz: np.ndarray, rates_bps: np.ndarray | None) -> np.ndarray:
        """Neurons per cell of the first partitioned layer: uniform, or minimising the round's latency."""
        cfg, cells = self.cfg, self.cells
        if cfg.mask_sizes == "uniform":
            return uniform_owner_sizes(self.layout, cells.num_cells)
        units = self.layout[0].width
        solve = greedy_sizes if cfg.solver == "greedy" else milp_sizes
        cap = size_cap(units, cells.num_cells, cfg.size_cap)
        costs = self.cell_costs(cpu_hz, rates_bps)
        return solve(costs, units, cap, 1, self.shared_values, self.values_per_unit)

    def views(self, round_: int, sizes: np.ndarray) -> CellViews:
        owners = draw_owners(self.layout, sizes, numpy_rng(self.ctx.seed, "hist-masks", round_))
        return CellViews.build(self.layout, owners, self.cells.num_cells, self.cfg.form, self.ctx.device)
