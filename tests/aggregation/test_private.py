"""Client-level DP's aggregation stages on small stacked updates: the clip against a hand computation,
the Gaussian aggregate's noise (central and distributed) against its std z C / n, the releases it
records, Poisson's divisor, adaptive clipping's bound, and the sites it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from fedge.aggregation import Updates, build_pipeline, sites
from fedge.aggregation.private import Clip, Gaussian, GaussianShare
from fedge.aggregation.stage import StageRun
from fedge.config import AggregationConfig, PrivacyConfig
from fedge.errors import ConfigError
from fedge.privacy.run import Participation, RunPrivacy


def run_privacy(clients: int, participation: Participation | None = None) -> RunPrivacy:
    privacy = RunPrivacy(PrivacyConfig(), clients, seed=5)
    privacy.participation = participation or Participation("none", clients)
    return privacy


def bound(stage, privacy: RunPrivacy, site: str = sites.SERVER):
    stage.bind(StageRun(site, 5, privacy, key="aggregation.stages.0"))
    return stage


def server_updates(rows: torch.Tensor, reference: torch.Tensor, round_: int = 1) -> Updates:
    n = len(rows)
    weights = torch.full((n,), 1.0 / n, dtype=torch.float64)
    return Updates.of(sites.SERVER, round_, {"w": rows}, weights, {"w": reference}, tuple(range(n)))


def test_clip_scales_only_the_rows_whose_change_exceeds_the_bound_over_all_tensors_together():
    reference = {"w": torch.tensor([1.0, 1.0]), "b": torch.tensor([1.0])}
    rows = {"w": torch.tensor([[4.0, 1.0], [1.3, 1.0]]), "b": torch.tensor([[5.0], [1.4]])}
    weights = torch.tensor([0.8, 0.2], dtype=torch.float64)
    updates = Updates.of(sites.SERVER, 1, rows, weights, reference, (0, 1))
    out = Clip(clip=1.0, weights="uniform").apply(updates)
    part = out.parts[0]
    # row 0 moved by (3, 0, 4): norm 5, scaled to (0.6, 0, 0.8); row 1 moved by norm 0.5: kept exactly
    assert torch.allclose(part.rows["w"][0], torch.tensor([1.6, 1.0]))
    assert torch.allclose(part.rows["b"][0], torch.tensor([1.8]))
    assert torch.equal(part.rows["w"][1], rows["w"][1]) and torch.equal(part.rows["b"][1], rows["b"][1])
    assert part.weights.tolist() == [0.5, 0.5] and out.clip == 1.0
    kept = Clip(clip=1.0).apply(updates).parts[0].weights
    assert kept.tolist() == [0.8, 0.2]


@pytest.mark.parametrize("mode", ["central", "distributed"])
def test_the_aggregates_noise_has_std_z_c_over_n_per_coordinate(mode):
    n, dims, z, clip = 8, 40_000, 2.0, 0.5
    privacy = run_privacy(n)
    stages = [Clip(clip=clip), bound(Gaussian(noise_multiplier=z, mode=mode), privacy)]
    updates = server_updates(torch.zeros(n, dims), torch.zeros(dims))
    out = stages[1].reduce(stages[0].apply(updates))["w"]
    assert float(out.std()) == pytest.approx(z * clip / n, rel=0.03)
    assert abs(float(out.mean())) < 4 * z * clip / n / math.sqrt(dims)


def test_distributed_shares_are_keyed_by_sender_and_the_share_stage_gives_the_reducers_numbers():
    n, dims = 5, 64
    rows = torch.randn(n, dims, generator=torch.Generator().manual_seed(0))
    reference = torch.zeros(dims)
    privacy = run_privacy(n)
    alone = bound(Gaussian(noise_multiplier=1.0, mode="distributed"), privacy)
    direct = alone.reduce(Clip(clip=1.0).apply(server_updates(rows, reference)))["w"]
    share = bound(GaussianShare(noise_multiplier=1.0), privacy)
    summed = bound(Gaussian(mode="distributed"), privacy)
    staged = summed.reduce(share.apply(Clip(clip=1.0).apply(server_updates(rows, reference))))["w"]
    assert torch.allclose(direct, staged, atol=1e-6)
    order = [4, 2, 0, 3, 1]
    weights = torch.full((n,), 1.0 / n, dtype=torch.float64)
    shuffled = Updates.of(sites.SERVER, 1, {"w": rows[order]}, weights, {"w": reference}, tuple(order))
    again = bound(Gaussian(noise_multiplier=1.0, mode="distributed"), privacy)
    assert torch.allclose(again.reduce(Clip(clip=1.0).apply(shuffled))["w"], direct, atol=1e-6)


def test_each_aggregation_records_one_client_level_release_at_the_rounds_sampling():
    privacy = run_privacy(10, Participation("without_replacement", 10, sample_size=4))
    gaussian = bound(Gaussian(noise_multiplier=1.5), privacy)
    gaussian.reduce(Clip(clip=2.0).apply(server_updates(torch.ones(4, 3), torch.zeros(3), round_=3)))
    (release,) = privacy.ledger.releases
    assert (release.round, release.kind, release.unit, release.noise_multiplier) == (
        3,
        "update",
        "client",
        1.5,
    )
    assert (release.sampling, release.sample_size, release.population) == ("without_replacement", 4, 10)
    assert release.clip == 2.0 and release.clients is None


def test_poisson_divides_the_sum_by_the_expected_cohort_and_records_the_probability():
    privacy = run_privacy(20, Participation("poisson", 20, probability=0.25))
    gaussian = bound(Gaussian(noise_multiplier=0.0), privacy)
    reference = torch.full((3,), 2.0)
    out = gaussian.reduce(Clip(clip=10.0).apply(server_updates(reference + torch.ones(3, 3), reference)))
    assert torch.allclose(out["w"], reference + 3 / (0.25 * 20))  # three rows moved by 1: sum 3 over qN = 5
    (release,) = privacy.ledger.releases
    assert release.sampling == "poisson" and release.probability == 0.25


def test_at_an_edge_each_cell_gets_its_own_mean_noise_and_release_for_its_members():
    privacy = run_privacy(4)
    gaussian = bound(Gaussian(noise_multiplier=1.0), privacy, sites.EDGE)
    clip = bound(Clip(clip=100.0), privacy, sites.EDGE)
    weights = torch.tensor([[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]], dtype=torch.float64)
    rows = torch.tensor([[1.0], [3.0], [10.0], [20.0]])
    reference = torch.tensor([[0.0], [10.0]])
    updates = Updates.of(sites.EDGE, 1, {"w": rows}, weights, {"w": reference}, (0, 1, 2, 3))
    out = gaussian.reduce(clip.apply(updates))["w"]
    noise = [privacy.gaussian(torch.empty(1), 100.0, "update", 1, "edge", 0, j) for j in range(2)]
    assert torch.allclose(out[0], torch.tensor([2.0]) + noise[0] / 2)
    assert torch.allclose(out[1], torch.tensor([15.0]) + noise[1] / 2)
    assert [(r.kind, r.clients) for r in privacy.ledger.releases] == [("edge", (0, 1)), ("edge", (2, 3))]


def test_adaptive_clipping_moves_the_bound_to_the_target_quantile_and_keeps_it_in_its_state():
    n = 100
    norms = torch.linspace(0.01, 1.0, n)
    rows = torch.stack([norms, torch.zeros(n)], dim=1)  # row r's change has norm norms[r]
    privacy = run_privacy(n)
    clip = bound(Clip(clip=0.05, adaptive=True, target_quantile=0.3, count_noise_multiplier=0.5), privacy)
    for t in range(1, 150):
        clip.apply(server_updates(rows, torch.zeros(2), round_=t))
    assert clip.bound == pytest.approx(float(torch.quantile(norms, 0.3)), abs=0.06)
    counts = [r for r in privacy.ledger.releases if r.kind == "clip_count"]
    assert len(counts) == 149 and counts[0].noise_multiplier == 0.5 and counts[0].clip == 1.0
    fresh = Clip(clip=0.05, adaptive=True)
    fresh.load_state_dict(clip.state_dict())
    assert fresh.bound == clip.bound


def test_the_noise_stages_are_refused_where_no_release_can_be_accounted_naming_the_key():
    config = AggregationConfig.model_validate({"stages": ["clip", "gaussian"]})
    privacy = run_privacy(4)
    for site in (sites.PEER, sites.CLOUD, sites.BUFFER):
        with pytest.raises(ConfigError, match=r"aggregation\.stages\.1"):
            build_pipeline(config, site, StageRun(site, 0, privacy))
    build_pipeline(config, sites.PEER)  # a config check outside a run builds every site: nothing to refuse
    alone = bound(Gaussian(noise_multiplier=1.0), privacy)
    with pytest.raises(ConfigError, match="clip stage"):
        alone.reduce(server_updates(torch.ones(2, 2), torch.zeros(2)))
    with pytest.raises(ConfigError, match=r"aggregation\.stages\.0\.options\.noise_multiplier"):
        bound(Gaussian(), privacy).reduce(Clip().apply(server_updates(torch.ones(2, 2), torch.zeros(2))))
