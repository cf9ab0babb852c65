"""min-max and min-sum (Shejwalkar and Houmansadr 2021): the gamma and the malicious row equal a per-row
numpy reference of the paper's search, the constraint holds at the gamma found and fails just above it,
and poisoned() writes that row for every malicious participant (a run's rows on both executors and bad
options: tests/adversary/test_attacks.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedge.runtime.adversary import poisoned
from fedge.runtime.minmax import crafted

TOLERANCE = 1e-5


def _perturbation(kind: str, honest: np.ndarray) -> np.ndarray:
    mean = honest.mean(axis=0)
    if kind == "std":
        return -honest.std(axis=0, ddof=1)
    if kind == "unit":
        return -mean / np.linalg.norm(mean)
    return -np.sign(mean)


def _squared(u: np.ndarray, v: np.ndarray) -> float:
    return float(sum((a - b) ** 2 for a, b in zip(u, v, strict=True)))


def _holds(attack: str, honest: np.ndarray, row: np.ndarray) -> bool:
    """The paper's constraint, one row at a time."""
    pairs = [[_squared(x, y) for y in honest] for x in honest]
    mine = [_squared(row, x) for x in honest]
    if attack == "min_max":
        return max(mine) <= max(max(r) for r in pairs)
    return sum(mine) <= max(sum(r) for r in pairs)


def _reference(
    attack: str, kind: str, honest: np.ndarray, gamma_init: float = 10.0
) -> tuple[float, np.ndarray]:
    """The paper's Algorithm 1 on the flat honest changes (float64), written out row by row."""
    mean, p = honest.mean(axis=0), _perturbation(kind, honest)
    gamma, step, success = gamma_init, gamma_init, 0.0
    while abs(success - gamma) > TOLERANCE:
        if _holds(attack, honest, mean + gamma * p):
            success = gamma
            gamma += step / 2
        else:
            gamma -= step / 2
        step /= 2
    return success, mean + success * p


def _rows(seed: int, count: int = 9) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ref = {"w": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g), "n": torch.tensor(2)}
    rows = {
        "w": ref["w"] + 0.3 * torch.randn(count, 3, 4, generator=g) + 0.1,
        "b": ref["b"] + 0.3 * torch.randn(count, 5, generator=g) - 0.05,
        "n": torch.full((count,), 4),
    }
    return rows, ref


def _flat(rows: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], which: torch.Tensor) -> np.ndarray:
    parts = [(rows[k][which] - ref[k]).double().reshape(int(which.sum()), -1) for k in ("w", "b")]
    return torch.cat(parts, dim=1).numpy()


@pytest.mark.parametrize("attack", ["min_max", "min_sum"])
@pytest.mark.parametrize("kind", ["std", "unit", "sign"])
@pytest.mark.parametrize("seed", [0, 1])
def test_gamma_and_row_equal_the_per_row_reference(attack, kind, seed):
    rows, ref = _rows(seed)
    bad = torch.zeros(9, dtype=torch.bool)
    bad[[2, 7]] = True
    honest = _flat(rows, ref, ~bad)
    want_gamma, want_change = _reference(attack, kind, honest)
    changes = {k: rows[k][~bad] - ref[k] for k in ("w", "b")}
    _, gamma = crafted(attack, {"perturbation": kind}, changes)
    assert gamma == pytest.approx(want_gamma, abs=1e-6)
    assert 0 < gamma < 19  # found inside the search's range, so the bound below is the constraint's
    assert _holds(attack, honest, want_change)
    above = honest.mean(axis=0) + (gamma + 10 * TOLERANCE) * _perturbation(kind, honest)
    assert not _holds(attack, honest, above)

    out = poisoned(attack, {"perturbation": kind}, rows, ref, bad)
    got = _flat(out, ref, bad)
    np.testing.assert_allclose(got, np.broadcast_to(want_change, got.shape), atol=1e-6)
    for k in ("w", "b"):
        assert torch.equal(out[k][~bad], rows[k][~bad])  # the honest rows as they were
    assert torch.equal(out["n"], rows["n"])  # integer counters are not poisoned


def test_gamma_init_bounds_the_search():
    rows, ref = _rows(3)
    bad = torch.zeros(9, dtype=torch.bool)
    bad[0] = True
    changes = {k: rows[k][~bad] - ref[k] for k in ("w", "b")}
    small = crafted("min_sum", {"gamma_init": 0.01}, changes)[1]
    assert small == pytest.approx(_reference("min_sum", "std", _flat(rows, ref, ~bad), 0.01)[0], abs=1e-6)
    assert small < 0.02  # the search never tests beyond 2 gamma_init


def test_one_honest_row_leaves_the_mean():
    rows, ref = _rows(4, count=3)
    bad = torch.tensor([True, False, True])
    out = poisoned("min_max", {"perturbation": "sign"}, rows, ref, bad)
    for k in ("w", "b"):  # the honest rows are 0 apart: gamma 0, the malicious rows copy the honest one
        assert torch.allclose(out[k][bad], rows[k][1].expand_as(out[k][bad]), atol=1e-6)
