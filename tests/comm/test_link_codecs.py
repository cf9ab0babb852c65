"""Codecs on every link of the decentralized and hierarchical families: the ledger counts each link's
encoded bits by the codec's formula, receivers work on the decoded values, AirComp refuses a codec."""

from __future__ import annotations

import copy
import csv
import io
import math

import numpy as np
import pytest
import torch
from cases import tiny

from fedge.comm import Ledger, Network, get_codec, sparse_bits
from fedge.config import parse_config
from fedge.errors import ConfigError
from fedge.runner.loop import build_run

RANGE_BITS = 64  # the quantizer's (g_min, g_max) pair


def q8_bits(values: int) -> int:
    return values * (1 + 8) + RANGE_BITS


def fp16_bits(values: int) -> int:
    return values * 16


def kind_bits(ledger: Ledger) -> dict[str, set[int]]:
    """Every kind's set of bits per transfer."""
    out: dict[str, set[int]] = {}
    for row in csv.DictReader(io.StringIO(ledger.to_csv())):
        out.setdefault(row["kind"], set()).add(int(row["bits"]))
    return out


def shared_values(model) -> int:
    return sum(p.numel() for p in model.parameters())


def peer_config(tmp_path, **algorithm) -> dict:
    """The suite's tiny synthetic run with a two-layer MLP and two peers per client."""
    config = tiny(algorithm["name"], tmp_path / "runs")
    config["model"]["options"]["hidden"] = [12, 8]
    config["algorithm"] = {"local_epochs": 1, "batch_size": 16, "peers": 2, **algorithm}
    return config


def hier_config(tmp_path, **algorithm) -> dict:
    return {
        "seed": 5,
        "rounds": 1,
        "data": {"name": "synthetic", "num_train": 320, "num_test": 80, "shape": [1, 6, 6], "num_classes": 4},
        "partition": {"kind": "iid", "num_clients": 4},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "algorithm": {
            "name": "hist",
            "cells": 2,
            "edge_rounds": 1,
            "local_steps": 2,
            "batch_size": 8,
            **algorithm,
        },
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }


def built(raw: dict):
    return build_run(parse_config(copy.deepcopy(raw))).algorithm


# ----- the codecs themselves -------------------------------------------------------------------------


def test_topk_keeps_the_largest_entries_and_pays_the_cheapest_index_layout():
    codec = get_codec("topk:0.25")
    x = torch.tensor([0.1, -3.0, 0.2, 2.0, 0.0, -0.5, 1.0, 0.3])
    out = codec.transmit({"w": x})
    assert torch.equal(out.payload["w"], torch.tensor([0.0, -3.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]))
    assert int(out.bits[0]) == sparse_bits(8, 2, 32) == 2 * (32 + 3)  # coordinates beat a bitmap here
    big = codec.bits(np.array([[1000, 10]]))
    assert int(big[0]) == min(1000 + 250 * 32, 250 * (32 + 10)) + min(320, 10 + 3 * 32, 3 * (32 + 4))


def test_randk_draws_its_entries_from_the_senders_seed_and_sends_values_only():
    codec = get_codec("randk:0.5")
    x = torch.arange(1.0, 11.0).repeat(2, 1)
    a, b = codec.encode({"w": x}, True, [7, 8]), codec.encode({"w": x}, True, [7, 8])
    assert torch.equal(a["w"], b["w"]) and not torch.equal(a["w"][0], a["w"][1])
    assert [int((row != 0).sum()) for row in a["w"]] == [5, 5]
    assert codec.bits(np.array([[10]])).tolist() == [5 * 32]


def test_bf16_and_unknown_names():
    assert get_codec("bf16").bits(np.array([[10]])).tolist() == [160]
    with pytest.raises(ValueError, match="unknown codec"):
        get_codec("topk:2")


def test_a_stochastic_link_draws_fresh_values_per_round_and_the_same_for_the_same_sends():
    x = {"w": torch.linspace(-1.0, 1.0, 101)}
    first, second = (Network(Ledger(), seed=4).link("q2") for _ in range(2))
    assert torch.equal(first.send(1, "client:0", "client:1", "m", x).payload["w"],
                       second.send(1, "client:0", "client:1", "m", x).payload["w"])  # fmt: skip
    assert not torch.equal(first.send(2, "client:0", "client:1", "m", x).payload["w"],
                           first.send(3, "client:0", "client:1", "m", x).payload["w"])  # fmt: skip


# ----- config --------------------------------------------------------------------------------------


def test_codec_names_are_checked_and_aircomp_takes_no_codec(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.codec_model"):
        parse_config(peer_config(tmp_path, name="gossip", codec_model="q40"))
    with pytest.raises(ConfigError, match="algorithm.codec_up.*analogue"):
        parse_config(hier_config(tmp_path, aggregation="aircomp", codec_up="fp16"))
    parse_config(hier_config(tmp_path, aggregation="aircomp", codec_down="q8", codec_edge_up="topk:0.5"))
    with pytest.raises(ConfigError, match="algorithm.codec_model"):
        built(peer_config(tmp_path, name="dispfl", codec_model="fp16"))


# ----- decentralized --------------------------------------------------------------------------------


def test_peer_links_count_each_kind_at_its_codecs_formula(tmp_path):
    raw = peer_config(tmp_path, name="afind", k0=2, codec_model="q8", codec_request="fp16", codec_proxy="q8")
    algorithm = built(raw)
    for t in (1, 2):
        algorithm.run_round(t)
    values = shared_values(algorithm.model)
    proxy = algorithm.selector.prober.dim
    bits = kind_bits(algorithm.ctx.network.ledger)
    assert bits == {
        "model_request": {fp16_bits(values)},
        "peer_model": {q8_bits(values)},
        "proxy": {q8_bits(proxy)},
        "loss": {q8_bits(1)},
    }


@pytest.mark.parametrize("codec", ["fp16", "q8"])
def test_peers_mix_the_decoded_rows_and_their_own_row_exactly(tmp_path, codec):
    algorithm = built(peer_config(tmp_path, name="gossip", codec_model=codec))
    algorithm.round = 1
    params, buffers = algorithm.rows(range(4))
    params = {k: v + 0.01 * torch.randn_like(v) for k, v in params.items()}
    take_next = torch.roll(torch.eye(4, dtype=torch.float64), 1, dims=1)  # client i takes i+1's row
    keep_own = torch.eye(4, dtype=torch.float64)
    received, _ = algorithm.mixed(take_next, params, buffers)
    own, _ = algorithm.mixed(keep_own, params, buffers)
    flat = torch.cat([received[k][0].reshape(-1) for k in params])
    sent = torch.cat([params[k][1].reshape(-1) for k in params])
    assert not torch.equal(flat, sent)
    if codec == "fp16":
        assert torch.equal(flat, sent.half().float())
    else:  # one (g_min, g_max) pair over the whole message: at most 2^8 magnitudes, signs kept
        assert len(torch.unique(flat.abs())) <= 2**8
        assert bool((torch.sign(flat) * torch.sign(sent) >= 0).all())
    assert all(torch.equal(own[k], params[k]) for k in params)


# ----- hierarchical ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["hist", "hfedavg"])
def test_hierarchy_links_count_each_kind_at_its_codecs_formula(tmp_path, name):
    plain = built(hier_config(tmp_path, name=name))
    plain.run_round(1)
    coded = built(
        hier_config(
            tmp_path, name=name, codec_up="q8", codec_down="fp16", codec_edge_up="bf16", codec_edge_down="q4"
        )  # fmt: skip
    )
    coded.run_round(1)
    values = {kind: {b // 32 for b in bits} for kind, bits in kind_bits(plain.ctx.network.ledger).items()}
    assert kind_bits(coded.ctx.network.ledger) == {
        "model_up": {q8_bits(v) for v in values["model_up"]},
        "model_down": {fp16_bits(v) for v in values["model_down"]},
        "submodel_up": {16 * v for v in values["submodel_up"]},
        "submodel_down": {v * (1 + 4) + RANGE_BITS for v in values["submodel_down"]},
    }
    assert set(coded.client_up_bits.tolist()) == {q8_bits(v) for v in values["model_up"]}


def test_clients_train_from_the_decoded_broadcast(tmp_path, monkeypatch):
    algorithm = built(hier_config(tmp_path, name="hfedavg", codec_down="fp16"))
    starts = []
    train = algorithm.ctx.executor.train

    def spy(step, bank, *args, **kwargs):
        starts.append({k: v.clone() for k, v in bank.params.items()})
        return train(step, bank, *args, **kwargs)

    monkeypatch.setattr(algorithm.ctx.executor, "train", spy)
    cloud = {k: v.clone() for k, v in algorithm.params.items()}
    algorithm.run_round(1)
    for name, start in starts[0].items():
        assert not torch.equal(start[0], cloud[name]) or torch.equal(cloud[name], cloud[name].half().float())
        assert torch.equal(start, cloud[name].half().float().expand_as(start))


@pytest.mark.parametrize("link", ["codec_up", "codec_edge_up"])
def test_the_edge_and_cloud_work_on_decoded_uploads(tmp_path, link):
    """One client in one cell: the cloud model after a round is exactly what the last upload decoded to."""
    raw = hier_config(tmp_path, name="hfedavg", cells=1, **{link: "fp16"})
    raw["partition"]["num_clients"] = 1
    algorithm = built(raw)
    algorithm.run_round(1)
    for value in algorithm.params.values():
        assert torch.equal(value, value.half().float())
    plain = built(hier_config(tmp_path, name="hfedavg", cells=1) | {"partition": raw["partition"]})
    plain.run_round(1)
    assert any(not torch.equal(v, v.half().float()) for v in plain.params.values())


def test_hist_optimised_sizes_use_the_uplink_codecs_bits_per_value(tmp_path):
    algorithm = built(hier_config(tmp_path, codec_up="q8", mask_sizes="optimised"))
    assert algorithm.up_value_bits == pytest.approx(9 + RANGE_BITS / algorithm.model_values)
    assert math.isclose(built(hier_config(tmp_path)).up_value_bits, 32.0)


# ----- split ----------------------------------------------------------------------------------------


def test_split_links_take_the_same_codec_names_and_labels_stay_exact(tmp_path):
    raw = {
        "seed": 1,
        "rounds": 1,
        "data": {"name": "synthetic", "num_train": 64, "num_test": 16, "shape": [1, 6, 6], "num_classes": 4},
        "partition": {"kind": "iid", "num_clients": 2},
        "model": {"name": "mlp", "cut": 1, "options": {"hidden": [16, 12]}},
        "algorithm": {"name": "splitfed_v2", "batch_size": 8, "local_steps": 1, "codec_up": "q8"},
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }
    algorithm = built(raw)
    algorithm.run_round(1)
    bits = kind_bits(algorithm.ctx.network.ledger)
    assert bits["smashed_up"] == {q8_bits(8 * 16)} and bits["labels_up"] == {8 * 32}
