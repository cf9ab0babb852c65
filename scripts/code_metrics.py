"""Size and shape figures of the source tree, to compare a tree before and after a redesign.

Reports the call sites in ``algorithms/`` that talk to a codec or the ledger directly (a redesign that
routes every transfer through a link brings them to 0), the lines of the split-learning family, the
longest functions and the most branching ones (decision points: ``if``, loops, boolean operators,
``except``, comprehension filters, conditional expressions), and, when the ``duplicates`` tool is on the
PATH, how many pairs of places share six or more lines.

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
    split = sorted((package / "algorithms" / "split").glob("*.py"))
    print(
        f"  split family: {sum(len(p.read_text().splitlines()) for p in split)} lines in {len(split)} files"
    )
    all_functions = functions(package)
    print("  longest functions:")
    for name, lines, _ in sorted(all_functions, key=lambda f: -f[1])[: args.top]:
        print(f"    {lines:4} lines  {name}")
    print("  most branching functions:")
    for name, _, decisions in sorted(all_functions, key=lambda f: -f[2])[: args.top]:
        print(f"    {decisions:4} decisions  {name}")
    print(f"  repeated code (src/fedge): {duplicate_pairs(package)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
