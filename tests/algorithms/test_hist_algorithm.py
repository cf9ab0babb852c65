"""HIST and HFedAvg end to end: ledger and latency in the metrics, forms and executors agree, resume,
AirComp noise, every model of the zoo."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from cases import small_hist
from tiers import parametrize_first_by_default

import fedge
from fedge.aggregation import BlockMean, Updates, sites
from fedge.algorithms.hierarchical.aggregation import over_the_air
from fedge.algorithms.hierarchical.cost import client_upload_values
from fedge.config import parse_config
from fedge.errors import ConfigError
from fedge.runner.loop import build_run
from fedge.system.partition_opt import round_latency

BITS_PER_MB = 8 * 2**20


@pytest.fixture
def hist_config(tmp_path) -> dict:
    return small_hist(tmp_path, 3, optimizer={"lr": 0.1})


def built(raw: dict, **algorithm):
    raw = copy.deepcopy(raw)
    raw["algorithm"].update(algorithm)
    return build_run(parse_config(raw)).algorithm


def run_rounds(algorithm, rounds: int) -> list[dict]:
    return [algorithm.run_round(t) for t in range(1, rounds + 1)]


def test_metrics_ledger_and_clock(hist_config):
    result = fedge.run(hist_config)
    rows, ledger = result.metrics, (result.run_dir / "ledger.csv").read_text().splitlines()
    assert [r["mask_sizes"] for r in rows] == [[8, 8]] * 3
    assert np.cumsum([r["latency_s"] for r in rows]) == pytest.approx([r["sim_seconds"] for r in rows])
    d_cell = 8 * (36 + 1 + 4) + 4  # 8 hidden neurons (row, bias, column) + the shared output bias
    per_client = 32 * client_upload_values(3, 2, shared=4, partitioned=16 * 41, cells=2)  # the analytic cost
    assert per_client == 3 * 2 * 32 * d_cell
    assert rows[-1]["client_up_mb"] == pytest.approx(per_client / BITS_PER_MB)
    ups = [line.split(",") for line in ledger if ",model_up," in line]
    assert len(ups) == 3 * 2 * 8 and {int(u[-1]) for u in ups} == {32 * d_cell}
    kinds = {line.split(",")[3] for line in ledger[1:]}
    assert kinds == {"submodel_down", "model_down", "model_up", "submodel_up"}
    assert (
        rows[-1]["bits_by_kind"]["submodel_up"] == 3 * 2 * 32 * d_cell
    )  # cloud traffic = one model per round


def test_hfedavg_uploads_the_whole_model_and_hist_with_one_cell_is_hfedavg(hist_config):
    hist_config["algorithm"].update(name="hfedavg")
    rows = fedge.run(hist_config).metrics
    assert rows[-1]["client_up_mb"] == pytest.approx(3 * 2 * 32 * (16 * 41 + 4) / BITS_PER_MB)
    hist_config["engine"] = {"executor": "sequential"}  # the reference executor: bit-exact
    hist, avg = built(hist_config, name="hist", cells=1), built(hist_config, name="hfedavg", cells=1)
    run_rounds(hist, 2), run_rounds(avg, 2)
    assert all(torch.equal(hist.params[k], avg.params[k]) for k in avg.params)


@parametrize_first_by_default("aggregation", ["oma", "aircomp"])
def test_compact_and_masked_forms_give_the_same_model(hist_config, aggregation):
    kwargs = dict(cells=3, mask_sizes="optimised", aggregation=aggregation)
    compact, masked = (
        built(hist_config, form="compact", **kwargs),
        built(hist_config, form="masked", **kwargs),
    )
    a, b = run_rounds(compact, 2), run_rounds(masked, 2)
    assert a[-1]["mask_sizes"] == b[-1]["mask_sizes"] and len(set(a[-1]["mask_sizes"])) > 1
    for k in compact.params:
        torch.testing.assert_close(compact.params[k], masked.params[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("aggregation", ["oma", "aircomp"])
def test_greedy_and_milp_solvers_give_equally_fast_sizes(hist_config, aggregation):
    greedy = built(hist_config, cells=4, mask_sizes="optimised", aggregation=aggregation)
    milp = built(hist_config, cells=4, mask_sizes="optimised", solver="milp", aggregation=aggregation)
    for t in (1, 2, 3):
        cpu = greedy.radio.cpu_hz(t)
        rates = greedy.radio.oma_rates(t) if aggregation == "oma" else None
        costs = greedy.cell_costs(cpu, rates)
        a, b = greedy.mask_sizes(t, cpu, rates), milp.mask_sizes(t, cpu, rates)
        assert a.sum() == b.sum() == 16 and max(a.max(), b.max()) <= 6  # cap floor(1.5 x 16 / 4)
        fast = [round_latency(costs, s, greedy.shared_values, greedy.values_per_unit) for s in (a, b)]
        assert fast[0] == pytest.approx(fast[1], rel=1e-9)
        uniform = round_latency(costs, np.full(4, 4), greedy.shared_values, greedy.values_per_unit)
        assert fast[0] < uniform


def test_executors_agree(hist_config):
    hist_config["engine"] = {"executor": "sequential"}
    sequential = built(hist_config, mask_sizes="optimised", cells=3)
    hist_config["engine"] = {"executor": "batched"}
    batched = built(hist_config, mask_sizes="optimised", cells=3)
    run_rounds(sequential, 2), run_rounds(batched, 2)
    for k in batched.params:
        torch.testing.assert_close(sequential.params[k], batched.params[k], rtol=1e-5, atol=1e-6)


def test_state_dict_resumes_to_the_same_round(hist_config):
    straight = built(hist_config)
    run_rounds(straight, 3)
    first = built(hist_config)
    run_rounds(first, 2)
    resumed = built(hist_config)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    resumed.run_round(3)
    assert all(torch.equal(resumed.params[k], straight.params[k]) for k in straight.params)
    assert np.array_equal(resumed.client_up_bits, straight.client_up_bits)


def test_aircomp_noise_sits_on_the_cells_submodels_with_the_paper_variance(hist_config):
    algorithm = built(hist_config, aggregation="aircomp", form="masked", radio={"snr_db": [-10.0]})
    views = algorithm.views(1, algorithm.mask_sizes(1, algorithm.radio.cpu_hz(1), None))
    zeros = {k: torch.zeros_like(v) for k, v in views.gather(algorithm.params).items()}  # a row per cell
    air = over_the_air(
        BlockMean(), algorithm.cfg, algorithm.radio, algorithm.ctx, algorithm.params, 1, 0, views
    )
    eye = torch.eye(len(air.mses), dtype=torch.float64)  # each edge server's one row
    cells, mses = air.reduce(Updates.of(sites.EDGE, 1, zeros, eye)), air.mses
    support = views.gather({k: torch.ones_like(v) for k, v in algorithm.params.items()})  # held slots
    for j, mse in enumerate(mses):
        held = torch.cat([cells[k][j][support[k][j] > 0] for k in cells])
        foreign = torch.cat([cells[k][j][support[k][j] == 0] for k in cells])
        assert torch.all(foreign == 0) and len(held) == views.values(algorithm.params)[j]
        assert float(held.std()) == pytest.approx(0.1 * np.sqrt(mse), rel=0.1)
        assert 1.0 < mse < 30.0  # ~ 1 / (0.1 x min-gain) at -10 dB with 4 clients per cell


@pytest.mark.ci
def test_aircomp_at_high_snr_matches_oma_and_low_snr_does_not(hist_config):
    oma = built(hist_config)
    clean = built(hist_config, aggregation="aircomp", radio={"snr_db": [150.0]})
    noisy = built(hist_config, aggregation="aircomp", radio={"snr_db": [-20.0]})
    run_rounds(oma, 2), run_rounds(clean, 2)
    rows = run_rounds(noisy, 2)
    assert rows[-1]["aircomp_mse"] > 1.0
    for k in oma.params:
        torch.testing.assert_close(clean.params[k], oma.params[k], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(noisy.params["fc1.linear.weight"], oma.params["fc1.linear.weight"], atol=1e-3)


@parametrize_first_by_default(
    ("model", "shape", "options"),
    [
        ("fcnn", [1, 28, 28], {}),
        ("lenet5", [1, 28, 28], {}),
        ("cnn4", [1, 28, 28], {}),
        ("cse_femnist", [1, 28, 28], {}),
        ("cse_cifar", [3, 24, 24], {}),
    ],
)
def test_every_zoo_model_with_a_hidden_fc_layer_trains(hist_config, model, shape, options):
    hist_config["data"].update(shape=shape, num_train=64, num_test=16)
    hist_config["partition"]["num_clients"] = 4
    hist_config["model"] = {"name": model, "options": options}
    hist_config["algorithm"].update(edge_rounds=1, local_steps=1, batch_size=8, split="partition")
    algorithm = built(hist_config, aggregation="aircomp")
    before = {k: v.clone() for k, v in algorithm.params.items()}
    row = algorithm.run_round(1)
    assert all(algorithm.params[k].shape == before[k].shape for k in before)
    assert all(torch.isfinite(v).all() for v in algorithm.params.values())
    assert any(not torch.equal(algorithm.params[k], before[k]) for k in before)
    assert 0 <= algorithm.evaluate()["accuracy"] <= 1 and row["latency_s"] > 0


@pytest.mark.parametrize(
    ("model", "shape", "options"),
    [
        ("cnn2", [1, 28, 28], {}),
        ("resnet18", [3, 8, 8], {"width": 4}),
        ("vgg", [3, 32, 32], {"depth": 11, "width": 0.0625}),
        ("mlp", [1, 8, 8], {"hidden": []}),
    ],
)
def test_models_without_a_hidden_fc_layer_are_refused(hist_config, model, shape, options):
    """Nothing to partition would make HIST a mislabelled HFedAvg: a config error naming the model."""
    hist_config["data"].update(shape=shape, num_train=64, num_test=16)
    hist_config["partition"]["num_clients"] = 4
    hist_config["model"] = {"name": model, "options": options}
    hist_config["algorithm"].update(split="partition")
    with pytest.raises(ConfigError, match=f"^model: HIST .* {model} has none"):
        built(hist_config)


def test_bad_hierarchies_are_config_errors(hist_config):
    with pytest.raises(ConfigError, match="algorithm.cells"):
        built(hist_config, cells=9)
    with pytest.raises(ConfigError, match="algorithm.cells"):  # 5 cells, 4 hidden neurons
        built({**hist_config, "model": {"name": "mlp", "options": {"hidden": [4]}}}, cells=5)
    with pytest.raises(ConfigError, match="algorithm.shards_per_client"):
        built(hist_config, shards_per_client=100)
    with pytest.raises(ConfigError, match="algorithm.radio.cpu_ghz"):
        built(hist_config, radio={"cpu_ghz": [[3.0, 2.0]]})


@pytest.mark.parametrize("aggregation", ["oma", "aircomp"])
def test_energy_is_client_compute_plus_uplink_airtime(hist_config, aggregation):
    """HFedAvg (every cell holds the whole model): E edge rounds of kappa F^2 cycles plus transmit power
    times each client's airtime, computed here from the run's own radio draws and ledger."""
    algorithm = built(hist_config, name="hfedavg", aggregation=aggregation)
    algorithm.run_round(1)
    cfg, system = algorithm.cfg, algorithm.ctx.config.system
    cpu = algorithm.radio.cpu_hz(1)
    cycles = cfg.local_steps * cfg.radio.cycles_per_step
    compute = system.kappa * cpu**2 * cycles
    values = algorithm.model_values
    if aggregation == "oma":
        ledger = algorithm.ctx.ledger.entries()
        kind = algorithm.ctx.ledger.kinds().index("model_up")
        per_client_bits = ledger["bits"][ledger["kind"] == kind][: len(cpu)]
        airtime = per_client_bits / algorithm.radio.oma_rates(1)
    else:
        radio = cfg.radio
        airtime = np.full(len(cpu), values / (radio.bandwidth_hz / radio.subcarrier_hz) * radio.symbol_s)
    power = 10 ** ((system.client_power_dbm - 30) / 10)
    expected = cfg.edge_rounds * float(compute.sum() + power * airtime.sum())
    assert algorithm.ctx.system.clock.joules == pytest.approx(expected, rel=1e-9)
    assert expected > 0


def test_aircomp_refuses_an_edge_reducer_the_air_cannot_sum(hist_config):
    from fedge.aggregation import STAGES, Reducer

    class Largest(Reducer):  # not additive: no superposition of signals computes it
        def reduce(self, updates: Updates) -> dict[str, torch.Tensor]:
            return {k: v.max(dim=0).values for k, v in updates.joined().rows.items()}

    STAGES.setdefault("largest", Largest)
    hist_config["aggregation"] = {"stages": [{"name": "largest", "at": ["edge"]}]}
    with pytest.raises(ConfigError, match="^aggregation.stages: AirComp sums over the air"):
        built(hist_config, aggregation="aircomp")
    built(hist_config)  # OMA's edge servers receive every model and may reduce them any way
