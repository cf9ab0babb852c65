"""Every example config validates; the quickstart file equals the built-in defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedge.config import load_config, parse_config

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_validates(path):
    assert load_config(path).rounds > 0


def test_quickstart_file_is_the_default():
    assert load_config(Path(__file__).parents[2] / "examples" / "quickstart.yaml") == parse_config({})
