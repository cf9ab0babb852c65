"""Config: defaults, YAML + dotted overrides, and one-line errors naming the offending key."""

from __future__ import annotations

import pytest

from fedge.config import apply_override, load_config, parse_config
from fedge.errors import ConfigError


def test_defaults_are_the_quickstart():
    cfg = parse_config({})
    assert (cfg.data.name, cfg.algorithm.name, cfg.partition.kind) == ("digits", "fedavg", "dirichlet")


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rounds: 5\npartition:\n  num_clients: 4\nalgorithm:\n  name: fedavg\n  fraction: 0.5\n")
    cfg = load_config(path, ["partition.alpha=0.25", "algorithm.optimizer.lr=0.2", "data.shape=[1,4,4]"])
    assert cfg.rounds == 5 and cfg.partition.num_clients == 4 and cfg.partition.alpha == 0.25
    assert cfg.algorithm.fraction == 0.5 and cfg.algorithm.optimizer.lr == 0.2 and cfg.data.shape == [1, 4, 4]


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = parse_config({"algorithm": {"name": "fedavg", "local_epochs": 3}, "seed": 9})
    path = tmp_path / "r.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"partition": {"alpha": 0}}, "partition.alpha"),
        ({"partition": {"alpha": -1}}, "partition.alpha"),
        ({"algorithm": {"name": "fedavg", "fraction": 1.5}}, "algorithm.fraction"),
        ({"algorithm": {"name": "fedavg", "fraction": 0}}, "algorithm.fraction"),
        ({"algorithm": {"name": "fedavg", "colour": 1}}, "algorithm.colour"),
        ({"algorithm": {"name": "nope"}}, "algorithm"),
        ({"data": {"name": "imagenet"}}, "data.name"),
        ({"rounds": 0}, "rounds"),
        ({"bogus": 1}, "bogus"),
        ({"model": {"cut": 0}}, "model.cut"),
    ],
)
def test_bad_values_name_their_key(raw, key):
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.key == key
    assert "\n" not in str(info.value)


def test_override_errors():
    with pytest.raises(ConfigError, match="key=value"):
        apply_override({}, "rounds")
    with pytest.raises(ConfigError, match="rounds"):
        apply_override({"rounds": 3}, "rounds.x=1")


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
