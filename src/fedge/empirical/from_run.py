"""SplitFed bound inputs for a run config: settings read from the config, constants estimated from the run's
data and initial model (the estimators of :mod:`fedge.empirical.estimate`), anything in the ``theory:`` block
taking precedence.

Read from the config: T = ``rounds``, m = ``partition.num_clients`` and, by algorithm family,

- FedAvg-like (``fraction``, ``local_epochs``, ``batch_size``, ``optimizer``): n (``None`` when every
  client takes part), K = local epochs x the largest client's batches per epoch (the bounds grow with K,
  so the largest is the safe choice), mu_L = the learning rate, l = 1, client side only (no server model);
- local-loss split learning (``cse_fsl``, ``fsl_an``): n from ``participation`` / ``clients_per_round``,
  K = ``local_steps`` (or epochs x batches), mu_L = the client learning rate; for CSE-FSL's theory variant
  (``server_trigger: every_l_rounds``) also l = ``server_every`` and mu = the server learning rate (divided
  by m with ``server_lr_divide_by_m``), both sides; otherwise the client side only (the server is not the
  analysed one). Split algorithms that return cut-layer gradients are outside these theorems.

Estimated at the initial model when not given: L, sigma_L^2 at the run's batch size and sigma_G^2 (the
max over the client objective F^c, w.r.t. the trunk at the aux head, and the server objective F^s, since
the theorems share one set of constants; the whole model for FedAvg), and delta_F = F(x^0) - 0 per side
(cross-entropy is >= 0), on at most ``probe`` samples per client.
"""

from __future__ import annotations

import math
from typing import Any

from fedge.config import RunConfig
from fedge.empirical.estimate import estimate_constants
from fedge.empirical.metrics import is_split, split_state
from fedge.empirical.objective import FederatedObjective, Tensors, model_objective, split_objectives
from fedge.errors import ConfigError
from fedge.runner.loop import Built, build_run

CONSTANTS = ("L", "sigma_L2", "sigma_G2", "delta_F", "delta_F_server")


def _local_steps(config: RunConfig, built: Built) -> int:
    algorithm = config.algorithm
    if getattr(algorithm, "local_steps", None) is not None:
        return algorithm.local_steps
    sizes = built.context.data.client_sizes()
    return algorithm.local_epochs * int(math.ceil(sizes.max() / algorithm.batch_size))


def _settings(config: RunConfig, built: Built) -> tuple[dict[str, Any], dict[str, str]]:
    algorithm, m = config.algorithm, config.partition.num_clients
    derived: dict[str, Any] = {"paper": "sfl", "T": config.rounds, "m": m}
    source = {"T": "rounds", "m": "partition.num_clients"}
    if hasattr(algorithm, "fraction"):
        count = max(1, round(algorithm.fraction * m))
        derived.update(
            n=None if count >= m else count,
            K=_local_steps(config, built),
            mu_L=algorithm.optimizer.lr,
            l=1,
            sides="client",
        )
        source.update(
            n="algorithm.fraction (drawn without replacement; Theorem 2 assumes with)",
            K="local_epochs x largest client's batches",
            mu_L="algorithm.optimizer.lr",
            l="1 (no server model)",
            sides="client only (no server model)",
        )
        return derived, source
    if not hasattr(algorithm, "participation"):
        raise ConfigError("algorithm.name", f"cannot read {algorithm.name}'s settings; give them in theory:")
    if not built.algorithm.clients.has_aux:
        raise ConfigError(
            "algorithm.name",
            f"{algorithm.name} returns cut-layer gradients; the sfl theorems analyse local-loss clients",
        )
    full = algorithm.participation == "full"
    derived.update(
        n=None if full else algorithm.clients_per_round,
        K=_local_steps(config, built),
        mu_L=algorithm.optimizer.lr,
    )
    source.update(
        n="algorithm.participation" + ("" if full else " / clients_per_round"),
        K="algorithm.local_steps" if algorithm.local_steps else "local_epochs x largest client's batches",
        mu_L="algorithm.optimizer.lr",
    )
    if algorithm.participation == "without_replacement":
        source["n"] += " (without replacement; Theorems 2 and 4 assume with)"
    if getattr(algorithm, "server_trigger", None) == "every_l_rounds":
        server_lr = (algorithm.server_optimizer or algorithm.optimizer).lr
        derived.update(
            l=algorithm.server_every, mu=server_lr / m if algorithm.server_lr_divide_by_m else server_lr
        )
        source.update(l="algorithm.server_every", mu="server learning rate (per server step)")
    else:
        derived.update(l=1, sides="client")
        source.update(l="1 (client side only)", sides="client only (the server is not the analysed one)")
    if algorithm.aggregation != "uniform":
        source["m"] += " (aggregation weighs by size; the theorems use 1/m)"
    return derived, source


def _objectives(built: Built, probe: int | None) -> dict[str, tuple[FederatedObjective, Tensors]]:
    algorithm, data, seed = built.algorithm, built.context.data, built.config.seed
    if is_split(algorithm):
        found = split_objectives(split_state(algorithm), data, max_samples_per_client=probe, seed=seed)
        return {side: found[side] for side in ("client", "server")}
    objective = model_objective(
        algorithm.model, algorithm.buffers, data, max_samples_per_client=probe, seed=seed
    )
    return {"client": (objective, algorithm.params)}


def sfl_inputs_from_run(
    config: RunConfig, theory: dict[str, Any], *, probe: int | None = 512, power_iters: int = 20
) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``theory`` block completed from ``config``: the raw inputs and where each value came from."""
    if theory.get("paper", "sfl") != "sfl":
        raise ConfigError("theory.paper", "only the sfl bounds can be derived from a run config")
    built = build_run(config)
    derived, source = _settings(config, built)
    if any(k not in theory for k in CONSTANTS):
        batch_size = config.algorithm.batch_size
        found = {
            side: estimate_constants(
                obj, params, batch_size=batch_size, power_iters=power_iters, seed=config.seed
            )
            for side, (obj, params) in _objectives(built, probe).items()
        }
        values = {
            "L": max(c.L for c in found.values()),
            "sigma_L2": max(c.sigma_L2 for c in found.values()),
            "sigma_G2": max(c.sigma_G2 for c in found.values()),
            "delta_F": found["client"].value,
        }
        if "server" in found:
            values["delta_F_server"] = found["server"].value
        sides = " and ".join(f"F^{s[0]}" for s in found) if len(found) > 1 else "F"
        for key, value in values.items():
            if key not in theory:
                derived[key] = value
                note = " (F_inf = 0)" if key.startswith("delta_F") else f" (max over {sides})"
                source[key] = f"estimated at the initial model at B = {batch_size}" + note
    for key in theory:
        source[key] = "theory block"
    return {**derived, **theory}, source
