"""The command line: the quickstart, list, plot, and one-line exit-2 errors that leave no directory."""

from __future__ import annotations

import pytest
from tiers import parametrize_first_by_default
from typer.testing import CliRunner

from fedge.cli.commands import app

runner = CliRunner()


@pytest.mark.ci
def test_quickstart_prints_summary_and_writes_results(tmp_path):
    out = tmp_path / "runs"
    result = runner.invoke(app, ["run", f"output.dir={out}", "rounds=3"])
    assert result.exit_code == 0, result.output
    assert "final accuracy" in result.output and "MB up" in result.output
    assert "model_up (up)" in result.output and "model_down (down)" in result.output
    run_dir = out / "fedavg-digits"
    assert (run_dir / "summary.json").is_file() and (run_dir / "plots" / "accuracy_vs_round.png").is_file()
    plotted = runner.invoke(app, ["plot", str(run_dir), str(run_dir), "--out", str(tmp_path / "cmp")])
    assert plotted.exit_code == 0 and (tmp_path / "cmp" / "accuracy_vs_mb.png").is_file()


def test_list_names_every_component():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    for name in ("fedavg", "centralized", "digits", "femnist", "dirichlet", "cse_cifar", "vgg"):
        assert name in result.output


@parametrize_first_by_default(
    ("args", "needle"),
    [
        (["partition.alpha=0"], "partition.alpha"),
        (["partition.alpha=-1"], "partition.alpha"),
        (["algorithm.fraction=1.5"], "algorithm.fraction"),
        (["partition.num_clients=5000"], "partition.num_clients"),
        (["model.cut=9"], "model.cut"),
        (["colour=blue"], "colour"),
        (["data.name=mnist", "data.root=/nonexistent/mnist"], "/nonexistent/mnist"),
        (["missing.yaml"], "missing.yaml"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_directory(tmp_path, args, needle):
    out = tmp_path / "runs"
    result = runner.invoke(app, ["run", *args, f"output.dir={out}"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output
    assert not out.exists() or not any(out.iterdir())


def test_resume_of_a_non_run_directory_fails_cleanly(tmp_path):
    result = runner.invoke(app, ["resume", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["frobnicate"], "fedge: no such command 'frobnicate' (fedge --help lists them)"),
        (["run", "--bogus"], "fedge run: no such option '--bogus' (fedge run --help lists them)"),
        (["resume"], "fedge resume: missing argument 'RUN_DIR' (fedge resume --help)"),
        (["run", "--procs", "0"], "fedge run: invalid value for '--procs': 0 is not in the range x>=1"),
        ([], "fedge: missing command (fedge --help lists them)"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args, line):
    """An unknown command or option, or a missing argument: one line naming it, no usage box."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [text for text in result.output.splitlines() if text.strip()]
    assert len(lines) == 1 and lines[0].startswith(line), result.output


SWITCHED = ["example:quickstart", "algorithm.name=cse_fsl", "model.cut=1"]


def test_switching_an_examples_algorithm_drops_its_old_algorithms_keys_with_a_note(tmp_path):
    """The example's ``algorithm.fraction`` belongs to FedAvg; CSE-FSL has none: dropped, one note."""
    result = runner.invoke(app, ["run", *SWITCHED, "rounds=1", "-q", f"output.dir={tmp_path}"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "algorithm.fraction" in notes[0] and "cse_fsl" in notes[0], result.output
    assert (tmp_path / "cse_fsl-digits" / "summary.json").is_file()


def test_a_key_typed_for_the_new_algorithm_that_it_lacks_stays_an_error(tmp_path):
    result = runner.invoke(app, ["run", *SWITCHED, "algorithm.fraction=0.5", f"output.dir={tmp_path}"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: algorithm.fraction: unknown key"), result.output


def test_a_config_file_that_names_its_algorithm_keeps_its_keys_checked(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  name: cse_fsl\n  fraction: 1.0\nmodel:\n  cut: 1\n")
    result = runner.invoke(app, ["run", str(path), f"output.dir={tmp_path}"])
    assert result.exit_code == 2 and "algorithm.fraction: unknown key" in result.output, result.output


def test_the_python_api_switches_an_algorithm_by_the_same_rule():
    import fedge
    from fedge.intake.locate import DroppedKeys

    with pytest.warns(DroppedKeys, match="algorithm.fraction"):
        config = fedge.resolve_config(SWITCHED[0], SWITCHED[1:])
    assert config.algorithm.name == "cse_fsl"


def test_deploy_refuses_bad_input_in_one_line(tmp_path):
    pytest.importorskip("flwr")
    result = runner.invoke(app, ["deploy", *SWITCHED, "algorithm.fraction=0.5", f"output.dir={tmp_path}"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: algorithm.fraction: unknown key"), result.output
