"""The link-codec table of docs/decentralized.md and docs/hierarchical.md from a finished sweep.

    python scripts/link_codecs_table.py runs/link-codecs

For every cell of ``examples/sweeps/link-codecs.yaml`` (algorithm x codec) it prints, as Markdown, the
final accuracy (mean +- std over seeds) and the MB each client sent and received over the run (mean over
clients, read from every run's ledger.csv; 1 MB = 2^20 bytes), and what share of fp32's traffic that is.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

MIB_BITS = 8 * 2**20


def per_client_mb(ledger: Path) -> tuple[float, float]:
    """Mean MB sent and received per client (nodes named ``client:<i>``)."""
    sent: dict[str, int] = defaultdict(int)
    received: dict[str, int] = defaultdict(int)
    with ledger.open() as handle:
        for row in csv.DictReader(handle):
            if row["src"].startswith("client:"):
                sent[row["src"]] += int(row["bits"])
            if row["dst"].startswith("client:"):
                received[row["dst"]] += int(row["bits"])
    clients = set(sent) | set(received)
    return (sum(sent.values()) / len(clients) / MIB_BITS, sum(received.values()) / len(clients) / MIB_BITS)


def main(sweep: Path) -> None:
    cells: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    with (sweep / "index.csv").open() as handle:
        for row in csv.DictReader(handle):
            if row["state"] != "done":
                continue
            run = sweep / row["run"]
            summary = json.loads((run / "summary.json").read_text())
            codec, algorithm = (part.strip() for part in row["label"].split(","))
            cells[(algorithm, codec)].append((summary["final_accuracy"], *per_client_mb(run / "ledger.csv")))
    print(
        "| algorithm | links | seeds | final accuracy % | MB sent / client | MB received / client | of fp32 |"
    )
    print("|---|---|---|---|---|---|---|")
    for (algorithm, codec), runs in sorted(cells.items(), key=lambda item: (item[0][0], -item[1][0][1])):
        accuracy = [100 * r[0] for r in runs]
        sent, received = statistics.mean(r[1] for r in runs), statistics.mean(r[2] for r in runs)
        base = cells.get((algorithm, "fp32"))
        share = (sent + received) / statistics.mean(r[1] + r[2] for r in base) if base else float("nan")
        spread = statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0
        print(
            f"| {algorithm} | {codec} | {len(runs)} | {statistics.mean(accuracy):.2f} ± {spread:.2f} "
            f"| {sent:.2f} | {received:.2f} | {share:.3f} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
