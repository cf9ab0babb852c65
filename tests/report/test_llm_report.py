"""``fedge report`` of language-model runs: held-out loss and perplexity curves from round 0 (the model
before training, built again from the run's config), so the drop in perplexity shows."""

from __future__ import annotations

import shutil

import pytest
from llm_cases import lm_config, write_corpus

import fedge
from fedge.report.lm import initial_point, mean_curve, run_curve
from fedge.report.page import find_runs, group_cells, write_report
from fedge.runner.loop import build_run

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two seeds of a 2-round FedAvg run on a tiny GPT-2 trained in full (perplexity falls)."""
    tmp = tmp_path_factory.mktemp("lm-report")
    corpus = write_corpus(tmp / "corpus")
    out = []
    for seed in (3, 4):
        raw = lm_config(corpus, {"name": "fedavg", "optimizer": {"lr": 0.05}}, rounds=2, seed=seed,
                        output={"dir": str(tmp / "runs"), "name": f"s{seed}"})  # fmt: skip
        raw["model"]["options"]["lora_rank"] = 0
        out.append((raw, fedge.run(raw)))
    return tmp, out


def test_round_zero_is_the_untrained_models_evaluation(runs):
    _, done = runs
    raw, result = done[0]
    before = build_run(fedge.resolve_config(raw)).algorithm.evaluate()
    point = initial_point(result.run_dir)
    assert point == {
        "round": 0,
        "mb_total": 0.0,
        "loss": before.loss,
        "perplexity": before.extra["perplexity"],
    }
    curve = run_curve(find_runs([result.run_dir])[0], point)
    assert [p["round"] for p in curve] == [0, 1, 2]
    assert curve[-1]["perplexity"] < curve[0]["perplexity"]  # it learned: the drop the curve shows


@pytest.mark.ci
def test_the_report_plots_loss_and_perplexity_from_round_zero(runs):
    tmp, done = runs
    page = write_report(tmp / "runs").read_text()
    assert "<h2>Held-out loss and perplexity</h2>" in page and "loss and perplexity curves" in page
    cell = group_cells(find_runs([tmp / "runs"]))[0]
    assert len(cell.runs) == 2
    starts = [initial_point(run.path)["perplexity"] for run in cell.runs]
    assert f"{sum(starts) / 2:.2f}" in page  # the mean perplexity at round 0
    finals = [result.metrics[-1]["perplexity"] for _, result in done]
    assert f"{sum(finals) / 2:.2f}" in page
    assert "No round-0 point" not in page


def test_a_run_that_cannot_be_built_again_has_no_round_zero_and_says_so(runs, tmp_path):
    tmp, done = runs
    copy = tmp_path / "runs"
    shutil.copytree(done[0][1].run_dir, copy / "s3")
    shutil.move(tmp / "corpus", tmp_path / "moved")  # the run's text folder is gone
    try:
        assert initial_point(copy / "s3") is None
        page = write_report(copy).read_text()
    finally:
        shutil.move(tmp_path / "moved", tmp / "corpus")
    assert "<h2>Held-out loss and perplexity</h2>" in page and "No round-0 point" in page


def test_mean_curve_takes_the_rounds_every_seed_reached():
    a = [{"round": 0, "loss": 2.0, "perplexity": 7.0}, {"round": 1, "loss": 1.0, "perplexity": 3.0}]
    b = [{"round": 0, "loss": 4.0, "perplexity": 9.0}]
    mean = mean_curve([a, b])
    assert len(mean) == 1 and mean[0]["loss"] == 3.0 and mean[0]["perplexity_std"] == pytest.approx(2**0.5)
