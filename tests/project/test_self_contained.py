"""The repository stands on its own: no file points to documents outside it.

Users get the package, its docs and its examples, not the working notes they were written from. So no
tracked file may name a path into those notes, use the section sign their numbering relied on, or cite
one of their decision labels (a letter A, D or R with a number, or a numbered "item"). Decisions are
written out in docs/decisions.md and cited by the papers' own numbering (Eq., Table, Sec., Theorem).
The patterns below are assembled from pieces so that this file does not match itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

NOTES = "shar" + "ed"
FORBIDDEN = {
    "a path to the working notes": re.compile(re.escape(".." + "/" + NOTES)),
    "a path to the specifications": re.compile(re.escape(NOTES + "/" + "specs")),
    "a path to the paper texts": re.compile(re.escape(NOTES + "/" + "papers")),
    "the section sign": re.compile(chr(0xA7)),
}

# A decision label: A, D or R followed by 1-24, standing alone (not part of a word, a path, a version
# or a range such as "A1-A4"), optionally after "spec"; or a numbered "item".
LABEL = re.compile(r"(?<![\w./\\-])[ADR](?:1[0-9]|2[0-4]|[1-9])(?![\w-])|\bitems?\s+[0-9]+\b")
# Labels that are the papers' own: appendix theorems (SplitFed's Theorems A1-A4), and the like.
PAPER_LABEL = re.compile(r"(?:Theorems?|Corollar(?:y|ies)|Lemmas?|Propositions?|Appendix)\s+$")


def tracked_files() -> list[Path]:
    """Every file git tracks, or a skip when this is not a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    """The file as text, or None for binaries and unreadable files."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def labels_in(line: str) -> list[str]:
    """Decision labels in ``line`` that are not the papers' own theorem labels."""
    return [m.group(0) for m in LABEL.finditer(line) if not PAPER_LABEL.search(line[: m.start()])]


def offences(path: Path) -> list[str]:
    """``file:line: what`` for every forbidden reference in one file."""
    text = text_of(path)
    if text is None:
        return []
    found = []
    name = path.relative_to(ROOT).as_posix()
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in FORBIDDEN.items():
            if pattern.search(line):
                found.append(f"{name}:{number}: {what}: {line.strip()[:100]}")
        for label in labels_in(line):
            found.append(f"{name}:{number}: decision label {label!r}: {line.strip()[:100]}")
    return found


def test_no_file_points_outside_the_repository():
    found = [entry for path in tracked_files() for entry in offences(path)]
    assert not found, "references to documents users do not have:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    ["see spec " + "D" + "13", "(" + "A" + "5)", "R" + "4 holds", "item" + " 19", "items" + " 6-9"],
)
def test_labels_are_caught(line):
    assert labels_in(line)


@pytest.mark.parametrize(
    "line",
    [
        "Theorem " + "A" + "3 caps the step",
        "Theorems " + "A" + "1-" + "A" + "4",
        "an A100 GPU",
        "R^2 of the fit",
        "the D_t term",
        "fp16 items",
        "x86-64",
    ],
)
def test_paper_labels_and_ordinary_text_pass(line):
    assert not labels_in(line)
