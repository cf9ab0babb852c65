"""Size and shape figures of the source tree, to compare a tree before and after a redesign.

Reports the call sites in ``algorithms/`` that talk to a codec or the ledger directly (a redesign that
routes every transfer through a link brings them to 0), the infrastructure algorithms still carry (lines
naming process groups, shards or sharded sends; hand-advanced clocks and latency models outside
``system/``; round copies in ``deploy/``), the largest module of ``algorithms/``, the lines of the
split-learning family, the longest functions and the most branching ones (decision points: ``if``,
loops, boolean operators, ``except``, comprehension filters, conditional expressions), and, when the
``duplicates`` tool is on the PATH, how many pairs of places share six or more lines.

    python scripts/code_metrics.py                 # this tree
    python scripts/code_metrics.py --root /other/checkout
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

DIRECT_CALLS = {
    "codec .transmit(": r"\.transmit\(",
    "ledger.record(": r"ledger\.record\(",
    "set_storage(": r"set_storage\(",
}
SEAMS = {
    "lines naming groups/shards in algorithms/": (
        "algorithms",
        r"\bgroup\b|\bGroup\b|\bshard\b|\bShard\b|send_shard|\.share\(|on_shards|balanced\(",
    ),
    "clock.advance outside system/": ("", r"clock\.advance\("),
    "round copies in deploy/ (def run_round)": ("deploy", r"def run_round\("),
}
LIMITED = ("algorithms", "engine", "comm", "deploy")  # packages whose functions should stay short
DECISIONS = (ast.If, ast.For, ast.While, ast.BoolOp, ast.ExceptHandler, ast.IfExp, ast.comprehension)


def functions(package: Path) -> list[tuple[str, int, int]]:
    """``(qualified name, lines, decision points)`` of every function in ``package``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                decisions = sum(isinstance(child, DECISIONS) for child in ast.walk(node))
                found.append((f"{path.relative_to(package)}:{node.name}", lines, decisions))
    return found


def count_lines(paths: list[Path], pattern: str) -> int:
    return sum(len(re.findall(pattern, path.read_text())) for path in paths)


def duplicate_pairs(source: Path) -> str:
    """The ``duplicates`` tool's summary line for ``source`` (or why there is none)."""
    if shutil.which("duplicates") is None:
        return "duplicates tool not on PATH"
    out = subprocess.run(
        ["duplicates", "--repo", str(source), "--seconds", "60"], capture_output=True, text=True, check=False
    ).stdout
    return out.splitlines()[0] if out else "no output"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args(argv)
    package = args.root / "src" / "fedge"
    algorithms = sorted((package / "algorithms").rglob("*.py"))
    print(f"tree: {args.root}")
    for label, pattern in DIRECT_CALLS.items():
        print(f"  {label:22} call sites in algorithms/: {count_lines(algorithms, pattern)}")
    for label, (folder, pattern) in SEAMS.items():
        paths = sorted((package / folder).rglob("*.py"))
        if not folder:
            paths = [p for p in paths if "system" not in p.relative_to(package).parts]
        hits = sum(bool(re.search(pattern, line)) for p in paths for line in p.read_text().splitlines())
        print(f"  {label}: {hits}")
    biggest = max(algorithms, key=lambda p: len(p.read_text().splitlines()))
    print(f"  largest module in algorithms/: {len(biggest.read_text().splitlines())} lines ({biggest.name})")
    split = sorted((package / "algorithms" / "split").glob("*.py"))
    print(
        f"  split family: {sum(len(p.read_text().splitlines()) for p in split)} lines in {len(split)} files"
    )
    all_functions = functions(package)
    print("  longest functions:")
    for name, lines, _ in sorted(all_functions, key=lambda f: -f[1])[: args.top]:
        print(f"    {lines:4} lines  {name}")
    limited = [f for f in all_functions if f[0].split("/")[0] in LIMITED]
    name, lines, _ = max(limited, key=lambda f: f[1])
    print(f"  longest function in {', '.join(LIMITED)}: {lines} lines ({name})")
    print("  most branching functions:")
    for name, _, decisions in sorted(all_functions, key=lambda f: -f[2])[: args.top]:
        print(f"    {decisions:4} decisions  {name}")
    print(f"  repeated code (src/fedge): {duplicate_pairs(package)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
