"""FLTrust (fedge.aggregation.fltrust, fedge.runtime.root): the reducer equals a hand-written numpy
reference, equal trust and norms give the mean, an opposite row gets no weight, the root training is
seeded, charged and alike on both executors, sign flipping does not break it, and misplaced stages are
refused in one line naming the key."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fedge
from fedge.aggregation import Updates, build_pipeline
from fedge.aggregation.fltrust import FLTrust, RootUpdate
from fedge.aggregation.robust import RobustReducer
from fedge.config import AggregationConfig
from fedge.errors import ConfigError
from fedge.extend import parse_config
from fedge.runtime.root import root_indices

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import final_state, sign_flipped_digits, staged  # noqa: E402

FLTRUST = {"name": "fltrust", "at": ["server"]}


def _reduce(rows: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], root: dict[str, torch.Tensor]):
    """The server pipeline's FLTrust result and its reducer, ``root`` given as the root model."""
    pipeline = build_pipeline(AggregationConfig.model_validate({"stages": [FLTRUST]}), "server")
    reducer = pipeline.reducer
    assert isinstance(reducer, FLTrust)
    reducer.root = RootUpdate(root, 0.0)
    count = len(next(iter(rows.values())))
    weights = torch.full((count,), 1.0 / count, dtype=torch.float64)
    out = pipeline.reduce(Updates.of("server", 1, rows, weights, reference, tuple(range(count))))
    return out, reducer


def _numpy_fltrust(g: np.ndarray, g0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The paper's Eqs. 5-7, one client at a time: the aggregated change and the trust scores."""
    scores = np.array([max(0.0, gi @ g0 / (np.linalg.norm(gi) * np.linalg.norm(g0))) for gi in g])
    total = np.zeros_like(g0)
    for ts, gi in zip(scores, g, strict=True):
        total += ts * gi * np.linalg.norm(g0) / np.linalg.norm(gi)
    return total / scores.sum(), scores


def test_fltrust_equals_the_numpy_reference():
    gen = torch.Generator().manual_seed(0)
    reference = {"w": torch.randn(3, 4, generator=gen), "b": torch.randn(5, generator=gen)}
    g0 = {"w": torch.randn(3, 4, generator=gen), "b": torch.randn(5, generator=gen)}
    change = torch.randn(7, 17, generator=gen) + 0.5 * torch.cat([g0["w"].flatten(), g0["b"]])
    change[2] *= -1.0  # one row against the root direction
    rows = {"w": reference["w"] + change[:, :12].reshape(7, 3, 4), "b": reference["b"] + change[:, 12:]}
    root = {n: reference[n] + g0[n] for n in g0}
    out, reducer = _reduce(rows, {**reference, "n": torch.tensor(3)}, root)

    flat = lambda t: np.concatenate([t["w"].reshape(len(t["w"]), -1), t["b"]], axis=1)  # noqa: E731
    g = flat({n: (rows[n] - reference[n]).double().numpy() for n in rows})
    want, scores = _numpy_fltrust(g, np.concatenate([g0["w"].flatten(), g0["b"]]).astype(np.float64))
    got = np.concatenate([(out["w"] - reference["w"]).flatten(), out["b"] - reference["b"]])
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert scores[2] == 0 and (scores > 0).sum() == 6
    report = reducer.reports[0]
    np.testing.assert_allclose(report.scores, scores, atol=1e-6)
    np.testing.assert_allclose(report.kept, scores / scores.sum(), atol=1e-6)
    assert 2 not in report.chosen and report.senders == tuple(range(7))


def test_equal_trust_and_norms_give_the_mean_and_an_opposite_row_no_weight():
    h = 0.5**0.5
    reference = {"x": torch.tensor([1.0, -1.0, 2.0, 0.0])}
    rows = {"x": reference["x"] + torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 1]])}
    root = {"x": reference["x"] + torch.tensor([1.0, 1, h, h])}  # |g0| = sqrt 3 = |g_i|, equal cosines
    out, reducer = _reduce(rows, reference, root)
    assert torch.allclose(out["x"], rows["x"].mean(dim=0), atol=1e-6)
    assert reducer.reports[0].kept == pytest.approx((0.5, 0.5))

    opposite = {"x": torch.cat([rows["x"], (2 * reference["x"] - root["x"])[None] * 1.0])}
    attacked, reducer = _reduce(opposite, reference, root)
    assert torch.allclose(attacked["x"], out["x"], atol=1e-6)  # the row -g0 changes nothing
    assert reducer.reports[0].kept[2] == 0.0

    against = {"x": 2 * reference["x"] - rows["x"]}  # every row opposite: no trust, no change
    unchanged, _ = _reduce(against, reference, root)
    assert torch.equal(unchanged["x"], reference["x"])


def test_the_root_set_is_seeded_and_bounded():
    first = root_indices(5, 1000, 100, "aggregation.stages.0")
    assert len(np.unique(first)) == 100 and np.array_equal(first, root_indices(5, 1000, 100, "k"))
    assert not np.array_equal(first, root_indices(6, 1000, 100, "k"))
    with pytest.raises(ConfigError, match=r"^aggregation.stages.0.options.root_samples: 100 is more"):
        root_indices(5, 50, 100, "aggregation.stages.0")


def _run(tmp_path: Path, executor: str) -> Path:
    stage = {**FLTRUST, "options": {"root_samples": 30, "root_epochs": 2, "lr": 0.05}}
    config = staged(tmp_path, {"name": "fedavg", "batch_size": 8}, [stage], executor)
    config["adversary"] = {"clients": [1], "attack": "sign_flip"}
    result = fedge.run(config)
    assert [m["malicious_kept"] for m in result.metrics] == [0.0, 0.0]
    return Path(result.run_dir)


def test_both_executors_agree_and_the_root_training_is_charged(tmp_path, monkeypatch):
    charged: list[float] = []
    charge = RobustReducer.charge

    def recording(self, site):
        charged.extend(r.flops for r in self.reports)
        charge(self, site)

    monkeypatch.setattr(RobustReducer, "charge", recording)
    states = {ex: final_state(_run(tmp_path, ex)) for ex in ("sequential", "batched")}
    for name, value in states["sequential"].items():
        assert torch.allclose(value, states["batched"][name], atol=1e-6)
    params = sum(v.numel() for v in states["sequential"].values())  # d: the MLP's floating values
    flops_per_sample = 2 * (36 * 16 + 16 * 4)  # the model's forward multiply-adds x 2
    root = 3 * flops_per_sample * 30 * 2  # forward + backward, 30 samples, 2 epochs
    assert charged[:2] == charged[2:]  # two rounds on each executor, charged alike
    assert charged[0] == pytest.approx((6 * 6 + 2) * params + root, rel=0.02)


def test_fltrust_keeps_digits_near_clean_under_sign_flip(tmp_path):
    clean = sign_flipped_digits(tmp_path, [], False, rounds=4)
    trusted = sign_flipped_digits(tmp_path, [FLTRUST], True, rounds=4)
    assert trusted > clean - 0.05


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (  # every site, peers too, which train no root set
            {"aggregation": {"stages": [{"name": "fltrust", "options": {"root_samples": 50}}]}},
            "aggregation.stages.0.options.root_samples",
        ),
        (
            {"aggregation": {"stages": [{**FLTRUST, "options": {"root_samples": 0}}]}},
            "aggregation.stages.0.options.root_samples",
        ),
        (
            {"aggregation": {"stages": [{**FLTRUST, "options": {"root_epochs": 1.5}}]}},
            "aggregation.stages.0.options.root_epochs",
        ),
        (
            {"aggregation": {"stages": [{**FLTRUST, "options": {"lr": -1}}]}},
            "aggregation.stages.0.options.lr",
        ),
    ],
)
def test_bad_fltrust_stages_are_refused_naming_the_key(config, key):
    with pytest.raises(ConfigError) as error:
        parse_config(config)  # every site's pipeline is built as a run would
    assert error.value.key == key and "\n" not in str(error.value)


def test_fltrust_is_refused_at_a_server_without_root_training(tmp_path):
    config = staged(tmp_path, {"name": "splitfed_v1"}, [FLTRUST])
    config["model"]["cut"] = 1
    with pytest.raises(ConfigError, match=r"^aggregation.stages.0.name: fltrust needs the server's root"):
        fedge.run(config)
