"""Run metrics: the squared gradient norm of the global objective, the quantity every theorem bounds.

:func:`global_grad_norms` takes any algorithm: one holding a full model (FedAvg, centralized: ``model``,
``params``, ``buffers``) gets ``grad_sq``; a split-family algorithm (``parts``, ``client``, ``server``)
gets :func:`split_grad_norms`: G_c (client side, aux loss w.r.t. the trunk at the current aux
head), its joint version, G_s (server side, smashed data from the current trunk) and the end-to-end norm.
The measurement harness (:func:`fedge.empirical.harness.measured_run`) calls it between rounds; algorithms
do not import it (this package sits above them).
Full-batch over every client's training samples by default; ``max_samples_per_client`` uses a fixed
random subset instead (the same one at every call) to bound the cost on large datasets.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fedge.data.federated import FederatedData
from fedge.empirical.estimate import flat_gradient
from fedge.empirical.objective import (
    FederatedObjective,
    SplitState,
    Tensors,
    model_objective,
    split_objectives,
)


def grad_sq_norm(objective: FederatedObjective, params: Tensors) -> float:
    """``||grad F(params)||^2`` with equal client weights."""
    return float((flat_gradient(objective, {k: v.detach() for k, v in params.items()}) ** 2).sum())


def model_grad_norm(
    model: nn.Module,
    params: Tensors,
    buffers: Tensors,
    data: FederatedData,
    *,
    max_samples_per_client: int | None = None,
    seed: int = 0,
) -> float:
    """``||grad F||^2`` of the whole model's cross-entropy at ``params``."""
    objective = model_objective(
        model, buffers, data, max_samples_per_client=max_samples_per_client, seed=seed
    )
    return grad_sq_norm(objective, params)


def _strip(tensors: Tensors, prefix: str) -> Tensors:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def split_state(algorithm: Any) -> SplitState:
    """The current split model of a split-family algorithm (``fedge.algorithms.split``): its ``parts``
    (trunk, server, local = trunk + aux head), the global client state (``trunk.`` / ``aux.`` names) and
    the server state. Without a shared aux head (``aggregate_aux: false``) there is no global x_A to
    define F^c at, so the state carries no aux head and the client-side norms are left out."""
    parts, client, server = algorithm.parts, algorithm.client, algorithm.server
    aux = dict(parts.local.named_children()).get("aux") if getattr(algorithm, "shares_aux", True) else None
    return SplitState(
        trunk=parts.trunk,
        server=parts.server,
        trunk_params=_strip(client["params"], "trunk."),
        server_params=server.params,
        aux=aux,
        aux_params=_strip(client["params"], "aux.") if aux is not None else None,
        trunk_buffers=_strip(client["buffers"], "trunk."),
        server_buffers=server.buffers,
        aux_buffers=_strip(client["buffers"], "aux.") if aux is not None else None,
    )


def is_split(algorithm: Any) -> bool:
    """Whether ``algorithm`` has the split family's shape (``parts``, ``client``, ``server``)."""
    return all(hasattr(algorithm, a) for a in ("parts", "client", "server"))


def global_grad_norms(
    algorithm: Any,
    *,
    max_samples_per_client: int | None = None,
    seed: int | None = None,
    sides: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """Squared gradient norms of the global objective(s) of ``algorithm``'s current model, on its data.

    A split-family algorithm gets :func:`split_grad_norms` of its :func:`split_state`; an algorithm
    holding one full model (``model``, ``params``, ``buffers``: FedAvg, centralized) gets
    ``{"grad_sq": ||grad F||^2}``. ``sides`` limits a split model's objectives (e.g. ``("client",
    "server")``; default: all four).
    """
    data = algorithm.ctx.data
    seed = algorithm.ctx.seed if seed is None else seed
    if is_split(algorithm):
        return split_grad_norms(
            split_state(algorithm),
            data,
            max_samples_per_client=max_samples_per_client,
            seed=seed,
            sides=sides,
        )
    missing = [a for a in ("model", "params", "buffers") if not hasattr(algorithm, a)]
    if missing:
        raise TypeError(
            f"{type(algorithm).__name__} has neither split parts nor a full model ({', '.join(missing)})"
        )
    value = model_grad_norm(
        algorithm.model,
        algorithm.params,
        algorithm.buffers,
        data,
        max_samples_per_client=max_samples_per_client,
        seed=seed,
    )
    return {"grad_sq": value}


def split_grad_norms(
    state: SplitState,
    data: FederatedData,
    *,
    max_samples_per_client: int | None = None,
    seed: int = 0,
    sides: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """``grad_sq_client`` (G_c), ``grad_sq_client_joint``, ``grad_sq_server`` (G_s) and
    ``grad_sq_end_to_end`` of a split model (the client entries only when it has an aux head), or only
    those named in ``sides``."""
    objectives = split_objectives(state, data, max_samples_per_client=max_samples_per_client, seed=seed)
    return {
        f"grad_sq_{name}": grad_sq_norm(obj, params)
        for name, (obj, params) in objectives.items()
        if sides is None or name in sides
    }
