"""FLTrust (Cao, Fang, Liu and Gong, "FLTrust: Byzantine-robust federated learning via trust
bootstrapping", NDSS 2021): the server trains its own update on a small clean root set and trusts each
client's update by its direction's agreement with it.

Each round the server trains a copy of the broadcast model on its root set, as a client trains (its
update ``g0``, the trained model less the broadcast one), and with ``g_i`` each client's change from the
broadcast model (over every floating tensor, one vector per row):

- trust score ``TS_i = ReLU(cos(g_i, g0))`` (the paper's Eq. 5);
- each update rescaled to the root update's norm, ``g_i ||g0|| / ||g_i||`` (Eq. 6);
- the new model ``r + sum_i TS_i g_i ||g0|| / ||g_i|| / sum_j TS_j`` (Eq. 7; no change where every
  score is 0).

The root training lives with the runtime that aggregates (:mod:`fedge.runtime.root`): before each
aggregation it hands the reducer the round's root model (:attr:`FLTrust.root`), so the stage runs only at
the server of FedAvg and FedAvg-FT, at a hierarchy's edge servers (HIST, HFedAvg: each edge its own
root model, trained from its cell's broadcast), at HFedAvg's cloud (trained from the global model for
one edge period), at the decentralized family's peers (each peer its own trusted party: its root update
is its own trained update of the round, no root set; the centre is its model before training) and at
FedBuff's buffer (the root model trained from the server's current model, a delta from it where the
buffer merges deltas) and FedAsync's (each merge's one change scored against a root delta), at the split
server's client-model average (SplitFed v2, CSE-FSL, FSL-SAGE: the root update of the client model
trained through the composed model, :mod:`fedge.algorithms.split.root`), and is refused elsewhere.
Unweighted, as the paper's rule; the site's weights only choose the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedge.aggregation import sites
from fedge.aggregation.robust import Batch, RobustReducer
from fedge.aggregation.stage import OptionError, StageRun
from fedge.aggregation.updates import Updates
from fedge.errors import ConfigError
from fedge.tensors import Tensors

STAR = ("fedavg", "fedavg_ft")
"""The algorithms whose server trains a root update (their star runtime)."""
EDGES = ("hist", "hfedavg")
"""The algorithms whose edge servers train a root update each (the cells runtime)."""
CLOUDS = ("hfedavg",)
"""The hierarchies whose cloud trains a root update (HIST's refuses: its neurons have one owner each)."""
BUFFERS = ("fedbuff", "fedasync")
"""The asynchronous algorithms whose server trains a root update for its buffer (FedAsync's per merge)."""
SPLITS = ("splitfed_v2", "cse_fsl", "fsl_sage")
"""The split algorithms whose server trains a root update of the client model before averaging it
(SplitFed v1's and FSL_AN's server copies share the pipeline and have none: refused)."""


@dataclass(frozen=True)
class RootUpdate:
    """The aggregating node's own model of one aggregation, trained on its root set from the model it
    sent, and the FLOPs that training took (charged to the node with the aggregation's). ``per_output``:
    ``model`` is stacked over the site's outputs, each output's own (a hierarchy's edges; ``flops`` each
    one's), else the one output's (the star server). ``start``: where the site's reference is not the model
    the root model was trained from (a peer's reference is its trained model), each output's start, the
    centre its rows are measured from."""

    model: Tensors
    flops: float
    per_output: bool = False
    start: Tensors | None = None  # per output, the models ``model`` was trained from (peers: the centre)


class FLTrust(RobustReducer):
    """FLTrust's trust-weighted mean of norm-rescaled updates (see the module). ``root_samples``: the
    size of the root set (unset: 100); ``root_epochs`` and ``lr``: the root training's passes and learning
    rate (unset: the clients' ``local_epochs`` and ``optimizer.lr``); at peers, which train no root set,
    none may be set. Report: ``kept`` is each row's
    normalised trust score ``TS_i / sum_j TS_j`` (its weight in the result; all 0 when every score is),
    ``scores`` the trust scores ``TS_i``. Cost per output: ``(6 k + 2) d`` (the dot products and norms,
    then the weighted sum), plus the root training's FLOPs."""

    name = "fltrust"
    uses_reference = True

    def __init__(
        self, root_samples: int | None = None, root_epochs: int | None = None, lr: float | None = None
    ):
        super().__init__()
        given = {"root_samples": root_samples, "root_epochs": root_epochs, "lr": lr}
        self.given = [name for name, value in given.items() if value is not None]  # what a peer refuses
        root_samples = 100 if root_samples is None else root_samples
        if isinstance(root_samples, bool) or not isinstance(root_samples, int) or root_samples < 1:
            raise OptionError("root_samples", f"{root_samples!r} must be a positive integer")
        if root_epochs is not None and (
            isinstance(root_epochs, bool) or not isinstance(root_epochs, int) or root_epochs < 1
        ):
            raise OptionError("root_epochs", f"{root_epochs!r} must be a positive integer")
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, int | float) or not lr > 0):
            raise OptionError("lr", f"{lr!r} must be a positive number")
        self.root_samples, self.root_epochs = root_samples, root_epochs
        self.lr = None if lr is None else float(lr)
        self.root: RootUpdate | None = None  # this round's, set by the runtime before it reduces
        self.outputs: torch.Tensor | None = None  # the outputs of the batch being reduced

    def bind(self, run: StageRun) -> None:
        if run.site == sites.PEER and self.given:
            own = "at peers fltrust trains no root set: each peer's root update is its own trained update"
            raise ConfigError(f"{run.key}.options.{self.given[0]}", own)
        if run.site in (sites.EDGE, sites.CLOUD) and self.root_epochs is not None:
            steps = f"the {run.site}'s root training takes the members' local_steps, not epochs"
            raise ConfigError(f"{run.key}.options.root_epochs", steps)
        super().bind(run)

    def reduce(self, updates: Updates) -> Tensors:
        try:
            return super().reduce(updates)
        finally:
            self.root = None  # one round's update serves one aggregation (every group of its outputs)

    def _centre(self, updates: Updates, names: list[str], chosen: torch.Tensor) -> Tensors:
        self.outputs = chosen  # which outputs' root models the batch's rows are measured against
        start = None if self.root is None else self.root.start
        if start is None:
            return super()._centre(updates, names, chosen)
        rows = updates.parts[0].rows
        return {n: start[n].reshape(len(start[n]), -1)[chosen.to(start[n].device)].to(rows[n]) for n in names}

    def aggregate(
        self, batch: Batch, out: Tensors, centre: Tensors | None
    ) -> tuple[torch.Tensor, list[dict[str, object]]]:
        assert centre is not None
        root = self.root
        if root is None:
            trained = ", ".join(STAR + CLOUDS + BUFFERS + SPLITS)
            raise ConfigError(
                f"{self.run.key}.name", f"fltrust needs the server's root update, which only {trained} train"
            )
        g, k = batch.shape
        dots = torch.zeros(g, k, dtype=torch.float64)
        squared = torch.zeros(g, k, dtype=torch.float64)
        root_squared = torch.zeros(g, dtype=torch.float64)
        for name, cols, x in batch.blocks():
            c = centre[name][:, cols].to(x.device)
            model = root.model[name]
            own = model.reshape(model.shape[0], -1)[self.outputs] if root.per_output else model.reshape(1, -1)
            g0 = own[:, cols].to(x) - c
            gap = x - c[:, None]
            dots += (gap @ g0[:, :, None])[..., 0].double().cpu()
            squared += torch.linalg.vector_norm(gap, dim=2).double().square().cpu()
            root_squared += g0.double().square().sum(dim=1).cpu()
        norms, root_norm = squared.sqrt(), root_squared.sqrt()[:, None]
        both = (norms > 0) & (root_norm > 0)
        cosine = torch.where(both, dots / (norms * root_norm).clamp_min(1e-300), 0.0)
        trust = cosine.clamp_min(0.0)
        total = trust.sum(dim=1, keepdim=True)
        kept = torch.where(total > 0, trust / total.clamp_min(1e-300), 0.0)
        move = torch.where(norms > 0, kept * root_norm / norms.clamp_min(1e-300), 0.0)
        for name, cols, x in batch.blocks():
            c = centre[name][:, cols].to(x.device)
            a = move.to(device=x.device, dtype=x.dtype)[:, None, :]
            out[name][:, cols] = c + (a @ (x - c[:, None]))[:, 0]
        flops = float((6 * k + 2) * batch.dims) + root.flops
        return kept, [{"flops": flops, "scores": tuple(t.tolist())} for t in trust]
