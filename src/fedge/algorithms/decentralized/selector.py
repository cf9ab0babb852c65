"""AFIND+ neighbour identification as a component: whom each client talks to, and with what weights.

:class:`AfindSelector` keeps, per client i, the helpfulness scores ``p[i, :]`` (Eqs. 8-9), the last proxy
similarities and the adaptive threshold ``theta_i`` (Eqs. 10-13); it probes neighbours, selects a coreset per
round (with a cold start and a fallback the paper leaves open, ``k0`` and ``k_min``) and turns reported
smoothed losses into Boltzmann mixing weights (Eqs. 15-16). The ``afind`` algorithm drives it; Ditto and
Dis-PFL use it in place of random peers ("AFIND+ composes with other DFL optimisers", Sec. 5.2, Fig. 5).

Ablation switches (Table 2): ``selection`` random (the FedAvg-FT row) / topk (+i) / threshold (+ii) and
``aggregation`` uniform / boltzmann (+iii). DP (Table 4, App. C.4): Gaussian mechanism on the shared proxies
(our reading of the paper's noised "delta") or on the transmitted model updates (``dp.target="update"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedge.algorithms.decentralized.config import SelectorConfig
from fedge.algorithms.decentralized.probes import ProbeBatches
from fedge.algorithms.decentralized.proxies import Prober
from fedge.algorithms.decentralized.proxy_layers import proxy_layer
from fedge.algorithms.decentralized.scores import (
    adaptive_threshold,
    boltzmann_weights,
    clip_rows,
    cosine,
    full_scores,
    gaussian_mechanism,
    partial_scores,
    selection_metrics,
    smoothed_loss,
    top_k,
)
from fedge.algorithms.decentralized.trace import selection_trace
from fedge.algorithms.decentralized.view import PeerView
from fedge.rng import numpy_rng, torch_rng
from fedge.tensors import Tensors


@dataclass(frozen=True)
class Plan:
    """One round's decisions: probed pairs, pre-training losses ``[n, n]``, the coreset, fallbacks, and
    each client's threshold the selection used."""

    probed: torch.Tensor
    pre: torch.Tensor
    chosen: torch.Tensor
    fallbacks: int
    theta: torch.Tensor


class AfindSelector:
    """Scores, threshold and selection state of every client; probes the host's rows through its view.

    ``topk_count`` is the fixed count of the ``topk`` and ``random`` selections (the host's ``peers``).
    """

    def __init__(self, view: PeerView, cfg: SelectorConfig, topk_count: int):
        self.view = view
        self.cfg = cfg
        self.topk_count = topk_count
        n = view.num_clients
        device = view.device
        self.available = view.neighbours
        self.eye = torch.eye(n, dtype=torch.bool, device=device)
        names = proxy_layer(view.model, cfg.proxy_layer)
        self.prober = Prober(view.model, view.data.input_shape, names, set(view.private), cfg.proxy)
        degree = self.available.sum(dim=1, keepdim=True).clamp_min(1).double()
        self.p = self.available.double() / degree  # p_ij^0 = 1 / n_i
        self.sim = torch.zeros(n, n, dtype=torch.float64, device=device)
        self.theta = torch.full((n,), cfg.tau / 2, dtype=torch.float64, device=device)
        self.previous = torch.zeros(n, n, dtype=torch.bool, device=device)
        self.started = False
        self.mixing: torch.Tensor | None = None  # the round's mixing weights, for its trace

    # ----- probing ----------------------------------------------------------------------------------
    def probe_set(self, t: int) -> torch.Tensor:
        """Pairs probed this round: all neighbours (Eq. 8 / cold start) or last coreset + exploration."""
        if self.cfg.selection == "random":
            return torch.zeros_like(self.available)
        if self.cfg.p_update == "full" or not self.started:
            return self.available.clone()
        others = (self.available & ~self.previous).cpu().numpy()
        explore = np.zeros_like(others)
        for i, row in enumerate(others):
            options = np.flatnonzero(row)
            if len(options) and self.cfg.explore:
                size = min(self.cfg.explore, len(options))
                explore[
                    i, numpy_rng(self.view.seed, "explore", t, i).choice(options, size, replace=False)
                ] = True
        return self.previous | torch.as_tensor(explore, device=self.available.device)

    def observe(self, t: int, batches: ProbeBatches) -> tuple[torch.Tensor, torch.Tensor]:
        """Probe the round's pairs at the requesters' current models and update the scores.

        Returns the probed pairs and the pre-training losses ``F_k(w_i, beta_k)`` on k's probe batch
        (``[n, n]``, NaN where not probed; the diagonal holds each client's own loss). The probes are
        split by requester over the run's processes (:meth:`probe_rows`, one gather); the scores are
        then updated on every process from the same matrices, and the probe sends counted on each.
        """
        view, n = self.view, self.view.num_clients
        device = self.available.device
        probed = self.probe_set(t)
        pre = torch.full((n, n), float("nan"), dtype=torch.float64, device=device)
        if not probed.any():
            return probed, pre
        probes = view.map_rows(n, lambda rows: {"probe": self.probe_rows(t, rows, probed, batches)})
        measured = probes["probe"]
        i, k = probed.nonzero(as_tuple=True)
        own = torch.arange(n, device=device)
        self.sim[i, k], pre[i, k] = measured[i, 0, k], measured[i, 1, k]
        pre[own, own] = measured[own, 1, own]
        if self.cfg.p_update == "full" or not self.started:
            self.p = full_scores(self.sim, self.available, self.cfg.upsilon)
        else:
            self.p = partial_scores(self.p, self.sim, probed, self.cfg.upsilon)
        view.request(probed)
        view.report(probed, "proxy", {"proxy": (self.prober.dim,)})
        return probed, pre

    def probe_rows(self, t: int, rows: slice, probed: torch.Tensor, batches: ProbeBatches) -> torch.Tensor:
        """The requesters ``rows``' probes: ``[len, 2, n]`` float64, similarities then losses, each
        requester's own loss on the diagonal (entries of unprobed pairs are meaningless).

        Each requester's own proxy, then its probed holders': one nested vmap over the rows' requesters
        and every holder when most pairs are probed, else (and where malicious holders poison their
        answers, ``adversary.probes: poisoned``) pair by pair. The DP noise is drawn for the
        whole round as one process draws it and the rows' part taken, so any split gives the same numbers.
        """
        view, n = self.view, self.view.num_clients
        (params, buffers), data = view.current(), view.data
        adversary = view.adversary if view.adversary and view.adversary.poisons_probes(t) else None
        if adversary is not None:  # label_flip: the malicious holders probe on their flipped labels
            data = adversary.data(t, data)
        device = self.available.device
        dp = self.cfg.dp if self.cfg.dp is not None and self.cfg.dp.target == "proxy" else None
        clip = None if dp is None else dp.clip  # own proxy clipped alike; only the shared ones get noise
        own = torch.arange(n, device=device)[rows]
        mine, own_loss = self.prober.proxies(params, buffers, own, own, own, data, batches, clip)
        generator = torch_rng(view.seed, "dp-noise", t)
        i, k = probed.nonzero(as_tuple=True)  # row-major: the rows' pairs are one contiguous run
        bounds = torch.tensor([rows.start, rows.stop], device=device)
        first, last = (int(b) for b in torch.searchsorted(i, bounds))
        backward = self.cfg.proxy == "gradient"
        view.count_probes(own, batches, backward)  # each client's own proxy, then every holder's probes
        view.count_probes(k[first:last], batches, backward)
        local = torch.arange(len(own), device=device)
        out = torch.zeros(len(own), 2, n, dtype=torch.float64, device=device)
        if 2 * len(i) >= n * (n - 1) and adversary is None:  # most pairs: one nested vmap
            noise = None if dp is None else (dp.sigma * dp.clip, generator)
            sim, loss = self.prober.similarities(params, buffers, mine, data, batches, clip, noise, rows)
            out[:, 0], out[:, 1] = sim, loss
        elif last > first:
            ri, rk = i[first:last], k[first:last]
            theirs, loss = self.prober.proxies(params, buffers, ri, rk, rk, data, batches, clip)
            if dp is not None:
                count = batches.weight[rk].sum(dim=1)
                theirs = gaussian_mechanism(theirs, count, dp.clip, dp.sigma, generator, first, len(i))
            if adversary is not None:  # poisoned answers, pair by pair (the proxies are formed)
                theirs = adversary.proxies(t, ri, rk, theirs)
            out[ri - rows.start, 0, rk] = cosine(mine[ri - rows.start], theirs).double()
            out[ri - rows.start, 1, rk] = loss.double()
        out[local, 1, own] = own_loss.double()
        return out

    # ----- selection and weights ------------------------------------------------------------------
    def select(self, t: int) -> tuple[torch.Tensor, int]:
        """The coreset ``C[i, j]`` of round ``t`` and how many clients fell back to top-``k_min``."""
        cfg, available = self.cfg, self.available
        if cfg.selection == "random":
            drawn = self.view.random_peers(t, self.topk_count)
            return torch.as_tensor(drawn, device=available.device), 0
        if cfg.selection == "topk":
            return top_k(self.p, available, self.topk_count), 0
        if not self.started:
            return top_k(self.p, available, cfg.k0), 0  # cold start: the scores are still uniform
        chosen = available & (self.p >= self.theta[:, None])
        empty = ~chosen.any(dim=1) & available.any(dim=1)
        if empty.any():
            fallback = top_k(self.p, available, cfg.k_min)
            chosen = torch.where(empty[:, None], fallback, chosen)
        return chosen, int(empty.sum())

    def members(self, chosen: torch.Tensor) -> torch.Tensor:
        """Who enters client i's average: its coreset, plus itself (``include_self``, or if C_i is empty)."""
        empty = ~chosen.any(dim=1, keepdim=True)
        return chosen | (self.eye & (empty | self.cfg.include_self))

    def weights(self, chosen: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        """Row-stochastic ``[n, n]`` mixing weights: Boltzmann over smoothed losses, or uniform."""
        members = self.members(chosen)
        if self.cfg.aggregation == "boltzmann":
            self.mixing = boltzmann_weights(torch.nan_to_num(losses, nan=0.0), members, self.cfg.t_agg)
        else:
            w = members.double()
            self.mixing = w / w.sum(dim=1, keepdim=True)
        return self.mixing

    def finish(self, chosen: torch.Tensor) -> None:
        """Threshold for the next round from this round's coreset similarities (Eqs. 10-13)."""
        cfg = self.cfg
        members = chosen if cfg.entropy_set == "coreset" else self.available
        self.theta = adaptive_threshold(
            self.sim, members, cfg.tau, cfg.entropy_reduce, cfg.normalize, cfg.confidence_direction
        )
        self.previous = chosen.clone()
        self.started = True

    def smoothed(self, pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
        """Eq. 15 with this selector's gamma."""
        return smoothed_loss(pre, post, self.cfg.gamma)

    def missing_pre_losses(
        self, pre: torch.Tensor, chosen: torch.Tensor, batches: ProbeBatches
    ) -> torch.Tensor:
        """Fill ``pre[i, j] = F_j(w_i, beta_j)`` for chosen pairs (and selves) that were not probed."""
        need = (self.members(chosen) | self.eye) & torch.isnan(pre)
        if need.any():
            i, j = need.nonzero(as_tuple=True)
            pre = pre.clone()
            pre[i, j] = self.view.losses_on(*self.view.current(), (i, j, j), batches).double()
        return pre

    def noisy_updates(self, start: Tensors, trained: Tensors, t: int, batch_size: int) -> Tensors:
        """``start + clip(trained - start) + N(0, sigma^2 C^2) / L`` per row over the shared tensors
        (``dp.target="update"``); other tensors are returned as trained."""
        dp = self.cfg.dp
        if dp is None:
            raise ValueError("noisy updates need the selector's dp settings")
        names = list(self.view.shared(trained))
        delta = torch.cat([(trained[k] - start[k]).reshape(len(trained[k]), -1) for k in names], dim=1)
        gen = torch_rng(self.view.seed, "dp-update", t)
        noise = torch.randn(delta.shape, generator=gen, dtype=delta.dtype).to(delta.device)
        noisy = clip_rows(delta, dp.clip) + noise * (dp.sigma * dp.clip / batch_size)
        out, offset = dict(trained), 0
        for k in names:
            size = trained[k][0].numel()
            out[k] = start[k] + noisy[:, offset : offset + size].reshape(trained[k].shape)
            offset += size
        return out

    # ----- one round, as hosts use it -------------------------------------------------------------
    def begin(self, t: int, batches: ProbeBatches) -> Plan:
        """Probe, score and select for round ``t`` (at the host bank's current models)."""
        probed, pre = self.observe(t, batches)
        theta, self.mixing = self.theta.clone(), None
        chosen, fallbacks = self.select(t)
        if self.cfg.aggregation == "boltzmann":
            pre = self.missing_pre_losses(pre, chosen, batches)
        return Plan(probed, pre, chosen, fallbacks, theta)

    def standard_weights(
        self, plan: Plan, params: Tensors, buffers: Tensors, batches: ProbeBatches
    ) -> torch.Tensor:
        """Mixing weights when every client trained its own model (``params``: trained rows in client order).

        ``F~[i, j] = (1 - gamma) F_j(w_j^{t+1}) + gamma F_j(w_i^t)`` on j's probe batch (Eq. 15, standard).
        """
        smoothed = torch.full_like(plan.pre, float("nan"))
        if self.cfg.aggregation == "boltzmann":
            own = torch.arange(self.view.num_clients, device=plan.pre.device)
            post = self.view.losses_on(params, buffers, (own, own, own), batches).double()
            smoothed = self.smoothed(plan.pre, post[None, :])  # column j: j's data
        return self.weights(plan.chosen, smoothed)

    def end(self, t: int, plan: Plan) -> dict[str, float]:
        """Update the threshold, send the exchange's messages and return the round's metrics."""
        view, chosen = self.view, plan.chosen
        self.finish(chosen)
        view.request(chosen & ~plan.probed)
        view.reply(chosen)
        if self.cfg.aggregation == "boltzmann":
            view.report(chosen, "loss", {"loss": (1,)})
        return {
            **selection_metrics(chosen),
            "fallbacks": plan.fallbacks,
            "probed": int(plan.probed.sum()),
            **selection_trace(plan.theta, chosen, self.available, self.p, self.sim, self.mixing),
        }

    # ----- state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "p": self.p,
            "sim": self.sim,
            "theta": self.theta,
            "previous": self.previous,
            "started": self.started,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.available.device
        self.p, self.sim = state["p"].to(device), state["sim"].to(device)
        self.theta, self.previous = state["theta"].to(device), state["previous"].to(device)
        self.started = bool(state["started"])
