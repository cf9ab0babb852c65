"""Giving a run another length (``rounds``) after it started, above all continuing a finished run.

A run that ended at its last round can go on to more rounds (``fedge resume RUN --rounds 60``,
``fedge.resume(run, rounds=60)``, or its sweep rerun with a larger ``rounds``) when no round of its
algorithm reads the run's total (:meth:`~fedge.algorithms.Algorithm.reads_run_length`). Then rounds
1..t are the same whatever the length, and the continued run ends with the metrics, ledger and clock of
a run started with the new length. Two records may differ: the old last round keeps the evaluation it
had as a last round (an extra evaluated row when ``eval.every`` does not divide it; a ``stop`` target
met there stops the run there), and ``wall_seconds``. A run that met a ``stop`` rule stays stopped.

An algorithm with a schedule over the run is refused, as its earlier rounds would have been different:
light FedSL's pruning without ``schedule_rounds`` (Eq. 10's T is the run's length), PENS without
``selection_rounds`` (its selection phase is 10 % of the run), DisPFL (its cosine annealing), and an
extension's algorithm that does not opt in.

A checkpoint keeps the length it was written under (its header's ``rounds``). The run directory takes
the new length in an order that a kill at any moment leaves resumable: the checkpoint is rewritten when
it is an older fedge's (whose config digest covers ``rounds``), the finished run's ``summary.json``,
``ledger.csv`` and ``energy.csv`` go (it is an unfinished run again; the last two are written at the
end), and only then ``config.yaml`` takes the new ``rounds``.
"""

from __future__ import annotations

from pathlib import Path

from fedge.algorithms import Algorithm
from fedge.config import RunConfig
from fedge.errors import FedgeError
from fedge.files import results
from fedge.runner import checkpoint
from fedge.runner.checkpoint import Checkpoint


def check(
    saved: Checkpoint, written: RunConfig, config: RunConfig, algorithm: Algorithm, run_dir: Path
) -> None:
    """Refuse to continue ``saved`` (a checkpoint of the run whose ``config.yaml`` is ``written``) under
    ``config``'s length when the run has done more rounds, or when its algorithm reads the length."""
    before, done = saved.written_rounds(written), saved.header["round"]
    if config.rounds == before:
        return  # the run's own length: fedge.runner.restore checks the checkpoint's round against it
    if config.rounds < done:
        raise FedgeError(
            f"{run_dir}: rounds={config.rounds} is fewer than the {done} rounds this run has done"
        )
    if (why := algorithm.reads_run_length()) is not None:
        raise FedgeError(
            f"{run_dir}: a {before}-round run cannot go on as a {config.rounds}-round run ({why}); "
            f"start a {config.rounds}-round run instead"
        )


def changed(saved: Checkpoint | None, written: RunConfig, config: RunConfig) -> bool:
    """Whether the run directory must take ``config``'s length (its config or checkpoint has another)."""
    return config.rounds != written.rounds or (
        saved is not None and config.rounds != saved.written_rounds(written)
    )


def relengthen(run_dir: Path, saved: Checkpoint | None, written: RunConfig, config: RunConfig) -> None:
    """Write ``config``'s length into ``run_dir`` (see the module for the order and why)."""
    if saved is not None and "rounds" not in saved.header:
        checkpoint.save(run_dir / results.CHECKPOINT, saved.state, written, saved.header["round"])
    for name in (results.SUMMARY, results.LEDGER, results.ENERGY):
        (run_dir / name).unlink(missing_ok=True)
    results.write_text(run_dir / results.CONFIG, config.to_yaml())
