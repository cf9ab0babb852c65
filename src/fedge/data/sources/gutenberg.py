"""LEAF's Shakespeare json built from the text LEAF builds it from: Project Gutenberg's complete works.

LEAF (Caldas et al., 2018) makes one client per speaking role of each play of Project Gutenberg's 1994
edition of the complete works (ebook 100, ``100.txt``) and one sample per 80-character window of a role's
lines, labeled by the character that follows. ``data.download: true`` fetches that edition, and a
``100.txt`` placed in ``data.root`` is used as it is; either is converted here, by our own reading of the
edition, into LEAF's json (``train/`` and ``test/``), which :mod:`fedge.data.sources.text` then reads as if
LEAF had written it. The reading:

- **Works.** The edition heads each work with the line ``by William Shakespeare``; a work's title is the
  last non-blank line above it, and the work runs to the next heading.
- **Speeches.** A speech opens on a line indented two spaces, ``NAME. words``, and goes on over the lines
  indented four spaces; any other line ends it. A work with no such line (LEAF notes that The Comedy of
  Errors lost its indentation) is read flush left: a speech opens with ``NAME. words`` at the margin and
  goes on over every following non-blank line that opens no other speech. An act or scene heading
  (``ACT I. SCENE I.``) is no speaker.
- **Roles.** One per (work, speaker), its speeches in order joined by single spaces, every run of white
  space one space; user ``TITLE_NAME`` with spaces as underscores.
- **Samples.** Every window of 80 characters of a role's text (``x``) and the character after it (``y``);
  a role of 80 characters or fewer has none and is left out.
- **Split.** Per role by sample (LEAF's ``-t sample --tf 0.8``): the first 80 % of the windows (at least
  one) train; the test windows begin 80 characters past the last training window, so no character of a
  training sample's window or target appears in a test window.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

from fedge.data.sources.fetch import download
from fedge.errors import DataError
from fedge.files import umask

RAW_NAME = "100.txt"
URLS = (
    "https://www.gutenberg.org/files/100/old/1994-01-100.zip",
    "http://www.gutenberg.org/files/100/old/1994-01-100.zip",
)
WINDOW = 80
TRAIN_FRACTION = 0.8
HEADING = "by william shakespeare"
INDENTED_SPEAKER = re.compile(r"^  ([A-Za-z][A-Za-z ]*)\. (.*)$")
INDENTED_CONTINUATION = re.compile(r"^    (\S.*)$")
FLUSH_SPEAKER = re.compile(r"^([A-Za-z][A-Za-z ]*)\. (.*)$")
HEADINGS = re.compile(r"(ACT|SCENE)\b", re.IGNORECASE)  # "ACT I. SCENE I." is no speaker


def works(text: str) -> list[tuple[str, list[str]]]:
    """Every work ``(title, lines)`` of the edition, split at its ``by William Shakespeare`` headings."""
    lines = text.splitlines()
    headings = [i for i, line in enumerate(lines) if line.strip().lower() == HEADING]
    out = []
    for number, start in enumerate(headings):
        title = next((lines[i].strip() for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        end = headings[number + 1] if number + 1 < len(headings) else len(lines)
        out.append((title, lines[start + 1 : end]))
    return out


def speeches(lines: list[str]) -> list[tuple[str, str]]:
    """Every speech ``(speaker, words)`` of one work (module docstring: indented, else flush left)."""
    indented = any(INDENTED_SPEAKER.match(line) for line in lines)
    opener = INDENTED_SPEAKER if indented else FLUSH_SPEAKER
    out: list[tuple[str, list[str]]] = []
    open_speech = False
    for line in lines:
        started = opener.match(line)
        if started:  # a speech opens, or a heading closes the open one
            open_speech = not HEADINGS.match(started.group(1))
            if open_speech:
                out.append((started.group(1).strip(), [started.group(2)]))
            continue
        words = _continued(line, indented) if open_speech else None
        if words is None:
            open_speech = False
        else:
            out[-1][1].append(words)
    return [(speaker, " ".join(parts)) for speaker, parts in out]


def _continued(line: str, indented: bool) -> str | None:
    """The words ``line`` adds to an open speech, or None where it ends the speech."""
    if indented:
        match = INDENTED_CONTINUATION.match(line)
        return match.group(1) if match else None
    return line if line.strip() else None


def roles(text: str) -> dict[str, str]:
    """Every role's text, ``TITLE_NAME`` to its speeches joined and white space collapsed, in order of
    first appearance."""
    joined: dict[str, list[str]] = {}
    for title, lines in works(text):
        for speaker, words in speeches(lines):
            joined.setdefault(f"{title}_{speaker}".replace(" ", "_"), []).append(words)
    return {role: " ".join(" ".join(parts).split()) for role, parts in joined.items()}


def samples(text: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """A role's train and test samples ``(x, y)`` (module docstring: windows, split)."""
    count = len(text) - WINDOW
    every = [(text[i : i + WINDOW], text[i + WINDOW]) for i in range(max(count, 0))]
    train = max(1, int(TRAIN_FRACTION * count)) if count > 0 else 0
    return every[:train], every[train + WINDOW :]


def leaf_json(role_texts: dict[str, str]) -> dict[str, dict]:
    """LEAF's json of each split, ``{"users", "num_samples", "user_data": {user: {"x", "y"}}}``."""
    out: dict[str, dict] = {
        split: {"users": [], "num_samples": [], "user_data": {}} for split in ("train", "test")
    }
    for role, text in role_texts.items():
        train, test = samples(text)
        if not train:
            continue
        for split, chosen in (("train", train), ("test", test)):
            out[split]["users"].append(role)
            out[split]["num_samples"].append(len(chosen))
            out[split]["user_data"][role] = {"x": [x for x, _ in chosen], "y": [y for _, y in chosen]}
    return out


def read_edition(path: Path) -> str:
    """The edition's text (UTF-8, or Latin-1 where it is not)."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _write_json(value: dict, dest: Path) -> None:
    """``value`` as json at ``dest``, through a temporary file renamed into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with umask.staged_file(dest, mode="w", suffix=".part") as out:
        json.dump(value, out)


def convert(raw: Path, folder: Path) -> None:
    """Write LEAF's ``train/`` and ``test/`` json of the edition ``raw`` into ``folder``, each file through a
    temporary one renamed into place, ``train/`` last: a folder with ``train/`` is complete."""
    splits = leaf_json(roles(read_edition(raw)))
    if not splits["train"]["users"]:
        raise DataError(f"{raw}: no speeches found; expected Project Gutenberg's 1994 edition of ebook 100")
    for split in ("test", "train"):
        _write_json(splits[split], folder / split / f"all_data_{split}.json")


def fetch_edition(folder: Path) -> Path:
    """Download the 1994 edition's zip into ``folder`` and extract its ``100.txt``; return that file."""
    archive = download(URLS, folder / Path(URLS[0]).name)
    try:
        with zipfile.ZipFile(archive) as bundle, umask.staged_file(folder / RAW_NAME, suffix=".part") as out:
            member = next((n for n in bundle.namelist() if Path(n).name == RAW_NAME), None)
            if member is None:
                raise DataError(f"{archive}: no {RAW_NAME} inside")
            out.write(bundle.read(member))
    except (OSError, zipfile.BadZipFile) as error:
        raise DataError(f"{archive}: cannot extract {RAW_NAME} ({error})") from None
    archive.unlink()
    return folder / RAW_NAME
