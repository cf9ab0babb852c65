"""The algorithm contract, checked on the source: what no algorithm does itself.

Every transfer goes through a link of the run's network (so the ledger sees it with the codec's bits),
the runner opens every round's random streams, and the names every layer shares are defined once.
These are read statically from ``src/fedge``, so a new algorithm that breaks them fails here at once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "fedge"
ALGORITHMS = PACKAGE / "algorithms"

FORBIDDEN_IN_ALGORITHMS = {
    "a codec called directly": r"\.transmit\(|get_codec\(",
    "the ledger used directly": r"\bledger\.|\.ledger\b|set_storage\(",
    "torch's global generator seeded": r"manual_seed\(",
    "an attribute probed with getattr on a config": r"getattr\((self\.)?cfg\b",
    "the clock charged directly (the runtime closes a round)": r"\.charge\(",
    "storage held on the network directly (the runtime holds it)": r"network\.hold\(",
}


def lines_matching(paths: list[Path], pattern: str) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(pattern, line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    return found


def algorithm_modules() -> list[Path]:
    return [p for p in sorted(ALGORITHMS.rglob("*.py")) if p.name != "base.py"]


@pytest.mark.parametrize("what", list(FORBIDDEN_IN_ALGORITHMS))
def test_no_algorithm_does_what_the_core_does_for_it(what):
    assert algorithm_modules(), "no algorithm modules found"
    offending = lines_matching(algorithm_modules(), FORBIDDEN_IN_ALGORITHMS[what])
    assert not offending, f"{what}:\n" + "\n".join(offending)


@pytest.mark.parametrize(
    "what, pattern",
    [("the Tensors alias", r"^Tensors = "), ("the floating-tensors filter", r"is_floating_point\(\)\}")],
)
def test_the_shared_names_are_defined_once(what, pattern):
    places = lines_matching(sorted(PACKAGE.rglob("*.py")), pattern)
    assert [place.split(":")[0] for place in places] == ["tensors.py"], f"{what}:\n" + "\n".join(places)
