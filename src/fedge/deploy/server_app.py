"""The Flower ServerApp of a deployed fedge run (``serverapp = "fedge.deploy.server_app:app"``).

The run's settings come from the app's run config: ``config`` (the fedge config as YAML text),
``round-timeout`` (seconds a round's exchange waits for replies) and ``join-timeout`` (seconds to wait
for every client's SuperNode to join). The run directory is the one a simulated run writes, plus
``nodes.jsonl`` (per message and node: round trip and compute seconds), ``carried.csv`` (bytes of every
ArrayRecord carried) and ``deploy.json`` (bits by kind in the ledger next to the bytes carried).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import yaml
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedge.comm import nodes
from fedge.config import RunConfig
from fedge.deploy.rounds import DeployedRounds, check_stages, deployed_class
from fedge.deploy.transport import GridTransport
from fedge.extend import parse_config
from fedge.files import results
from fedge.runner import inputs
from fedge.runner.environment import write_environment
from fedge.runner.loop import Built, Result, Runner, build_run, default_run_name

log = logging.getLogger("fedge.deploy")
NODES, CARRIED, DEPLOY = "nodes.jsonl", "carried.csv", "deploy.json"

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = context.run_config
    config = parse_config(yaml.safe_load(str(settings["config"])))
    round_timeout, join_timeout = float(settings["round-timeout"]), float(settings["join-timeout"])

    def connect(num_clients: int) -> GridTransport:
        transport = GridTransport(grid, num_clients, round_timeout)
        transport.connect(join_timeout)
        return transport

    result = run_deployed(config, connect)
    log.info("fedge run finished: %s", result.run_dir)


def run_deployed(config: RunConfig, connect: Callable[[int], GridTransport]) -> Result:
    """Run ``config`` with its clients' work on the nodes of ``connect(num_clients)``'s transport; write
    the run directory."""
    deployed = deployed_class(config.algorithm.name)
    check_stages(config)
    results.check_output_dir(config.output.dir)
    ctx = build_run(config).context
    algorithm = deployed(ctx, config.algorithm)
    algorithm.check_deployable()
    transport = connect(ctx.data.num_clients)
    if isinstance(algorithm, DeployedRounds):
        algorithm.attach(transport)
    else:
        algorithm.transport = transport
    run_dir = results.create_run_dir(config.output.dir, default_run_name(config), config.to_yaml())
    write_environment(run_dir, str(ctx.device))
    inputs.record(run_dir, config)  # as a simulated run records what its files held
    runner = Runner(Built(config, ctx, algorithm), run_dir, lock=results.RunLock(run_dir))
    result = runner.run()
    results.write_jsonl(run_dir / NODES, transport.timings)
    results.write_text(run_dir / CARRIED, _csv(transport.carried))
    secure = getattr(algorithm, "secure", None)
    reports = secure.reports if secure is not None else None
    results.write_json(run_dir / DEPLOY, deploy_summary(ctx.ledger.totals(), transport, reports))
    return result


def _csv(rows: list[dict[str, Any]]) -> str:
    header = "round,src,dst,kind,bytes"
    return (
        "\n".join([header, *(f"{r['round']},{r['src']},{r['dst']},{r['kind']},{r['bytes']}" for r in rows)])
        + "\n"
    )


def deploy_summary(
    totals: dict[tuple[str, str], int], transport: GridTransport, secagg: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """What the ledger counted next to what the runtime carried.

    ``ledger``: bits per transfer kind and direction, as the simulation counts them (the algorithm's
    links, with their codecs). ``carried``: bits of the ArrayRecords per record name and direction
    (``down``: server app to node, ``up``: node to server app); a training exchange carries the rows in
    fp32 with their batch plan and noise keys, so carried and counted bits differ by design. ``relay``:
    the decentralized family's peer messages reach their receivers through the SuperLink; relayed
    one by one, each would be carried up to the SuperLink and down again (twice its ledger bits),
    while the server app mixes the trained rows the nodes send up and sends each node its rows down.
    ``secagg``: per round of Flower's SecAgg+, its settings, senders, dropped clients, the protocol's
    ledger bits by kind next to the simulated stage's formula, and the least share of a sender's masked
    coordinates above the quantization range (:class:`~fedge.deploy.secagg_round.CountingGrid`).
    """
    ledger: dict[str, dict[str, int]] = {}
    for (kind, way), bits in sorted(totals.items()):
        ledger.setdefault(kind, {})[way] = int(bits)
    carried: dict[str, dict[str, int]] = {}
    for row in transport.carried:
        way = "down" if row["src"] == nodes.SERVER else "up"
        entry = carried.setdefault(str(row["kind"]), {"down": 0, "up": 0})
        entry[way] += 8 * int(row["bytes"])
    by_way = {way: sum(b for (_, w), b in totals.items() if w == way) for way in ("up", "down", "peer")}
    summary: dict[str, Any] = {
        "ledger": ledger,
        "ledger_bits": by_way,
        "carried": carried,
        "carried_bits": {way: sum(c[way] for c in carried.values()) for way in ("down", "up")},
    }
    if by_way["peer"]:
        summary["relay"] = {
            "peer_ledger_bits": by_way["peer"],
            "relayed_bits": 2 * by_way["peer"],
            "note": "peer messages relayed one by one: each carried up to the SuperLink and down again",
        }
    if secagg is not None:
        summary["secagg"] = secagg
    summary["dropped"] = {
        str(t): {str(c): why for c, why in lost.items()} for t, lost in transport.dropped.items()
    }
    summary["nodes"] = {str(c): n for c, n in sorted(transport.node_of.items())}
    return summary
