"""The Flower ServerApp of a deployed fedge run (``serverapp = "fedge.deploy.server_app:app"``).

The run's settings come from the app's run config: ``config`` (the fedge config as YAML text),
``round-timeout`` (seconds a round's exchange waits for replies) and ``join-timeout`` (seconds to wait
for every client's SuperNode to join). The run directory is the one a simulated run writes, plus
``nodes.jsonl`` (per message and node: round trip and compute seconds), ``carried.csv`` (bytes of every
ArrayRecord carried) and ``deploy.json`` (bits by kind in the ledger next to the bytes carried).
"""

from __future__ import annotations

import logging
from typing import Any

import yaml
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedge import results
from fedge.config import RunConfig, parse_config
from fedge.deploy.rounds import DEPLOYED
from fedge.deploy.transport import GridTransport
from fedge.environment import write_environment
from fedge.errors import ConfigError
from fedge.runner import Built, Result, Runner, build_run, default_run_name

log = logging.getLogger("fedge.deploy")
NODES, CARRIED, DEPLOY = "nodes.jsonl", "carried.csv", "deploy.json"

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = context.run_config
    config = parse_config(yaml.safe_load(str(settings["config"])))
    result = run_deployed(grid, config, float(settings["round-timeout"]), float(settings["join-timeout"]))
    log.info("fedge run finished: %s", result.run_dir)


def run_deployed(grid: Grid, config: RunConfig, round_timeout: float, join_timeout: float) -> Result:
    """Run ``config`` with its clients on the Grid's SuperNodes; write the run directory."""
    if config.algorithm.name not in DEPLOYED:
        known = ", ".join(sorted(DEPLOYED))
        raise ConfigError(
            "algorithm.name", f"{config.algorithm.name!r} cannot be deployed; deployable: {known}"
        )
    results.check_output_dir(config.output.dir)
    simulated = build_run(config)
    ctx = simulated.context
    algorithm = DEPLOYED[config.algorithm.name](ctx, config.algorithm)
    algorithm.check_deployable()
    transport = GridTransport(grid, ctx.data.num_clients, round_timeout)
    transport.connect(join_timeout)
    algorithm.transport = transport
    run_dir = results.create_run_dir(config.output.dir, default_run_name(config), config.to_yaml())
    write_environment(run_dir, str(ctx.device))
    runner = Runner(Built(config, ctx, algorithm), run_dir, lock=results.RunLock(run_dir))
    result = runner.run()
    results.write_jsonl(run_dir / NODES, transport.timings)
    results.write_text(run_dir / CARRIED, _csv(transport.carried))
    results.write_json(run_dir / DEPLOY, deploy_summary(ctx.ledger.totals(), transport))
    return result


def _csv(rows: list[dict[str, Any]]) -> str:
    header = "round,src,dst,kind,bytes"
    return (
        "\n".join([header, *(f"{r['round']},{r['src']},{r['dst']},{r['kind']},{r['bytes']}" for r in rows)])
        + "\n"
    )


def deploy_summary(totals: dict[tuple[str, str], int], transport: GridTransport) -> dict[str, Any]:
    """Per transfer kind: the ledger's bits, the bits of the ArrayRecords carried, and the overhead (%);
    the totals cover the kinds both count (not the edge tier's logical transfers, nor carried
    bookkeeping such as per-step losses)."""
    ledger: dict[str, int] = {}
    for (kind, _), bits in totals.items():
        ledger[kind] = ledger.get(kind, 0) + int(bits)
    carried: dict[str, int] = {}
    for row in transport.carried:
        carried[row["kind"]] = carried.get(row["kind"], 0) + 8 * int(row["bytes"])
    kinds = {}
    for kind in sorted(set(ledger) | set(carried)):
        bits, wire = ledger.get(kind, 0), carried.get(kind, 0)
        overhead = 100.0 * (wire - bits) / bits if bits and wire else None
        kinds[kind] = {"ledger_bits": bits, "carried_bits": wire, "overhead_percent": overhead}
        if bits and not wire:
            kinds[kind]["note"] = "not carried: a logical tier inside the server app"
        elif not bits:
            kinds[kind]["note"] = "carried only: state or bookkeeping the ledger does not count"
    both = [v for v in kinds.values() if v["ledger_bits"] and v["carried_bits"]]
    total_ledger = sum(v["ledger_bits"] for v in both)
    total_carried = sum(v["carried_bits"] for v in both)
    return {
        "kinds": kinds,
        "ledger_bits": total_ledger,
        "carried_bits": total_carried,
        "overhead_percent": 100.0 * (total_carried - total_ledger) / total_ledger if total_ledger else None,
        "dropped": {
            str(t): {str(c): why for c, why in lost.items()} for t, lost in transport.dropped.items()
        },
        "nodes": {str(c): n for c, n in sorted(transport.node_of.items())},
    }
