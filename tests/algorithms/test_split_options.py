"""Options of the split family that a peer implementation chose differently: CSE-FSL's upload phase in a
block of h batches (with the incomplete-final-block rule) and the clients' optimizer state across rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cases import tiny

import fedge
from fedge.errors import ConfigError

CLIENTS = 4


def cse(out: Path, name: str, rounds: int = 2, **algorithm: Any) -> dict[str, Any]:
    config = tiny("cse_fsl", out, rounds=rounds)
    config["algorithm"].update(algorithm)
    config["output"]["name"] = name
    return config


@pytest.mark.parametrize(
    ("phase", "drop", "per_client"),
    [("last", False, 2), ("first", False, 3), ("last", True, 2), ("first", True, 2)],
)
def test_uploads_per_round_follow_the_phase_and_the_incomplete_block_rule(tmp_path, phase, drop, per_client):
    """7 local steps in blocks of 3: the last batch of each block uploads at steps 3 and 6 (floor(7/3)),
    the first at steps 1, 4 and 7 (ceil(7/3)); dropping the incomplete block leaves 6 steps, 2 uploads."""
    config = cse(tmp_path, f"{phase}-{drop}", h=3, local_steps=7, upload_phase=phase,
                 drop_incomplete_block=drop)  # fmt: skip
    result = fedge.run(config)
    assert [row["uploads"] for row in result.metrics] == [CLIENTS * per_client] * 2


def test_the_phase_picks_which_batch_uploads(tmp_path):
    """With h dividing the steps both phases upload as often, but different batches: other numbers."""
    runs = [fedge.run(cse(tmp_path, p, h=2, local_steps=4, upload_phase=p)) for p in ("last", "first")]
    assert [r.metrics[-1]["uploads"] for r in runs] == [CLIENTS * 2] * 2
    assert runs[0].metrics[-1]["server_loss"] != runs[1].metrics[-1]["server_loss"]


def test_a_block_longer_than_the_round_uploads_its_first_batch_only(tmp_path):
    assert (
        fedge.run(cse(tmp_path, "first", h=9, local_steps=4, upload_phase="first")).metrics[0]["uploads"] == 4
    )
    with pytest.raises(ConfigError, match="algorithm.h"):
        fedge.run(cse(tmp_path, "last", h=9, local_steps=4))


def test_the_phase_belongs_to_the_every_h_batches_trigger(tmp_path):
    config = cse(tmp_path, "theory", server_trigger="every_l_rounds", upload_phase="first")
    with pytest.raises(ConfigError, match="algorithm.upload_phase"):
        fedge.run(config)

