"""``fedge deploy``: run a config on Flower's Deployment Runtime on this host.

A SuperLink and one SuperNode per client start as separate processes on loopback (with ``--tls``: a
fresh CA and server certificate, TLS on every connection and SuperNode authentication with a registered
key per node), ``flwr run`` starts fedge's ServerApp, and everything is stopped afterwards. The run
directory is a simulated run's plus ``nodes.jsonl``, ``carried.csv`` and ``deploy.json``. Needs the
``deploy`` extra. For real machines, start the same processes by hand (docs/deploy.md).
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fedge.errors import EXIT_BAD_INPUT, ConfigError, FedgeError


def deploy(
    config: Annotated[str, typer.Argument(help="YAML config, or example:NAME for a shipped example")],
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. rounds=5")] = None,
    tls: Annotated[bool, typer.Option("--tls", help="TLS and SuperNode authentication")] = False,
    round_timeout: Annotated[float, typer.Option(help="seconds a round waits for its replies")] = 120.0,
    join_timeout: Annotated[float, typer.Option(help="seconds to wait for every SuperNode")] = 120.0,
    home: Annotated[Path | None, typer.Option(help="Flower home: settings, logs, certificates")] = None,
) -> None:
    """Run CONFIG with a SuperLink and one SuperNode per client on this host (Flower Deployment Runtime)."""
    errors = Console(stderr=True)
    try:
        run_dir = _deploy(config, overrides or [], tls, round_timeout, join_timeout, home)
    except FedgeError as error:
        errors.print(f"[bold red]error:[/] {error}", highlight=False, markup=True)
        raise typer.Exit(code=EXIT_BAD_INPUT) from None
    summary = json.loads((run_dir / "deploy.json").read_text())
    bits = f"ledger {summary['ledger_bits']:,} bits, carried {summary['carried_bits']:,} bits"
    overhead = f"(overhead {summary['overhead_percent']:.2f} %)"
    Console().print(f"deployed run: {run_dir}\n{bits} {overhead}, dropped: {summary['dropped'] or 'none'}")


def _deploy(config: str, overrides: list[str], tls: bool, round_timeout: float, join_timeout: float,
            home: Path | None) -> Path:  # fmt: skip
    if importlib.util.find_spec("flwr") is None:
        raise FedgeError("deploy: Flower is not installed; pip install 'fedge[deploy]'")
    from fedge.api import resolve_config
    from fedge.deploy.launch import Federation, Tls
    from fedge.deploy.rounds import DEPLOYED
    from fedge.runner import build_run

    cfg = resolve_config(config, overrides)
    if cfg.algorithm.name not in DEPLOYED:
        known = ", ".join(sorted(DEPLOYED))
        raise ConfigError("algorithm.name", f"{cfg.algorithm.name!r} cannot be deployed; deployable: {known}")
    built = build_run(cfg)  # bad input fails here, before any process starts
    clients = built.context.data.num_clients
    DEPLOYED[cfg.algorithm.name](built.context, cfg.algorithm).check_deployable()
    home = Path(home or tempfile.mkdtemp(prefix="fedge-flwr-")).resolve()
    material = Tls.create(home / "tls") if tls else None
    with Federation(home, tls=material).start() as federation:
        for client in range(clients):
            key = None
            if material is not None:
                key = material.node_key(f"node{client}")
                federation.register(key, f"node{client}")
            federation.add_node(client, clients, key=key)
        return federation.run(cfg, round_timeout=round_timeout, join_timeout=join_timeout)
