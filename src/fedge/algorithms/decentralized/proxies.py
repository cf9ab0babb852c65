"""Feature proxies: the gradient (or mean activation) of a pair's probe loss, and its cosine to a reference.

A pair ``(requester i, holder k)`` is the model of i's shared and k's private parameters on k's probe
batch (:mod:`~fedge.algorithms.decentralized.probes`). Its proxy is the gradient of the probe loss
restricted to the proxy layer (:mod:`~fedge.algorithms.decentralized.proxy_layers`), or the featurizer's
mean activation; AFIND+ scores neighbours by the proxies' cosine to the requester's own. Pairs are
gathered chunk by chunk and evaluated under ``torch.func.vmap`` in eval mode (no dropout, BatchNorm
running statistics untouched).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, grad_and_value, vmap

from fedge.algorithms.decentralized.probes import CHUNK_FLOATS, ProbeBatches, gather
from fedge.algorithms.decentralized.proxy_layers import LinearProxy, linear_proxy
from fedge.algorithms.decentralized.scores import clip_rows, cosine
from fedge.data.federated import FederatedData
from fedge.engine import weighted_mean
from fedge.errors import ConfigError
from fedge.models import SplitModel, output_shape, split
from fedge.tensors import Tensors


class Prober:
    """Evaluates pairs ``(shared_from, private_from, data_from)`` of rows of a stacked bank.

    ``private`` names the parameters and buffers taken from ``private_from`` (the holder's private
    head); everything else comes from ``shared_from``. ``data_from`` picks the probe batch.
    """

    def __init__(
        self,
        model: SplitModel,
        input_shape: tuple[int, ...],
        proxy_names: Sequence[str],
        private: set[str],
        kind: str,
    ):
        self.model = model
        self.proxy_names = list(proxy_names)
        self.private = private
        self.kind = kind
        self.featurizer = split(model, len(model) - 1)[0] if len(model) > 1 else None
        self.featurizer_keys = set(self.featurizer.state_dict()) if self.featurizer is not None else set()
        if kind == "activation":
            if self.featurizer is None:
                raise ConfigError("algorithm.proxy", "activation proxies need a model with a head block")
            self.dim = math.prod(output_shape(self.featurizer, input_shape))
        else:
            sizes = dict(model.named_parameters())
            self.dim = sum(sizes[k].numel() for k in self.proxy_names)
        self.linear = linear_proxy(model, self.proxy_names, input_shape) if kind == "gradient" else None

    def _gather(self, stacked: Tensors, shared_from: torch.Tensor, private_from: torch.Tensor) -> Tensors:
        return gather(stacked, self.private, shared_from, private_from)

    def _loss(self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
        logits = functional_call(self.model, {**params, **buffers}, (x,))
        return weighted_mean(F.cross_entropy(logits, y, reduction="none"), w)

    def _features(self, params: Tensors, buffers: Tensors, x: torch.Tensor) -> torch.Tensor:
        if self.featurizer is None:  # the constructor refuses activation proxies without one
            raise ConfigError("algorithm.proxy", "activation proxies need a model with a head block")
        state = {k: v for k, v in {**params, **buffers}.items() if k in self.featurizer_keys}
        return functional_call(self.featurizer, state, (x,)).flatten(1)

    def _one(self, params: Tensors, buffers: Tensors, x, y, w, clip: float | None):
        """The proxy of one pair (clipped per example and summed when ``clip`` is set) and its loss."""
        proxy_p = {k: params[k] for k in self.proxy_names}
        rest = {k: v for k, v in params.items() if k not in proxy_p}
        if self.kind == "activation":
            feats = self._features(params, buffers, x)
            loss = self._loss(params, buffers, x, y, w)
            if clip is None:
                return (feats * w[:, None]).sum(0) / w.sum().clamp_min(1.0), loss
            return (clip_rows(feats, clip) * w[:, None]).sum(0), loss
        if clip is None:
            grads, loss = grad_and_value(lambda p: self._loss({**p, **rest}, buffers, x, y, w))(proxy_p)
            return torch.cat([grads[k].reshape(-1) for k in self.proxy_names]), loss

        def single(p, xi, yi):
            return self._loss({**p, **rest}, buffers, xi[None], yi[None], torch.ones(1, device=xi.device))

        per = vmap(grad(single), in_dims=(None, 0, 0))(proxy_p, x, y)
        flat = torch.cat([per[k].reshape(len(y), -1) for k in self.proxy_names], dim=1)
        return (clip_rows(flat, clip) * w[:, None]).sum(0), self._loss(params, buffers, x, y, w)

    def proxies(
        self,
        params: Tensors,
        buffers: Tensors,
        shared_from: torch.Tensor,
        private_from: torch.Tensor,
        data_from: torch.Tensor,
        data: FederatedData,
        batches: ProbeBatches,
        clip: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[R, D]`` proxies (per-example clipped sums when ``clip`` is set) and ``[R]`` probe losses."""
        per_pair = sum(v[0].numel() for v in params.values()) * 3
        per_pair += batches.index.shape[1] * (self.dim if clip is not None else 0)
        chunk = max(1, CHUNK_FLOATS // max(per_pair, 1))
        run = vmap(lambda p, b, x, y, w: self._one(p, b, x, y, w, clip))
        out, losses = [], []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(shared_from), chunk):
                part = slice(start, start + chunk)
                s, p, d = shared_from[part], private_from[part], data_from[part]
                ix, w = batches.index[d], batches.weight[d]
                proxy, loss = run(
                    self._gather(params, s, p),
                    self._gather(buffers, s, p),
                    data.x_train[ix],
                    data.y_train[ix],
                    w,
                )
                out.append(proxy.detach())
                losses.append(loss.detach())
        finally:
            self.model.train(was_training)
        if not out:
            return torch.zeros(0, self.dim, device=data.device), torch.zeros(0, device=data.device)
        return torch.cat(out), torch.cat(losses)

    def _linear_cosine(
        self, linear: LinearProxy, params: Tensors, buffers: Tensors, x, y, w, ref: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos(ref, proxy)`` of one pair whose proxy is a linear layer's gradient, and the probe loss,
        without forming the proxy.

        The gradient of a linear layer over a batch is ``G = D^T X`` (``D``: the loss's gradients at the
        layer's outputs, one row per sample; ``X``: its inputs), plus ``1^T D`` for the bias. So
        ``<R, G> = sum(D * (X R^T))`` and ``|G|^2 = sum((D D^T) * (X X^T + 1))``: products of the batch's
        rows with the layer's outputs, instead of a ``[out x in]`` gradient per pair (157,000 values for
        an MLP 784-200-10, written, read back and reduced once per probed pair). The same cosine up to
        rounding; it took the probes of a 100-client AFIND+ round (W6) from 10.6 s to 2.7 s.
        """
        layer = self.model.get_submodule(linear.name)
        captured: dict[str, torch.Tensor] = {}

        def loss_at(shift: torch.Tensor):
            def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor):
                captured["x"] = inputs[0]
                return output + shift

            handle = layer.register_forward_hook(hook)
            try:
                return self._loss(params, buffers, x, y, w), captured
            finally:
                handle.remove()

        weight = params[f"{linear.name}.weight"]
        shift = torch.zeros(len(y), linear.out_features, dtype=weight.dtype, device=weight.device)
        d, (loss, inputs) = grad_and_value(loss_at, has_aux=True)(shift)
        rows = inputs["x"].reshape(-1, linear.in_features)
        d = d.reshape(-1, linear.out_features)
        ref_w = ref[: linear.weight_size].reshape(linear.out_features, linear.in_features)
        dot = (d * (rows @ ref_w.T)).sum()
        gram = rows @ rows.T
        if linear.bias:
            dot = dot + (d.sum(0) * ref[linear.weight_size :]).sum()
            gram = gram + 1.0
        norm2 = ((d @ d.T) * gram).sum().clamp_min(0.0)
        norms = torch.linalg.vector_norm(ref).double() * norm2.double().sqrt()
        return (dot.double() / norms.clamp_min(1e-30)).clamp(-1.0, 1.0), loss.detach()

    def similarities(
        self,
        params: Tensors,
        buffers: Tensors,
        reference: torch.Tensor,
        data: FederatedData,
        batches: ProbeBatches,
        clip: float | None = None,
        noise: tuple[float, torch.Generator] | None = None,
        requesters: slice | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every requester i against every holder k: ``cos(reference[i], proxy(i, k))`` and the probe loss.

        Returns two ``[n, n]`` float64 matrices. A nested vmap (requesters outside, holders inside) shares
        each requester's parameters and every holder's batch instead of copying them per pair: the fast
        path when most pairs are probed. With ``clip`` the holders' proxies are clipped per example and
        summed; ``noise = (std, generator)`` then adds Gaussian noise of that std per coordinate before
        dividing by the batch size (the DP mechanism of ``scores.gaussian_mechanism``).

        ``requesters`` (a slice of the n clients) computes only those rows (``[len, n]``; ``reference``
        then holds theirs): a rank's share under torchrun, noise as one call over all rows gives."""
        n = len(batches.weight)  # holders; requesters of the whole matrix
        requesters = requesters or slice(0, n)
        first = requesters.start
        x, y, w = data.x_train[batches.index], data.y_train[batches.index], batches.weight
        linear = self.linear if clip is None and noise is None else None
        outer = self._pairs(params, buffers, x, y, w, clip, linear)
        chunk = self._chunk_rows(n, batches.index.shape[1], clip, linear)
        sims, losses = [], []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, min(n, requesters.stop), chunk):  # one process's chunks
                stop = min(start + chunk, n)
                rows = slice(max(start, first), min(stop, requesters.stop))
                eps = self._noise(noise, slice(start, stop), rows, n, x.device)
                if rows.stop <= rows.start:
                    continue
                sp = {k: v[rows] for k, v in params.items() if k not in self.private}
                sb = {k: v[rows] for k, v in buffers.items() if k not in self.private}
                sim, loss = outer(sp, sb, reference[rows.start - first : rows.stop - first], eps)
                sims.append(sim.detach())
                losses.append(loss.detach())
        finally:
            self.model.train(was_training)
        if not sims:
            empty = torch.zeros(0, n, dtype=torch.float64, device=x.device)
            return empty, empty.clone()
        return torch.cat(sims).double(), torch.cat(losses).double()

    def _noise(
        self, noise: tuple[float, torch.Generator] | None, chunk: slice, rows: slice, n: int, device
    ) -> torch.Tensor:
        """The DP noise of ``rows`` in a chunk of requesters of :meth:`similarities` (zeros without
        ``noise``): drawn for the whole chunk, then the rows taken, so a share of the rows gets the
        numbers one call over all rows gives."""
        if noise is None:
            return torch.zeros(max(rows.stop - rows.start, 0), device=device)
        std, generator = noise
        eps = torch.randn((chunk.stop - chunk.start, n, self.dim), generator=generator)
        return eps[rows.start - chunk.start : rows.stop - chunk.start].to(device) * std

    def _pairs(
        self,
        params: Tensors,
        buffers: Tensors,
        x: torch.Tensor,
        y: torch.Tensor,
        w: torch.Tensor,
        clip: float | None,
        linear: LinearProxy | None,
    ) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """The nested vmap of :meth:`similarities`: requesters' shared parts outside, every holder's
        private part and probe batch inside; one call gives a chunk of requesters' rows."""
        private_p = {k: v for k, v in params.items() if k in self.private}
        private_b = {k: v for k, v in buffers.items() if k in self.private}
        count = w.sum(dim=1).clamp_min(1.0)[:, None]

        def holder(sp: Tensors, sb: Tensors, pp: Tensors, pb: Tensors, xk, yk, wk, ref):
            if linear is not None:
                return self._linear_cosine(linear, {**sp, **pp}, {**sb, **pb}, xk, yk, wk, ref)
            return self._one({**sp, **pp}, {**sb, **pb}, xk, yk, wk, clip)

        inner = vmap(holder, in_dims=(None, None, 0, 0, 0, 0, 0, None))

        def requester(sp: Tensors, sb: Tensors, ref: torch.Tensor, eps: torch.Tensor):
            if linear is not None:
                return inner(sp, sb, private_p, private_b, x, y, w, ref)
            proxies, losses = inner(sp, sb, private_p, private_b, x, y, w, ref)
            if clip is not None:
                proxies = (proxies + eps) / count
            return cosine(ref.expand_as(proxies), proxies), losses

        return vmap(requester)

    def _chunk_rows(self, n: int, batch: int, clip: float | None, linear: LinearProxy | None) -> int:
        """Requesters per chunk of :meth:`similarities`, so a chunk's pair tensors stay within
        ``CHUNK_FLOATS`` values."""
        if linear is not None:  # per pair: the layer's inputs and output gradients, not the proxy
            per_requester = n * batch * 2 * (linear.in_features + linear.out_features)
        else:
            per_requester = n * (self.dim * (2 + (batch if clip is not None else 0)))
        return max(1, CHUNK_FLOATS // max(per_requester, 1))
