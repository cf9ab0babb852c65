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
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from fedge.errors import FedgeError
from fedge.files import results

if TYPE_CHECKING:
    from fedge.runner.loop import Result


def deploy(
    config: Annotated[str, typer.Argument(help="YAML config, or example:NAME for a shipped example")],
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. rounds=5")] = None,
    tls: Annotated[bool, typer.Option("--tls", help="TLS and SuperNode authentication")] = False,
    round_timeout: Annotated[float, typer.Option(help="seconds a round waits for its replies")] = 120.0,
    join_timeout: Annotated[float, typer.Option(help="seconds to wait for every SuperNode")] = 120.0,
    home: Annotated[Path | None, typer.Option(help="Flower home: settings, logs, certificates")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress output")] = False,
) -> None:
    """Run CONFIG with a SuperLink and one SuperNode per client on this host (Flower Deployment Runtime)."""
    from fedge.cli.commands import (
        _fail,  # the other commands' one-line error (imported here: cli imports this)
    )

    try:
        run_dir = _deploy(config, overrides or [], tls, round_timeout, join_timeout, home, quiet)
    except FedgeError as error:
        raise _fail(str(error), error.exit_code) from None
    print_deployed(run_dir)


def print_deployed(run_dir: Path) -> None:
    """The summary ``fedge run`` prints, then what the runtime carried and who dropped out."""
    from fedge.cli.commands import (
        _print_summary,  # the run command's table (imported here: cli imports this module)
    )

    _print_summary(_result(run_dir))
    deployed = json.loads((run_dir / "deploy.json").read_text())
    carried = deployed["carried_bits"]
    Console().print(
        f"carried on the runtime: {carried['down']:,} bits down, {carried['up']:,} bits up "
        f"(deploy.json); dropped: {deployed['dropped'] or 'none'}"
    )


def _result(run_dir: Path) -> Result:
    """A finished run as its directory holds it."""
    from fedge.extend import load_config  # torch: imported when the command runs, not with the CLI
    from fedge.runner.loop import Result

    summary = json.loads((run_dir / results.SUMMARY).read_text())
    metrics = results.read_jsonl(run_dir / results.METRICS)
    return Result(run_dir, load_config(run_dir / results.CONFIG), metrics, summary)


def _deploy(config: str, overrides: list[str], tls: bool, round_timeout: float, join_timeout: float,
            home: Path | None, quiet: bool = False) -> Path:  # fmt: skip
    """Start the federation, run ``config`` on it and stop it; the run directory. Unless ``quiet``, each
    step is printed as it happens (the SuperLink, each SuperNode, the server app's start) and each round
    as ``fedge run`` shows it."""
    if importlib.util.find_spec("flwr") is None:
        raise FedgeError("deploy: Flower is not installed; pip install 'fedge[deploy]'")
    from fedge.api import resolve_config
    from fedge.cli.commands import console
    from fedge.cli.progress import RunProgress
    from fedge.deploy.launch import Federation, Tls
    from fedge.deploy.rounds import check_stages, deployed_class
    from fedge.runner.loop import build_run

    def say(line: str) -> None:
        if not quiet:
            console.print(line, highlight=False)

    cfg = resolve_config(config, overrides)
    deployed = deployed_class(cfg.algorithm.name)  # a refused algorithm fails here, in one line
    check_stages(cfg)  # and a stage only the simulation runs
    built = build_run(cfg)  # bad input fails here, before any process starts
    clients = built.context.data.num_clients
    deployed(built.context, cfg.algorithm).check_deployable()
    home = Path(home or tempfile.mkdtemp(prefix="fedge-flwr-")).resolve()
    material = Tls.create(home / "tls") if tls else None
    with Federation(home, tls=material).start() as federation:
        secured = " with TLS and SuperNode authentication" if material else ""
        say(f"SuperLink on 127.0.0.1:{federation.port}{secured} (logs: {home / 'logs'})")
        for client in range(clients):
            key = None
            if material is not None:
                key = material.node_key(f"node{client}")
                federation.register(key, f"node{client}")
            federation.add_node(client, clients, key=key)
            say(f"SuperNode {client + 1}/{clients} started (partition-id={client})")
        say(f"flwr run: the server app builds the run and waits for the {clients} SuperNodes")
        with RunProgress(console, cfg.rounds, quiet=quiet, interval=0) as progress:  # rounds take seconds
            return federation.run(
                cfg, round_timeout=round_timeout, join_timeout=join_timeout, on_round=progress
            )
