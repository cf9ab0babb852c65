"""The adversary block (fedge.runtime.adversary): each attack's rows equal a hand computation, a run
without an adversary is unchanged, the attacks are seeded and alike on both executors, sign flipping
breaks FedAvg but not the median or Krum, ``malicious_kept`` reads the reducer, and bad configs are
refused in one line naming the key."""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
import torch

import fedge
from fedge.aggregation import Updates, build_pipeline
from fedge.aggregation.pipeline import Pipeline
from fedge.config import AdversaryConfig, AggregationConfig, parse_config
from fedge.data.federated import FederatedData
from fedge.errors import ConfigError
from fedge.rng import torch_rng
from fedge.runtime.adversary import Adversary, alie_z, malicious_clients, poisoned

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import sign_flipped_digits, tiny  # noqa: E402

REF = {"w": torch.tensor([[1.0, -2.0], [0.5, 3.0]]), "b": torch.tensor([0.0, 1.0]), "n": torch.tensor(5)}
ROWS = {
    "w": REF["w"] + torch.arange(16.0).reshape(4, 2, 2) / 8,
    "b": REF["b"] + torch.tensor([[1.0, -1.0], [2.0, 0.5], [-3.0, 1.0], [0.25, 4.0]]),
    "n": torch.tensor([7, 7, 7, 7]),
}
BAD = torch.tensor([False, True, False, True])
REDUCE = Pipeline.reduce


def _changes(name: str) -> np.ndarray:
    return (ROWS[name] - REF[name]).numpy().astype(np.float64)


@pytest.mark.parametrize(
    ("attack", "options", "expected"),
    [
        ("sign_flip", {"scale": 3.0}, lambda d, h: -3.0 * d),
        ("scaling", {}, lambda d, h: 2.0 * d),  # n / m = 4 / 2
        ("scaling", {"scale": 5.0}, lambda d, h: 5.0 * d),
        ("free_rider", {}, lambda d, h: 0 * d),
        ("ipm", {"epsilon": 0.5}, lambda d, h: np.broadcast_to(-0.5 * h.mean(0), d.shape)),
        (
            "alie",
            {"z": 1.5},
            lambda d, h: np.broadcast_to(h.mean(0) - 1.5 * h.std(0, ddof=1), d.shape),
        ),
    ],
)
def test_each_attack_equals_the_hand_computation(attack, options, expected):
    out = poisoned(attack, options, ROWS, REF, BAD)
    for name in ("w", "b"):
        d, h = _changes(name)[BAD.numpy()], _changes(name)[~BAD.numpy()]
        want = REF[name].numpy() + expected(d, h)
        np.testing.assert_allclose(out[name][BAD].numpy(), want, atol=1e-6)
        assert torch.equal(out[name][~BAD], ROWS[name][~BAD])  # the honest rows as they were
    assert torch.equal(out["n"], ROWS["n"])  # integer counters are not poisoned


def test_gaussian_is_the_reference_plus_seeded_noise():
    out = poisoned(
        "gaussian", {"sigma": 0.5}, ROWS, REF, BAD, [torch_rng(7, "adversary-gaussian", 1, c) for c in (1, 3)]
    )
    for row, client in zip((1, 3), (1, 3), strict=True):
        g = torch_rng(7, "adversary-gaussian", 1, client)  # one generator per client, its tensors in order
        for name in ("w", "b"):
            want = REF[name] + 0.5 * torch.randn(REF[name].shape, generator=g)
            assert torch.allclose(out[name][row], want, atol=1e-6)


def test_alie_z_is_the_papers_formula():
    # n = 10, m = 2: s = floor(6) - 2 = 4, z = Phi^-1(6 / 10)
    assert alie_z(10, 2) == pytest.approx(NormalDist().inv_cdf(0.6))
    assert alie_z(50, 12) == pytest.approx(NormalDist().inv_cdf((50 - 14) / 50))
    out = poisoned("alie", {}, ROWS, REF, BAD)  # n = 4, m = 2: s = 1, z = Phi^-1(3 / 4)
    h = _changes("b")[~BAD.numpy()]
    want = REF["b"].numpy() + h.mean(0) - NormalDist().inv_cdf(0.75) * h.std(0, ddof=1)
    np.testing.assert_allclose(out["b"][1].numpy(), want, atol=1e-6)


def test_malicious_clients_are_the_list_or_a_seeded_draw():
    listed = AdversaryConfig(clients=[5, 2], attack="free_rider")
    assert malicious_clients(listed, 8, 0).tolist() == [2, 5]
    drawn = AdversaryConfig(clients=0.25, attack="free_rider")
    first = malicious_clients(drawn, 20, 3)
    assert len(first) == 5 and np.array_equal(first, malicious_clients(drawn, 20, 3))
    assert not np.array_equal(first, malicious_clients(drawn, 20, 4))


def _pipeline(stages: list[Any]) -> Pipeline:
    return build_pipeline(AggregationConfig.model_validate({"stages": stages}), "server")


def test_malicious_kept_reads_the_reducer():
    base = torch.zeros(3)
    honest = [base + 0.1 * i for i in range(6)]
    rows = {"x": torch.stack([*honest, base + 50.0])}  # the last row lies, far from the others
    weights = torch.tensor([1.0, 1, 1, 1, 1, 1, 2]) / 8
    clients = np.arange(10, 17)
    adversary = Adversary(AdversaryConfig(clients=[16], attack="free_rider"), np.array([16]), 0)
    updates = Updates.of("server", 1, rows, weights, {"x": base}, tuple(clients.tolist()))
    for stages, want in (([], 2 / 8), ([{"name": "krum", "options": {"byzantine": 1}}], 0.0)):
        pipeline = _pipeline(stages)
        pipeline.reduce(updates)
        figures = adversary.figures(1, clients, weights, pipeline)
        assert figures == {"malicious": 1, "malicious_kept": pytest.approx(want)}
    later = Adversary(AdversaryConfig(clients=[16], attack="free_rider", start_round=2), np.array([16]), 0)
    assert later.figures(1, clients, weights, pipeline) == {"malicious": 0, "malicious_kept": 0.0}


def test_secure_aggregation_says_nothing_of_what_it_kept(tmp_path):
    """secagg's reports are of its protocol, not of rows kept: the run leaves malicious_kept out."""
    config = _run(tmp_path, {"clients": [0], "attack": "sign_flip"}, [{"name": "secagg"}])
    result = fedge.run(config)
    assert result.summary["malicious"] == 2 and result.summary["malicious_kept"] is None
    assert all("malicious_kept" not in row for row in result.metrics)


def _run(tmp_path: Path, adversary: dict | None, stages: list | None = None, **extra: Any) -> dict:
    config = tiny("fedavg", tmp_path / "runs", rounds=2)
    config["partition"]["num_clients"] = 8
    config["aggregation"] = {"stages": stages or []}
    if adversary is not None:
        config["adversary"] = adversary
    for key, value in extra.items():
        config[key] = {**config.get(key, {}), **value}
    return config


def _captured(monkeypatch, config: dict) -> tuple[list[Updates], Any]:
    """The updates every server pipeline received, and the run's result."""
    seen: list[Updates] = []

    def recording(self, updates, cohort=None):
        seen.append(updates)
        return REDUCE(self, updates, cohort)

    monkeypatch.setattr(Pipeline, "reduce", recording)
    return seen, fedge.run(config)


def test_a_run_without_adversary_is_unchanged_and_sign_flip_flips_its_rows(tmp_path, monkeypatch):
    honest, plain = _captured(monkeypatch, _run(tmp_path, None))
    assert "malicious" not in plain.metrics[-1] and "malicious" not in plain.summary
    adversary = {"clients": [1, 6], "attack": "sign_flip", "options": {"scale": 2.0}}
    attacked, result = _captured(monkeypatch, _run(tmp_path, adversary))
    first_h, first_a = honest[0].parts[0], attacked[0].parts[0]
    assert first_a.senders == tuple(range(8))
    ref = attacked[0].reference
    for name, rows in first_a.rows.items():
        if not rows.is_floating_point():
            continue
        for i in range(8):  # round 1 starts from the same model: only clients 1 and 6 change
            want = (
                ref[name] - 2.0 * (first_h.rows[name][i] - ref[name])
                if i in (1, 6)
                else first_h.rows[name][i]
            )
            assert torch.allclose(first_a.rows[name][i], want, atol=1e-6)
    assert [m["malicious"] for m in result.metrics] == [2, 2]
    assert result.summary["malicious"] == 4
    assert result.metrics[0]["malicious_kept"] == pytest.approx(
        0.25
    )  # the mean's weight share: 2 of 8 equal shards
    assert "accuracy" in result.metrics[-1]


def test_start_round_and_label_flip(tmp_path, monkeypatch):
    honest, _ = _captured(monkeypatch, _run(tmp_path, None))
    adversary = {"clients": [0, 3], "attack": "label_flip", "start_round": 2}
    attacked, result = _captured(monkeypatch, _run(tmp_path, adversary))
    assert [m["malicious"] for m in result.metrics] == [0, 2]
    for name, rows in attacked[0].parts[0].rows.items():  # round 1: everyone honest
        assert torch.equal(rows, honest[0].parts[0].rows[name])
    name = next(iter(honest[1].parts[0].rows))
    before, after = honest[1].parts[0].rows[name], attacked[1].parts[0].rows[name]
    changed = [i for i in range(8) if not torch.equal(after[i], before[i])]
    assert 0 in changed and 3 in changed


def test_label_flip_flips_only_the_malicious_shards():
    from fedge.data.dataset import Dataset

    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    dataset = Dataset("toy", torch.zeros(8, 1), y, torch.zeros(2, 1), torch.tensor([0, 3]), num_classes=4)
    shards = [np.array([0, 1]), np.array([2, 3, 4]), np.array([5, 6, 7])]
    data = FederatedData(dataset, shards, [np.array([0]), np.array([1]), np.array([0])], 0)
    adversary = Adversary.of(AdversaryConfig(clients=[1], attack="label_flip"), data, 0, 1)
    assert adversary is not None
    assert adversary.data(1, data).y_train.tolist() == [0, 1, 1, 0, 3, 1, 2, 3]
    assert data.y_train.tolist() == y.tolist() and torch.equal(adversary.data(1, data).y_test, data.y_test)
    overlapping = FederatedData(dataset, [np.array([0, 1]), np.array([1, 2])], [np.array([0])] * 2, 0)
    with pytest.raises(ConfigError, match="adversary.attack"):
        Adversary.of(AdversaryConfig(clients=[1], attack="label_flip"), overlapping, 0, 1)
    with pytest.raises(ConfigError, match="^adversary: .*torchrun"):
        Adversary.of(AdversaryConfig(clients=[1], attack="ipm"), data, 0, 2)


@pytest.mark.parametrize(
    "attack", ["alie", "gaussian", "label_flip", "ipm", "min_max", "min_sum", "backdoor"]
)
def test_both_executors_poison_alike_and_runs_repeat(tmp_path, monkeypatch, attack):
    adversary = {"clients": 0.25, "attack": attack}
    runs = []
    for executor in ("sequential", "batched", "batched"):
        seen, result = _captured(monkeypatch, _run(tmp_path, adversary, engine={"executor": executor}))
        runs.append((seen, result))
    for seen, result in runs[1:]:
        for a, b in zip(runs[0][0], seen, strict=True):
            for name, rows in a.parts[0].rows.items():
                assert torch.allclose(rows.double(), b.parts[0].rows[name].double(), atol=1e-6)
        for field in ("accuracy", "attack_success"):
            want = runs[0][1].metrics[-1].get(field)
            assert result.metrics[-1].get(field) == (None if want is None else pytest.approx(want, abs=1e-6))

    def numbers(result: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if k != "wall_seconds"} for m in result.metrics]

    assert numbers(runs[1][1]) == numbers(runs[2][1])  # seeded: the same run twice


def test_sign_flip_breaks_the_mean_not_the_median_or_krum(tmp_path):
    def digits(stages: list[Any], attacked: bool) -> float:
        return sign_flipped_digits(tmp_path, stages, attacked)

    krum = [{"name": "krum", "options": {"byzantine": 2}}]
    clean, mean = digits([], False), digits([], True)
    median, krummed = digits(["median"], True), digits(krum, True)
    assert mean < clean - 0.3
    assert median > mean + 0.3 and krummed > mean + 0.3


@pytest.mark.parametrize(
    ("adversary", "key"),
    [
        ({"clients": 0.25, "attack": "flip"}, "adversary.attack"),
        ({"clients": 0.25, "attack": "sign_flip", "options": {"sigma": 1}}, "adversary.options.sigma"),
        ({"clients": 0.25, "attack": "scaling", "options": {"scale": -1}}, "adversary.options.scale"),
        ({"clients": 0.25, "attack": "alie", "options": {"z": "big"}}, "adversary.options.z"),
        ({"clients": 1.0, "attack": "ipm"}, "adversary.clients"),
        ({"clients": [1, 1], "attack": "ipm"}, "adversary.clients"),
        ({"clients": [4], "attack": "ipm"}, "adversary.clients"),
        ({"clients": 0.5, "attack": "ipm", "start_round": 0}, "adversary.start_round"),
        ({"clients": 0.5, "attack": "backdoor", "options": {"target": -1}}, "adversary.options.target"),
        ({"clients": 0.5, "attack": "backdoor", "options": {"target": 1.5}}, "adversary.options.target"),
        (
            {"clients": 0.5, "attack": "backdoor", "options": {"trigger_size": 0}},
            "adversary.options.trigger_size",
        ),
        (
            {"clients": 0.5, "attack": "backdoor", "options": {"poison_fraction": 1.5}},
            "adversary.options.poison_fraction",
        ),
        (
            {"clients": 0.5, "attack": "backdoor", "options": {"poison_fraction": 0}},
            "adversary.options.poison_fraction",
        ),
        ({"clients": 0.5, "attack": "backdoor", "options": {"scale": 0}}, "adversary.options.scale"),
        (
            {"clients": 0.5, "attack": "min_max", "options": {"perturbation": "mean"}},
            "adversary.options.perturbation",
        ),
        ({"clients": 0.5, "attack": "min_sum", "options": {"gamma_init": 0}}, "adversary.options.gamma_init"),
        (
            {"clients": 0.5, "attack": "min_max", "options": {"tolerance": -1e-5}},
            "adversary.options.tolerance",
        ),
        ({"clients": 0.5, "attack": "min_max", "options": {"z": 1.0}}, "adversary.options.z"),
    ],
)
def test_bad_adversaries_are_refused_naming_the_key(adversary, key):
    with pytest.raises(ConfigError) as error:
        parse_config({"partition": {"num_clients": 4}, "adversary": adversary})
    assert error.value.key == key and "\n" not in str(error.value)


def test_adversary_is_refused_where_it_is_not_built():
    with pytest.raises(
        ConfigError, match="^adversary: is built for fedavg, fedavg_ft, afind, .* not cse_fsl_async"
    ):
        parse_config({"algorithm": {"name": "cse_fsl_async"}, "adversary": {"clients": 0.5, "attack": "ipm"}})
    assert parse_config({"algorithm": {"name": "fedavg_ft"}, "adversary": {"clients": 0.5, "attack": "ipm"}})


def test_fedavg_ft_takes_an_adversary(tmp_path):
    config = tiny("fedavg_ft", tmp_path / "runs", rounds=1)
    config["algorithm"].update(fraction=1.0, local_epochs=1)
    config["adversary"] = {"clients": [2], "attack": "label_flip"}
    result = fedge.run(config)
    assert result.metrics[-1]["malicious"] == 1 and result.summary["malicious_kept"] == pytest.approx(0.25)
