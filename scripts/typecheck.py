"""Type checking that only gets stricter: mypy over ``src/fedge`` against a recorded baseline.

mypy's errors are counted per file. The packages in ``CLEAN`` must have none; every other file may have
at most the errors the baseline (``scripts/mypy-baseline.json``) records for it, so a change can remove
errors but never add one. When files improve, ``--update`` records the lower counts (it refuses to
raise any).

    python scripts/typecheck.py            # CI: exit 1 on a new error, naming the file
    python scripts/typecheck.py --update   # after fixing errors: shrink the baseline
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "scripts" / "mypy-baseline.json"
CLEAN = (
    "src/fedge/aggregation/",
    "src/fedge/runtime/",
    "src/fedge/comm/",
    "src/fedge/system/",
    "src/fedge/engine/",
    "src/fedge/algorithms/",
)
ERROR = re.compile(r"^(?P<file>[^:\n]+\.py):\d+: error: ")


def error_counts() -> tuple[Counter[str], str]:
    """mypy's errors per file (the configuration is pyproject.toml's ``[tool.mypy]``), and its report."""
    out, err, _ = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    if err.strip():
        sys.exit(f"mypy failed to run: {err.strip().splitlines()[0]}")
    counts: Counter[str] = Counter()
    for line in out.splitlines():
        found = ERROR.match(line)
        if found:
            counts[found["file"]] += 1
    return counts, out


def problems(counts: Counter[str], baseline: dict[str, int] | None) -> list[str]:
    """Every file with more errors than allowed: none in ``CLEAN``, else its baseline's count (any, while
    there is no baseline yet)."""
    found = []
    for file, count in sorted(counts.items()):
        if file.startswith(CLEAN):
            allowed = 0
        elif baseline is None:
            continue
        else:
            allowed = baseline.get(file, 0)
        if count > allowed:
            found.append(f"{file}: {count} mypy errors, {allowed} allowed")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="record the lower counts as the baseline")
    args = parser.parse_args()
    counts, report = error_counts()
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else None
    if baseline is None and not args.update:
        sys.exit(f"no baseline at {BASELINE.relative_to(ROOT)}: record one with --update")
    bad = problems(counts, baseline)
    if bad:
        print(report, end="")
        print("\n".join(["type check: new mypy errors", *bad]))
        return 1
    if args.update:
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
    shrunk = sum((baseline or {}).values()) - sum(counts.values())
    hint = ""
    if shrunk > 0 and not args.update:
        hint = f"; {shrunk} fewer than the baseline (--update records it)"
    print(f"type check: {sum(counts.values())} mypy errors in {len(counts)} files, none new{hint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
