"""Clients that lie at a star server (the ``adversary`` block): who is malicious, and what they send.

The malicious clients are a list, or a fraction drawn once from the run seed's own stream
``(seed, "adversary")``; from ``start_round`` on, each of them that takes part attacks. Model poisoning
replaces a malicious participant's row (its change ``d = x - r`` from the round's reference ``r``, the
broadcast model) after the server received the rows and before its pipeline, on the stacked rows:

- ``sign_flip``: ``r - s d`` (a reversed update; ``scale`` s, 1);
- ``scaling``: ``r + s d``, the model-replacement boost of Bagdasaryan et al., "How to backdoor federated
  learning", 2020 (``scale`` s, default ``n / m``: the round's participants over its malicious ones);
- ``gaussian``: ``r + N(0, sigma^2)`` per coordinate (Blanchard et al. 2017's Gaussian Byzantine worker;
  ``sigma``, 1), drawn from ``(seed, "adversary-gaussian", round, client)``;
- ``free_rider``: ``r`` (no training contribution; Lin et al., "Free-riders in federated learning", 2019);
- ``alie``: ``r + mean(D) - z std(D)`` coordinate-wise over the honest changes ``D`` of the round
  (Baruch et al., "A little is enough: circumventing defenses for distributed learning", 2019), ``z``
  by the paper's ``s = floor(n/2 + 1) - m``, ``z = Phi^-1((n - s) / n)``, or ``options.z``;
- ``ipm``: ``r - epsilon mean(D)`` (Xie et al., "Fall of empires: breaking Byzantine-tolerant SGD by
  inner product manipulation", 2020; ``epsilon``, 0.1);
- ``min_max``, ``min_sum``: ``r + mean(D) + gamma p`` with ``gamma`` the largest that keeps the row as
  close to the honest ones as they are to each other (Shejwalkar and Houmansadr 2021;
  :mod:`fedge.runtime.minmax`).

The omniscient four (``alie``, ``ipm``, ``min_max``, ``min_sum``) read the honest rows of the round, as
their papers assume (a round with no honest participant: the malicious rows' own trained changes). Data
poisoning, ``label_flip``: a malicious client trains on labels ``y -> C - 1 - y`` (Tolpegin et al., "Data
poisoning attacks against federated learning systems", 2020), a label view of the data that both
executors read alike; evaluation keeps the clean labels. ``backdoor``: a malicious client trains on part
of its samples stamped with a pixel trigger and relabelled to the target class
(:mod:`fedge.runtime.backdoor`), its upload boosted by ``scale`` (1: as trained); each evaluation adds the
attack success rate ``attack_success``.

Under torchrun (the star round's rows spread over processes, :class:`~fedge.distributed.Cohort`) every
process knows the malicious clients (the same list or draw) and the round's participants, so the
rank-local attacks (``sign_flip``, ``scaling``, ``gaussian``, ``free_rider``, ``label_flip``,
``backdoor``) replace this process's malicious rows with the round's counts (``scaling``'s ``n / m``
over every process) and no collective. The omniscient four read rows a rank-local partial sum cannot
give: each process first all-gathers the rows they read, the round's honest rows (all rows where nobody
is honest), floating tensors only, in cohort order, so each computes the one-process attack. Cost, per
round that attacks: an all-gather of ``H x d`` values (``H`` honest participants, ``d`` the model's
floating entries; ``4 H d`` bytes at fp32) held by every process, plus one all-gather of the row counts;
a robust reducer then gathers every row again (:mod:`fedge.aggregation.pipeline`). The figures read every
participant's weight and the reducer's reports, which name every row. Split learning's adversary
(:mod:`fedge.runtime.split_adversary`) poisons its uploads the same way, and so do the peers and a
hierarchy's cell members (:mod:`fedge.runtime.spread_adversary`) and edges
(:mod:`fedge.runtime.edge_adversary`); a buffer's and ``fedavg_deadline``'s received rows run in one
process only.

Deployed (``fedge deploy``, FedAvg and FedAvg-FT: :func:`fedge.deploy.rounds.check_stages`) every node
builds the run from the same config and seed, so a malicious node knows it is malicious and trains on its
own poisoned view (flipped labels, stamped samples; the server's round names that view to the node and
plans its batches over it, as in simulation). Model poisoning stays where the simulation applies it: in
the server app, on the rows it received, before its pipeline. The bits on the wire are then the honest
node's trained rows: for the omniscient attacks this is the papers' threat model (the colluding attackers
see every honest update, which no node holds), a simulated omniscient adversary at the boundary where
the replies arrive; for the rank-local ones it is what the simulation does too (it poisons the decoded
upload, so an up codec encodes the trained row, and its ledger counts that row); on the node they would
change both under a lossy or sparse up codec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge.aggregation import Pipeline
from fedge.aggregation.registry import MEAN
from fedge.aggregation.robust import RobustReport
from fedge.config import OMNISCIENT_ATTACKS, AdversaryConfig
from fedge.data.federated import FederatedData, ResampledClients
from fedge.distributed import Cohort
from fedge.errors import ConfigError
from fedge.rng import numpy_rng, torch_rng
from fedge.runtime.backdoor import Backdoor
from fedge.runtime.minmax import crafted
from fedge.tensors import Tensors, floating

DEFAULTS = {"scale": 1.0, "sigma": 1.0, "epsilon": 0.1}
"""Options' defaults (``scaling``'s scale and ``alie``'s z depend on the round: see the module)."""


def malicious_clients(config: AdversaryConfig, num_clients: int, seed: int) -> np.ndarray:
    """The sorted malicious client ids: the given list, or ``max(1, round(fraction n))`` drawn from the
    stream ``(seed, "adversary")``."""
    if isinstance(config.clients, list):
        return np.sort(np.asarray(config.clients, dtype=np.int64))
    if config.clients is None:  # malicious edge servers alone (adversary.edges)
        return np.zeros(0, dtype=np.int64)
    count = max(1, round(config.clients * num_clients))
    return np.sort(numpy_rng(seed, "adversary").choice(num_clients, size=count, replace=False))


def alie_z(n: int, m: int) -> float:
    """Baruch et al. 2019's ``z_max`` for ``m`` malicious of ``n`` participants: ``s = floor(n/2 + 1) - m``
    honest rows to win over, ``z = Phi^-1((n - s) / n)`` (``s`` at least 1; 0 where ``n - s`` is 0)."""
    s = max(1, math.floor(n / 2 + 1) - m)
    return NormalDist().inv_cdf((n - s) / n) if n > s else 0.0


def poisoned(
    attack: str,
    options: dict[str, Any],
    rows: Tensors,
    reference: Tensors,
    bad: torch.Tensor,
    noise: list[torch.Generator] | None = None,
    *,
    counts: tuple[int, int] | None = None,
    honest: Tensors | None = None,
) -> Tensors:
    """``rows`` with the rows where ``bad`` (``[R]`` bool) is set replaced by ``attack``'s (see the
    module); the floating tensors only (integer counters are as trained). ``noise``: one generator per
    malicious row, for ``gaussian``. ``counts``: the round's participants and malicious ones (``n``,
    ``m``), and ``honest``: the rows the omniscient attacks read, where ``rows`` are one process's part of
    the round (default: ``rows``' own, :func:`read_rows`)."""
    here = int(bad.sum())
    n, m = counts if counts is not None else (int(bad.numel()), here)
    if here == 0 or attack == "label_flip" or (attack == "backdoor" and float(options.get("scale", 1)) == 1):
        return rows
    read = honest if honest is not None else read_rows(rows, bad)
    out = dict(rows)
    shared: Tensors = {}
    if attack in ("min_max", "min_sum"):
        changes = {k: v - reference[k].to(v) for k, v in floating(read).items()}
        shared = crafted(attack, options, changes)[0]
    for name, stacked in rows.items():
        if not stacked.is_floating_point():
            continue
        ref = reference[name].to(stacked)
        mine = stacked[bad] - ref
        if attack == "sign_flip":
            change = -float(options.get("scale", DEFAULTS["scale"])) * mine
        elif attack == "scaling":
            change = float(options.get("scale", n / m)) * mine
        elif attack == "backdoor":
            change = float(options.get("scale", DEFAULTS["scale"])) * mine
        elif shared:
            change = shared[name].expand_as(mine)
        elif attack == "gaussian":
            sigma = float(options.get("sigma", DEFAULTS["sigma"]))
            if noise is None or len(noise) != here:
                raise ValueError("gaussian needs one generator per malicious row")
            draws = [torch.randn(ref.shape, generator=g, device=ref.device, dtype=ref.dtype) for g in noise]
            change = sigma * torch.stack(draws)
        elif attack == "free_rider":
            change = torch.zeros_like(mine)
        else:
            others = read[name] - ref
            mean = others.mean(dim=0)
            if attack == "alie":
                z = float(options.get("z", alie_z(n, m)))
                std = others.std(dim=0, correction=1 if len(others) > 1 else 0)
                change = (mean - z * std).expand_as(mine)
            else:  # ipm
                change = (-float(options.get("epsilon", DEFAULTS["epsilon"])) * mean).expand_as(mine)
        result = stacked.clone()
        result[bad] = ref + change
        out[name] = result
    return out


def read_rows(rows: Tensors, bad: torch.Tensor) -> Tensors:
    """The rows an omniscient attack reads: the honest ones (where ``bad`` is not set), or every row where
    nobody is honest (the malicious rows' own trained changes)."""
    honest = ~bad if not bool(bad.all()) else bad
    return {k: v[honest] for k, v in rows.items()}


def gathered_reads(
    attack: str, cohort: Cohort, every: np.ndarray, mask: torch.Tensor, rows: Tensors
) -> Tensors | None:
    """What an omniscient attack reads on rows spread over processes: the honest rows of every process
    (``every``: the whole group's malicious flags, ``mask`` this process's), all rows where nobody is
    honest, floating tensors only, all-gathered in ``cohort``'s order (a collective); None for the other
    attacks or rows held by one process (the attack then reads ``rows`` itself)."""
    if not cohort.spread or attack not in OMNISCIENT_ATTACKS:
        return None
    reads = mask if every.all() else ~mask  # nobody honest: the malicious rows' own
    return cohort.gather({k: v[reads] for k, v in floating(rows).items()})


@dataclass
class Adversary:
    """The run's malicious clients (``malicious``, sorted ids) and their attack from ``config``."""

    config: AdversaryConfig
    malicious: np.ndarray
    seed: int
    training: FederatedData | None = None  # data poisoning: the data the malicious clients train on
    backdoor: Backdoor | None = None

    @classmethod
    def of(
        cls,
        config: AdversaryConfig | None,
        data: FederatedData,
        seed: int,
        processes: int,
        spread: bool = False,
    ) -> Adversary | None:
        """The run's adversary (``None`` without an ``adversary`` block); refused under torchrun unless the
        caller poisons rows spread over processes as one process does (``spread``: the star, split, peer
        and cell rounds), and ``label_flip`` where the malicious clients' labels cannot be flipped for them
        alone, and a ``backdoor`` on data it cannot stamp (:meth:`~fedge.runtime.backdoor.Backdoor.of`)."""
        if config is None:
            return None
        if processes > 1 and not spread:
            raise ConfigError("adversary", "is not built for torchrun runs (the honest rows are rank-local)")
        bad = malicious_clients(config, data.num_clients, seed)
        adversary = cls(config, bad, seed)
        if config.attack == "label_flip":
            adversary.training = _flipped(data, bad)
        if config.attack == "backdoor":
            adversary.backdoor = Backdoor.of(config.options, data, bad, seed)
            adversary.training = adversary.backdoor.training
        return adversary

    def attacking(self, round_: int) -> bool:
        """Whether the malicious clients attack in ``round_``."""
        return round_ >= self.config.start_round

    def mask(self, round_: int, clients: np.ndarray) -> np.ndarray:
        """Which of the round's ``clients`` attack (none before ``start_round``)."""
        return np.isin(clients, self.malicious) & self.attacking(round_)

    def data(self, round_: int, data: FederatedData) -> FederatedData:
        """The data the round's participants train on: flipped labels (``label_flip``) or stamped samples
        (``backdoor``) for the malicious ones once they attack, else ``data``."""
        return self.training if self.training is not None and self.attacking(round_) else data

    def poison(
        self,
        round_: int,
        clients: np.ndarray,
        rows: Tensors,
        reference: Tensors,
        cohort: Cohort | None = None,
    ) -> Tensors:
        """The round's rows with the attacking participants' rows replaced: ``clients`` are the round's
        participants (in order), ``rows`` this process's rows of them (``cohort``'s; every row without
        one). The attacks read the round's counts, not the process's; on rows spread over processes an
        omniscient attack first all-gathers the rows it reads (the honest ones, floating tensors only)."""
        every = self.mask(round_, clients)
        if not every.any():
            return rows
        bad = every if cohort is None else every[cohort.rows]
        here = clients if cohort is None else clients[cohort.rows]
        device = next(iter(rows.values())).device
        mask = torch.as_tensor(bad, device=device)
        honest = None if cohort is None else gathered_reads(self.config.attack, cohort, every, mask, rows)
        noise = None
        if self.config.attack == "gaussian":
            keys = [(round_, int(c)) for c in here[bad]]
            noise = [torch_rng(self.seed, "adversary-gaussian", *key, device=device) for key in keys]
        attack, options, counts = self.config.attack, self.config.options, (len(clients), int(every.sum()))
        return poisoned(attack, options, rows, reference, mask, noise, counts=counts, honest=honest)

    def success(
        self, model: nn.Module, params: Tensors, buffers: Tensors, data: FederatedData, batch_size: int
    ) -> dict[str, float]:
        """An evaluation's figures of the model ``params``, ``buffers``: a backdoor's ``attack_success``
        on ``data``'s test set, in the evaluation's batches of ``batch_size`` (other attacks: none)."""
        if self.backdoor is None:
            return {}
        return {"attack_success": self.backdoor.success(model, params, buffers, data, batch_size)}

    def figures(
        self, round_: int, clients: np.ndarray, weights: torch.Tensor, pipeline: Pipeline
    ) -> dict[str, Any]:
        """``malicious``: how many participants attacked; ``malicious_kept``: the share of the result's
        weight that came from them, ``sum_M w_i k_i / sum_i w_i k_i`` with ``k_i`` how much the reducer
        kept row ``i`` (its :attr:`~fedge.aggregation.robust.RobustReport.kept`; 1 for the mean, whose
        figure is then their weight share). Reducers that report neither leave ``malicious_kept`` out.
        ``weights``: every participant's, on every process (the reports name every row)."""
        bad = self.mask(round_, clients)
        out: dict[str, Any] = {"malicious": int(bad.sum())}
        w = weights.double().cpu().numpy()
        by_output = kept_shares(pipeline, (1, len(clients)))  # one output, rows in the clients' order
        if by_output is None:
            return out
        kept = by_output[0]
        total = float((w * kept).sum())
        out["malicious_kept"] = float((w * kept)[bad].sum()) / total if total > 0 else 0.0
        return out


def kept_shares(pipeline: Pipeline, shape: tuple[int, int]) -> np.ndarray | None:
    """How much a site's reducer kept of each (output, row) of ``shape``: a robust reducer's
    :attr:`~fedge.aggregation.robust.RobustReport.kept` (0 for a row an output did not take), all 1 for
    the mean, ``None`` for a reducer that says neither (secure aggregation's reports are of its
    protocol, not of rows kept)."""
    reports = getattr(pipeline.reducer, "reports", None)
    if reports and all(isinstance(r, RobustReport) for r in reports):
        kept = np.zeros(shape)
        for report in reports:
            kept[report.output, list(report.rows)] = report.kept
        return kept
    return np.ones(shape) if pipeline.names[-1] == MEAN else None


def _flipped(data: FederatedData, bad: np.ndarray) -> FederatedData:
    """``data`` with the training labels of the clients ``bad`` flipped, ``y -> C - 1 - y``; refused
    (``adversary.attack``) for token labels or for shards an honest client shares."""
    if data.y_train.dim() > 1:
        raise ConfigError("adversary.attack", "label_flip flips class labels, not token sequences")
    if isinstance(data.client_train, ResampledClients):
        raise ConfigError(
            "adversary.attack", "label_flip needs disjoint client shards, not resampled clients"
        )
    owned = np.unique(np.concatenate([data.client_train[c] for c in bad]))
    honest = [data.client_train[c] for c in np.setdiff1d(np.arange(data.num_clients), bad)]
    if honest and np.isin(owned, np.concatenate(honest)).any():
        raise ConfigError(
            "adversary.attack", "label_flip needs the malicious clients' samples to be theirs alone"
        )
    labels = data.y_train.clone()
    index = torch.as_tensor(owned, device=labels.device)
    labels[index] = data.num_classes - 1 - labels[index]
    return data.with_labels(labels)
