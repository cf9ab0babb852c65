"""Secure aggregation (``secagg``, fedge.aggregation.secure): the server's unmasked sum is the plain sum
to the fixed point's bound, a strict subset of masked vectors is uniform, dropouts up to the threshold
are recovered exactly and one more is refused, the ledger carries the protocol's bit formula, the clock
its compute, and a FedAvg run with it ends where plain FedAvg does."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy.stats import chisquare
from typer.testing import CliRunner

import fedge
from fedge.aggregation import BlockMean, Reducer, Transform, Updates
from fedge.aggregation import secure_protocol as protocol
from fedge.aggregation.pipeline import Pipeline, build_pipeline
from fedge.aggregation.private import Clip, Gaussian, GaussianShare
from fedge.aggregation.secure import SecureAggregation
from fedge.aggregation.secure_protocol import SecAggRound, secagg_traffic, shamir_reconstruct, shamir_share
from fedge.aggregation.stage import StageRun
from fedge.cli.commands import app
from fedge.comm import Ledger, Network
from fedge.config import AggregationConfig, PrivacyConfig, SystemConfig
from fedge.errors import ConfigError
from fedge.privacy.run import Participation, RunPrivacy
from fedge.runner import checkpoint
from fedge.system import SystemModel


def rows(n: int, seed: int = 0, spread: float = 1.0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "w": spread * torch.randn(n, 4, 3, generator=gen),
        "b": spread * torch.randn(n, 3, generator=gen),
        "count": torch.randint(0, 9, (n,), generator=gen),
    }


def sample_weights(n: int, seed: int = 1) -> torch.Tensor:
    w = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1
    return w / w.sum()


def flat(tensors: dict[str, torch.Tensor], lead: int = 1) -> torch.Tensor:
    return torch.cat(
        [t.reshape(*t.shape[:lead], -1).double() for k, t in tensors.items() if k != "count"], -1
    )


def plain_mean(x: dict[str, torch.Tensor], w: torch.Tensor, bound: float, keep: list[int]) -> torch.Tensor:
    """``sum_S w x / sum_S w`` over the survivors ``keep`` of the clipped rows, as one vector."""
    clipped = flat(x).clamp(-bound, bound)[keep]
    return (w[keep, None] * clipped).sum(0) / w[keep].sum()


FLOAT32 = 2.0**-24  # float32's relative rounding (the stage returns the rows' dtype)


def bound(stage: SecureAggregation) -> float:
    """The fixed point's bound on each coordinate of the weighted sum: ``n 2^-f``."""
    (report,) = stage.reports
    return len(report.senders) * 2.0**-report.fraction_bits


# ----- the pieces: Shamir, key agreement, the group ----------------------------------------------


def test_any_threshold_shares_rebuild_the_secret_and_fewer_do_not():
    rng = random.Random(4)
    secret = rng.randrange(protocol.FIELD_PRIME)
    shares = shamir_share(secret, 3, 6, rng)
    for pick in ([0, 1, 2], [5, 2, 3], [1, 3, 4, 5]):
        assert shamir_reconstruct([shares[i] for i in pick]) == secret
    assert shamir_reconstruct(shares[:2]) != secret


def is_probable_prime(n: int) -> bool:
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_the_fallback_group_is_a_safe_prime_and_both_agreements_are_symmetric(monkeypatch):
    p = protocol.MODP_PRIME
    assert p.bit_length() == 2048 and is_probable_prime(p) and is_probable_prime((p - 1) // 2)
    for x25519 in (protocol.X25519, False):
        monkeypatch.setattr(protocol, "X25519", x25519)
        a, b = 12345678901234567890, 98765432109876543210
        shared = protocol.agree(a, protocol.public_key(b))
        assert shared == protocol.agree(b, protocol.public_key(a))
        assert shared != protocol.agree(a + 8, protocol.public_key(b))  # X25519 clears the low 3 bits


def test_both_key_agreements_give_the_same_sum(monkeypatch):
    inputs = torch.randint(0, 2**16, (5, 50), generator=torch.Generator().manual_seed(2))
    sums = []
    for x25519 in (protocol.X25519, False):
        monkeypatch.setattr(protocol, "X25519", x25519)
        rnd = SecAggRound(5, 50, 16, seed=9)
        sums.append(rnd.unmask(rnd.masked(inputs), [3]))
    want = (inputs.sum(0) - inputs[3]) % 2**16
    assert torch.equal(sums[0], want) and torch.equal(sums[1], want)


# ----- the server's view --------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [32, 16])
def test_the_unmasked_sum_is_the_plain_sum_within_the_fixed_point_bound(bits):
    n, bound_ = 6, 2.0
    x, w = rows(n, spread=1.5), sample_weights(n)  # some coordinates beyond the range: clipped
    stage = SecureAggregation(bits=bits, range=bound_)
    out = stage.reduce(Updates.of("server", 1, x, w, senders=tuple(range(10, 16))))
    got = flat({k: v[None] for k, v in out.items()})[0]
    want = plain_mean(x, w, bound_, list(range(n)))
    error = (got - want).abs().max()
    assert stage.reports[0].clipped > 0
    assert error <= bound(stage) + FLOAT32 * want.abs().max()  # the fixed point's, then float32's rounding
    assert error > 0  # fixed point, not the float sum
    assert out["w"].dtype == x["w"].dtype and torch.equal(out["count"], x["count"].max())


def test_stochastic_rounding_stays_in_the_bound_repeats_by_seed_and_is_unbiased():
    n = 5
    x, w = rows(n), sample_weights(n)
    want = plain_mean(x, w, 8.0, list(range(n)))

    def secure(seed: int) -> torch.Tensor:
        stage = SecureAggregation(bits=12, rounding="stochastic")
        stage.bind(StageRun("server", seed))
        out = stage.reduce(Updates.of("server", 1, x, w))
        got = flat({k: v[None] for k, v in out.items()})[0]
        assert (got - want).abs().max() <= bound(stage) + FLOAT32 * want.abs().max()
        return got.double()

    first = secure(0)
    assert torch.equal(first, secure(0)) and not torch.equal(first, secure(1))
    single = (first - want).abs().mean()
    averaged = (torch.stack([secure(seed) for seed in range(40)]).mean(0) - want).abs().mean()
    assert averaged < single / 3  # errors of independent draws average out: no bias


def test_a_strict_subset_of_masked_vectors_is_uniform_and_the_whole_sum_is_not():
    n, d, bits = 4, 16384, 8
    inputs = torch.full((n, d), 3, dtype=torch.int64)  # far from uniform
    for k in (None, 2):
        rnd = SecAggRound(n, d, bits, seed=5, k=k)
        masked = rnd.masked(inputs)
        for subset in ([0], [1, 2], [0, 1, 3]):
            total = masked[subset].sum(0) % 2**bits
            counts = torch.bincount(total, minlength=2**bits).numpy()
            assert chisquare(counts).pvalue > 1e-3
        assert (
            chisquare(torch.bincount(inputs[0], minlength=2**bits).numpy()).pvalue < 1e-12
        )  # the test can fail
        assert torch.equal(rnd.unmask(masked, []), inputs.sum(0) % 2**bits)  # only the server's unmasking


@pytest.mark.parametrize("neighbours, n, dropped", [(None, 6, [11, 14]), (4, 8, [10, 13])])
def test_dropouts_up_to_the_threshold_are_recovered_exactly(neighbours, n, dropped):
    x, w = rows(n, seed=3), sample_weights(n, seed=4)
    ids = tuple(range(10, 10 + n))
    stage = SecureAggregation(neighbours=neighbours, dropout=dropped)
    out = stage.reduce(Updates.of("server", 2, x, w, senders=ids))
    keep = [i for i, c in enumerate(ids) if c not in dropped]
    got = flat({k: v[None] for k, v in out.items() if k != "count"})[0]
    assert stage.reports[0].dropped == tuple(dropped)
    want = plain_mean(x, w, 8.0, keep)
    assert (got - want).abs().max() <= bound(stage) + FLOAT32 * want.abs().max()
    # the ints mod 2^bits are exact: the same encoded survivors summed without any masks
    report = stage.reports[0]
    scale = 2.0**report.fraction_bits
    encoded = torch.round(w[keep, None] * flat(x)[keep].clamp(-8, 8) * scale).long()
    exact = encoded.sum(0).double() / scale / w[keep].sum()
    assert torch.equal(got.float(), exact.float())


def test_one_dropout_more_than_the_threshold_allows_is_refused_in_one_line():
    n = 6  # complete graph: holders 6, threshold 4 -> two may drop
    x, w = rows(n), sample_weights(n)
    SecureAggregation(dropout=[0, 1]).reduce(Updates.of("server", 1, x, w, senders=tuple(range(n))))
    with pytest.raises(ConfigError) as refused:
        SecureAggregation(dropout=[0, 1, 2]).reduce(Updates.of("server", 1, x, w, senders=tuple(range(n))))
    line = str(refused.value)
    assert "\n" not in line and line.startswith("aggregation.stages: secagg") and "threshold 4" in line
    with pytest.raises(ConfigError, match="threshold 5"):  # a higher threshold tolerates fewer
        SecureAggregation(threshold=5, dropout=[0, 1]).reduce(Updates.of("server", 1, x, w))


def test_a_dropout_fraction_drops_that_many_senders_drawn_from_the_seed():
    n = 10
    x, w = rows(n), sample_weights(n)
    dropped = []
    for seed in (0, 0, 1):
        stage = SecureAggregation(dropout=0.3)
        stage.bind(StageRun("server", seed))
        stage.reduce(Updates.of("server", 1, x, w, senders=tuple(range(n))))
        dropped.append(stage.reports[0].dropped)
    assert len(dropped[0]) == 3 and dropped[0] == dropped[1] and dropped[0] != dropped[2]


# ----- the cost ----------------------------------------------------------------------------------


@pytest.mark.parametrize("neighbours, dropout", [(None, []), (4, [2, 5])])
def test_the_ledger_carries_the_protocols_bit_formula(neighbours, dropout):
    n, bits = 9, 24
    x, w = rows(n), sample_weights(n)
    ledger = Ledger()
    system = SystemModel(SystemConfig(), n, 0)
    stage = SecureAggregation(bits=bits, neighbours=neighbours, dropout=dropout)
    stage.bind(StageRun("server", 3, None, Network(ledger), system))
    stage.reduce(Updates.of("server", 1, x, w, senders=tuple(range(n))))
    report, d = stage.reports[0], 4 * 3 + 3
    k = n - 1 if neighbours is None else neighbours
    want = secagg_traffic(n, d, bits, k, report.threshold, len(dropout))
    got = {kind: sum(b for (name, _), b in ledger.totals().items() if name == kind) for kind in want}
    assert got == want == report.traffic
    assert ledger.total_bits("up", ["secagg_masked"]) == (n - len(dropout)) * d * bits
    # the compute is on the clock: client mask expansion, then the server's unmasking
    phases = system.clock.seconds_by_phase
    assert system.clock.seconds == pytest.approx(report.seconds) and report.seconds > 0
    assert phases["client_compute"] > 0 and phases["server_compute"] > 0


def test_the_traffic_formula_refuses_fewer_survivors_than_the_threshold():
    assert secagg_traffic(5, 10, 8, 4, 3, 2)["secagg_masked"] == 3 * 10 * 8
    with pytest.raises(ValueError, match="threshold 3"):
        secagg_traffic(5, 10, 8, 4, 3, 3)


# ----- in a pipeline -----------------------------------------------------------------------------


class Halve(Transform):
    def apply(self, updates: Updates) -> Updates:
        part = updates.parts[0]
        return updates.with_parts(type(part)({k: v / 2 for k, v in part.rows.items()}, part.weights))


def test_a_transform_before_it_acts_on_each_row_before_the_masking():
    n = 5
    x, w = rows(n), sample_weights(n)
    stage = SecureAggregation()
    out = Pipeline((Halve(),), stage, ("halve", "secagg")).reduce(Updates.of("server", 1, x, w))
    got = flat({k: v[None] for k, v in out.items()})[0]
    halved = {k: v / 2 for k, v in x.items()}
    want = plain_mean(halved, w, 8.0, list(range(n)))
    assert (got - want).abs().max() <= bound(stage) + FLOAT32 * want.abs().max()


def test_each_edge_sums_its_own_cell_securely():
    cells, per = 2, 4
    x = rows(cells * per, seed=7)
    x.pop("count")
    weights = torch.zeros(cells, cells * per, dtype=torch.float64)
    for j in range(cells):
        weights[j, j * per : (j + 1) * per] = 1 / per
    updates = Updates.of("edge", 1, x, weights)
    ledger = Ledger()
    stage = SecureAggregation()
    stage.bind(StageRun("edge", 0, None, Network(ledger)))
    got, want = stage.reduce(updates), BlockMean().reduce(updates)
    for name in x:
        assert got[name].shape == want[name].shape
        tolerance = per * 2.0 ** -stage.reports[0].fraction_bits
        torch.testing.assert_close(got[name], want[name], rtol=FLOAT32, atol=tolerance)
    assert {name for name in ledger.nodes() if name.startswith("edge")} == {"edge:0", "edge:1"}


def test_its_options_and_sites_are_refused_in_one_line_naming_the_key():
    for options, word in [
        ({"bits": 3}, "bits"),
        ({"neighbours": 3}, "neighbours"),
        ({"dropout": 1.5}, "dropout"),
        ({"rounding": "up"}, "rounding"),
        ({"bits": 8, "range": 1000.0}, "bits"),  # no fraction bits left: refused at the aggregation
    ]:
        config = AggregationConfig.model_validate({"stages": [{"name": "secagg", "options": options}]})
        with pytest.raises(ConfigError, match=f"^aggregation.stages.0.options: secagg: {word}"):
            build_pipeline(config, "server")
    x, w = rows(4), torch.full((4, 4), 0.25, dtype=torch.float64)
    with pytest.raises(ConfigError, match="not the peer"):
        SecureAggregation().reduce(Updates.of("peer", 1, x, w))


# ----- distributed DP: Gaussian shares summed securely ------------------------------------------


def dp_privacy(clients: int, participation: Participation) -> RunPrivacy:
    privacy = RunPrivacy(PrivacyConfig(), clients, seed=5)
    privacy.participation = participation
    return privacy


def dp_pipeline(privacy: RunPrivacy, site: str, *stages: Transform | Reducer) -> Pipeline:
    for i, stage in enumerate(stages):
        stage.bind(StageRun(site, 5, privacy, key=f"aggregation.stages.{i}"))
    *transforms, reducer = stages
    assert isinstance(reducer, Reducer)
    return Pipeline(tuple(transforms), reducer, ())  # type: ignore[arg-type]


def dp_updates(site: str, n: int) -> Updates:
    """``n`` senders' models near a reference (one model at a server, one per two-client cell at an
    edge), their weights the site's: sample shares at a server, ``1/2`` in a cell."""
    x = rows(n, seed=6, spread=0.3)
    x.pop("count")
    if site == "server":
        reference = {k: v.mean(0) for k, v in x.items()}
        return Updates.of(site, 2, x, sample_weights(n), reference, tuple(range(10, 10 + n)))
    weights = torch.zeros(n // 2, n, dtype=torch.float64)
    for j in range(n // 2):
        weights[j, 2 * j : 2 * j + 2] = 0.5
    reference = {k: torch.stack([v[2 * j : 2 * j + 2].mean(0) for j in range(n // 2)]) for k, v in x.items()}
    return Updates.of(site, 2, x, weights, reference, tuple(range(10, 10 + n)))


@pytest.mark.parametrize(
    "site, participation",
    [
        ("server", Participation("none", 6)),
        ("server", Participation("poisson", 20, probability=0.25)),
        ("edge", Participation("none", 6)),
    ],
)
def test_gaussian_shares_under_secagg_equal_the_distributed_gaussian_and_record_its_releases(
    site, participation
):
    n, z = 6, 1.5
    updates = dp_updates(site, n)
    shared = dp_privacy(20, participation)
    stage = SecureAggregation(bits=16)  # few fraction bits: the fixed point's error shows in float32
    secure = dp_pipeline(shared, site, Clip(clip=0.5, weights="uniform"), GaussianShare(z), stage)
    central = dp_privacy(20, participation)
    plain = dp_pipeline(central, site, Clip(clip=0.5), Gaussian(z, mode="distributed"))
    got, want = secure.reduce(updates), plain.reduce(updates)
    scale = 6 / 5 if participation.sampling == "poisson" else 1.0  # |S| / (q N): the sum over q N
    tolerance = n * 2.0 ** -stage.reports[0].fraction_bits * scale
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=FLOAT32, atol=tolerance)
    assert any(not torch.equal(got[name], want[name]) for name in want)  # fixed point, not the float sum
    assert shared.ledger.releases == central.ledger.releases
    kinds = {(r.kind, r.noise_multiplier, r.clip, r.sampling, r.clients) for r in shared.ledger.releases}
    if site == "edge":
        assert kinds == {("edge", z, 0.5, "none", (10, 11)), ("edge", z, 0.5, "none", (12, 13)),
                         ("edge", z, 0.5, "none", (14, 15))}  # fmt: skip
    else:
        assert kinds == {("update", z, 0.5, participation.sampling, None)}
    assert shared.ledger.summary() == central.ledger.summary()  # the same epsilon


def test_secagg_with_shares_is_refused_without_their_reducer_clip_or_with_dropouts():
    def pipeline(*stages: dict) -> None:
        build_pipeline(AggregationConfig.model_validate({"stages": list(stages)}), "server")

    share = {"name": "gaussian_share", "options": {"noise_multiplier": 1.0}}
    for closing in ([], ["mean"]):
        with pytest.raises(
            ConfigError, match=r"^aggregation\.stages\.1: gaussian_share at the server: its noise"
        ):
            pipeline("clip", share, *closing)
    for dropout in (0.2, [3]):
        secagg = {"name": "secagg", "options": {"dropout": dropout}}
        with pytest.raises(
            ConfigError, match=r"^aggregation\.stages\.2: secagg at the server: dropout"
        ) as refused:
            pipeline("clip", share, secagg)
        assert "\n" not in str(refused.value)
    pipeline("clip", share, "secagg")  # composes
    pipeline({"name": "secagg", "options": {"dropout": 0.2}})  # without shares, dropouts are the protocol's
    noised = replace(dp_updates("server", 4), noise=1.0)  # shares without a clip's bound
    stage = dp_pipeline(dp_privacy(4, Participation("none", 4)), "server", SecureAggregation())
    with pytest.raises(
        ConfigError, match=r"^aggregation\.stages\.0: secagg sums Gaussian shares: it needs a clip"
    ):
        stage.reduce(noised)


# ----- a whole run --------------------------------------------------------------------------------


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(run_dir / "checkpoint.pt").state["algorithm"]["params"]


def test_fedavg_on_digits_with_secagg_ends_where_plain_fedavg_does(tmp_path):
    base = {
        "rounds": 2,
        "partition": {"num_clients": 4},
        "engine": {"threads": 1},
        "output": {"dir": str(tmp_path), "plots": False},
    }
    plain = fedge.run({**base, "output": {**base["output"], "name": "plain"}})
    secure = {**base, "aggregation": {"stages": [{"name": "secagg", "options": {"bits": 32}}]}}
    path = tmp_path / "secagg.yaml"
    path.write_text(yaml.safe_dump({**secure, "output": {**base["output"], "name": "secagg"}}))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and "secagg" in p.name]
    summary = yaml.safe_load((run_dir / "summary.json").read_text())
    assert summary["aggregation"] == {"server": ["secagg"]}
    assert summary["final_accuracy"] == pytest.approx(plain.summary["final_accuracy"], abs=1 / 360)
    mine, theirs = final_params(run_dir), final_params(plain.run_dir)
    for name, value in theirs.items():
        torch.testing.assert_close(mine[name], value, rtol=0, atol=1e-5)
    assert any(not torch.equal(mine[name], value) for name, value in theirs.items())  # fixed point
    ledger = np.genfromtxt(run_dir / "ledger.csv", delimiter=",", dtype=None, names=True, encoding=None)
    d = sum(v.numel() for v in theirs.values())
    want = secagg_traffic(4, d, 32, 3, 3, 0)
    for kind, bits in want.items():
        assert int(ledger["bits"][ledger["kind"] == kind].sum()) == 2 * bits
    # the upload counted once, as the masked vectors: no plain model_up, and every uploaded bit the protocol's
    up = ledger["direction"] == "up"
    assert "model_up" not in set(ledger["kind"].tolist())
    sent_up = 4 * (
        2 * protocol.KEY_BITS + 3 * protocol.CIPHER_BITS + 4 * (protocol.SHARE_BITS + protocol.ID_BITS)
    )
    assert int(ledger["bits"][up].sum()) == summary["bits_up"] == 2 * (want["secagg_masked"] + sent_up)
    assert summary["sim_seconds"] > plain.summary["sim_seconds"]  # the protocol's airtime and compute
    plain_kinds = np.genfromtxt(
        plain.run_dir / "ledger.csv", delimiter=",", dtype=None, names=True, encoding=None
    )
    assert not any(str(kind).startswith("secagg") for kind in plain_kinds["kind"])


def test_fedge_deploy_refuses_a_simulated_dropout_in_one_line(tmp_path):
    """A deployment runs the stage on Flower's SecAgg+ (tests/deploy/test_secagg_deployed.py), whose
    dropouts are the nodes that fail: a simulated one is refused before any process starts."""
    pytest.importorskip("flwr")
    path = tmp_path / "secagg.yaml"
    path.write_text("rounds: 1\naggregation: {stages: [{name: secagg, options: {dropout: 0.25}}]}\n")
    refused = CliRunner().invoke(app, ["deploy", str(path)])
    assert refused.exit_code == 2, refused.output
    line = refused.output.strip()
    assert (
        line.startswith("error: aggregation.stages.0.options.dropout: 0.25 cannot be deployed")
        and "\n" not in line
    )


SYNTHETIC = {
    "seed": 3,
    "rounds": 2,
    "data": {"name": "synthetic", "num_train": 240, "num_test": 80, "shape": [1, 6, 6], "num_classes": 4},
    "partition": {"kind": "iid", "num_clients": 6},
    "model": {"name": "mlp", "options": {"hidden": [16]}},
    "engine": {"threads": 1},
}
HIST = {"name": "hist", "cells": 2, "split": "partition", "edge_rounds": 2, "local_steps": 2, "batch_size": 8}


@pytest.mark.parametrize(
    "algorithm, site", [(HIST, "edge"), ({"name": "fedbuff", "batch_size": 16}, "buffer")]
)
def test_hist_edges_and_a_fedbuff_buffer_aggregate_securely(tmp_path, algorithm, site):
    def run(stages: list, name: str) -> fedge.Result:
        output = {"dir": str(tmp_path), "name": name, "plots": False}
        return fedge.run(
            {**SYNTHETIC, "algorithm": algorithm, "aggregation": {"stages": stages}, "output": output}
        )

    plain, secure = run([], "plain"), run([{"name": "secagg", "at": [site]}], "secagg")
    assert secure.summary["aggregation"][site] == ["secagg"]
    mine, theirs = final_params(secure.run_dir), final_params(plain.run_dir)
    for name, value in theirs.items():
        torch.testing.assert_close(mine[name], value, rtol=0, atol=1e-5)
    assert secure.summary["bits_up"] > plain.summary["bits_up"]
    assert secure.summary["sim_joules"] > plain.summary["sim_joules"]
    kinds = {row.split(",")[3] for row in (secure.run_dir / "ledger.csv").read_text().splitlines()[1:]}
    assert "model_up" not in kinds and "secagg_masked" in kinds  # the clients' upload counted once
    if site == "buffer":  # the event queue keeps the time; the compute's joules are charged
        assert secure.summary["sim_seconds"] == plain.summary["sim_seconds"]
    else:
        assert secure.summary["sim_seconds"] > plain.summary["sim_seconds"]


GLOO_WORKER = """
import json, sys, torch
torch.set_num_threads(1)
import fedge
fedge.run(json.loads(sys.argv[1]))
"""


@pytest.mark.ci
def test_secagg_on_two_gloo_ranks_equals_one_process(tmp_path):
    cfg = {**SYNTHETIC, "algorithm": {"name": "fedavg", "batch_size": 16}}
    cfg["aggregation"] = {"stages": [{"name": "secagg", "options": {"dropout": [2]}}]}
    one = fedge.run({**cfg, "output": {"dir": str(tmp_path / "one"), "plots": False}})
    worker = tmp_path / "worker.py"
    worker.write_text(GLOO_WORKER)
    two = {**cfg, "output": {"dir": str(tmp_path / "ranks"), "plots": False}}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*command, str(worker), json.dumps(two)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ranked = next((tmp_path / "ranks").iterdir())
    mine, theirs = final_params(one.run_dir), final_params(ranked)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert (ranked / "ledger.csv").read_text() == (one.run_dir / "ledger.csv").read_text()
