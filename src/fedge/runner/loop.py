"""The round loop, written once for every algorithm: evaluation, checkpoints, resume and results.

``build_run`` turns a config into a ready algorithm (loading data, partitioning, building the model)
and raises :class:`~fedge.errors.FedgeError` on bad input *before* any directory exists, including a
run the machine's memory cannot hold (:mod:`fedge.runner.preflight`). ``Runner`` then drives the rounds,
evaluates every ``eval.every`` rounds and after the last, checkpoints atomically
(:mod:`fedge.runner.checkpoint`), stops on a NaN or infinite number (:mod:`fedge.runner.stop`) and writes
the results directory. ``resume``
continues an interrupted run from its verified last checkpoint to the identical result: every random
draw is derived from ``(seed, purpose, round, client)``, so nothing but the algorithm state and the
ledger needs to be carried over.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedge.algorithms import ALGORITHMS, Algorithm, Context
from fedge.algorithms.base import executor_name
from fedge.comm import Ledger, Network
from fedge.config import CUSTOM_DATA, RunConfig
from fedge.data.dataset import Dataset
from fedge.data.federated import FederatedData
from fedge.data.partition import partition_labels, partition_test, partition_train
from fedge.data.sources import load_dataset
from fedge.data.user import UserData, user_dataset
from fedge.distributed import Cohorts, Group, current_group, launched_rank
from fedge.engine import Criterion, NoiseStreams, cross_entropy, has_random_layers, make_executor
from fedge.engine.host import configure_host
from fedge.errors import CheckpointError, ConfigError, DataError, Diverged, FedgeError
from fedge.extend import load_config
from fedge.files import results
from fedge.metrics import Evaluation, RoundReport
from fedge.models import SplitModel, block_cut, build_model, output_shape, user_factory
from fedge.models.transformer import LANGUAGE_MODELS, TransformerLM
from fedge.rng import global_stream, numpy_rng
from fedge.runner import (
    checkpoint,
    divergence,
    inputs,
    preflight,
    privacy,
    records,
    restore,
    run_length,
    stop,
    transfers,
)
from fedge.runner.environment import cuda_missing, write_environment
from fedge.runner.plots import plot_run
from fedge.system import SystemModel
from fedge.tracking import Tracking

MIB = 8 * 2**20  # bits in one MB as the papers' tables count it (2^20 bytes)
WALL_FIELDS = ("wall_seconds",)

TOP_NODES = 10  # nodes by simulated energy in summary.json (all of them in energy.csv)
BREAKDOWN = ("sim_seconds_by_phase", "sim_joules_by_phase", "sim_joules_by_tier")


@dataclass
class Result:
    """A finished (or resumed-to-the-end) run: its directory, config, metric rows and summary."""

    run_dir: Path
    config: RunConfig
    metrics: list[dict[str, Any]]
    summary: dict[str, Any]


@dataclass
class Built:
    """Everything a run needs, built and validated."""

    config: RunConfig
    context: Context
    algorithm: Algorithm

    def round(self, t: int) -> RoundReport:
        """Global round ``t``, its random streams opened first (so any caller gets the runner's numbers)."""
        self.context.start("train", t)
        return self.algorithm.run_round(t)

    def evaluate(self, t: int) -> Evaluation:
        """The evaluation after round ``t``, its random streams opened first."""
        self.context.start("evaluate", t)
        return self.algorithm.evaluate()


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError("engine.device", f"unknown device {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError("engine.device", f"{name!r} is not supported; use cpu or cuda[:index]")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("engine.device", cuda_missing())
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError("engine.device", f"there is no {name} (CUDA devices: {torch.cuda.device_count()})")
    return device


def model_factory(
    config: RunConfig, input_shape: tuple[int, ...], num_classes: int, pad_id: int | None = None
) -> Callable[[], SplitModel]:
    """A builder of the configured model whose initial weights depend only on the run seed. A language
    model reading right-padded data (the data's ``pad_id``) is told that id, unless its options name one."""
    spec = config.model
    options = dict(spec.options)
    if pad_id is not None and spec.name in LANGUAGE_MODELS:
        options.setdefault("pad_id", pad_id)

    def build() -> SplitModel:
        with global_stream(config.seed, "model-init"):
            return build_model(spec.name, input_shape, num_classes, **options)

    return build


@dataclass(frozen=True)
class Extensions:
    """What a Python caller brings beside the config: a model, data and a loss (``fedge.run``'s
    ``model``, ``train``/``test`` and ``loss``); ``None`` keeps the config's own."""

    model: nn.Module | None = None
    train: UserData | None = None
    test: UserData | None = None
    loss: Criterion | None = None


def _criterion(config: RunConfig, loss: Criterion | None) -> Criterion:
    """The per-sample training loss: the caller's, or ``train.loss`` with its label smoothing."""
    if loss is not None:
        if not ALGORITHMS[config.algorithm.name].takes_loss:
            raise ConfigError(
                "train.loss", f"{config.algorithm.name} trains with its own cross-entropy terms"
            )
        return loss
    smoothing = config.train.label_smoothing
    if not smoothing:
        return cross_entropy
    if not ALGORITHMS[config.algorithm.name].takes_loss:
        raise ConfigError("train.label_smoothing", f"{config.algorithm.name} trains with plain cross-entropy")
    return functools.partial(cross_entropy, label_smoothing=smoothing)


# algorithms whose model contract takes a target per token (language models; docs/llm.md)
SEQUENCE_ALGORITHMS = (
    "fedavg",
    "centralized",
    "splitfed_v1",
    "splitfed_v2",
    "cse_fsl",
    "fsl_an",
    "fedsl",
    "light_fedsl",
)


def _check_outputs(model: nn.Module, dataset: Dataset) -> None:
    """The model must give one logit per class the labels name (a shape check on the meta device)."""
    shape = output_shape(model, dataset.input_shape)
    per_position = tuple(dataset.y_train.shape[1:])  # a language model: one target per token
    if tuple(shape[1:]) != per_position or shape[0] < dataset.num_classes:
        raise DataError(
            f"labels: they name {dataset.num_classes} classes (0..{dataset.num_classes - 1}) but the model "
            f"outputs shape {list(shape)} per sample; it needs {dataset.num_classes} logits"
        )


def _check_padding(model: nn.Module, dataset: Dataset) -> None:
    """Padded sequences need a model that masks the data's pad id (``SplitModel.pad_id``); packed text
    (every id a real token) needs a language model that masks none."""
    masked = getattr(model, "pad_id", None)
    if dataset.pad_id is None:
        if masked is not None and isinstance(model, TransformerLM) and not model.classifier:
            refused = f"packed text has no padding, and masking id {masked} would hide real tokens; unset it"
            raise ConfigError("model.options.pad_id", refused)
        return
    if masked is None:
        name = getattr(model, "name", type(model).__name__)
        refused = f"lines pads sequences and the model {name} reads no padding; use bert, gpt2 or llama"
        raise ConfigError("data.sequences", refused)
    if masked != dataset.pad_id:
        raise ConfigError(
            "data.tokenizer", f"it pads with token id {dataset.pad_id} but the model masks id {masked}"
        )


def _check_recording(config: RunConfig, recorded: frozenset[str], processes: int) -> None:
    """``output.record`` asks only for transfers the algorithm hands to the recorder, in one process."""
    asked = config.output.record
    if not asked:
        return
    missing = [kind for kind in asked if kind not in recorded]
    if missing:
        kept = ", ".join(sorted(recorded)) or "nothing"
        name = config.algorithm.name
        raise ConfigError(
            "output.record", f"{name} has no {', '.join(missing)} to record (it records {kept})"
        )
    if processes > 1:
        raise ConfigError("output.record", f"is kept by one process; this run has {processes}")


def build_run(config: RunConfig, force: bool = False, extensions: Extensions | None = None) -> Built:
    """Load data, partition it, check the model and build the algorithm; no file is written.

    A run whose estimated memory exceeds what is available is refused before the data or the model is
    allocated, unless ``force``. ``extensions`` replace the config's model, data or loss.
    """
    ext = extensions or Extensions()
    device = _device(config.engine.device)
    group = current_group(config.engine.dist_timeout, device.type == "cuda")
    if group.size > config.partition.num_clients:
        raise ConfigError(
            "partition.num_clients", f"fewer clients than the {group.size} processes of the run"
        )
    if group.distributed and device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())  # one GPU per local rank
    if config.engine.compile and config.engine.executor == "sequential":
        raise ConfigError("engine.compile", "only the batched executor compiles its step")
    if ext.train is None and config.data.name == CUSTOM_DATA:
        raise ConfigError("data.name", "custom data comes from fedge.run(..., train=...); pass train")
    criterion = _criterion(config, ext.loss)
    available = preflight.available_bytes(device)
    preflight.check(preflight.config_parts(config, ext.model), available, force)
    configure_host(config.engine.threads, config.engine.retain_memory and device.type == "cpu")
    if ext.train is not None:
        dataset = user_dataset(ext.train, ext.test, config.seed, config.data.test_fraction)
    else:
        dataset = load_dataset(config.data, config.seed)
    labels = partition_labels(dataset.y_train.numpy())
    client_train = partition_train(
        labels, config.partition, numpy_rng(config.seed, "partition"), dataset.train_groups
    )
    client_test = partition_test(
        partition_labels(dataset.y_test.numpy()),
        [labels[ix] for ix in client_train],
        dataset.num_classes,
        config.partition.test_size,
        numpy_rng(config.seed, "partition-test"),
    )
    if dataset.y_train.dim() > 1 and config.algorithm.name not in SEQUENCE_ALGORITHMS:
        known = ", ".join(SEQUENCE_ALGORITHMS)
        refused = f"{config.algorithm.name} does not train on token sequences; use {known}"
        raise ConfigError("algorithm.name", refused)
    data = FederatedData(dataset, client_train, client_test, config.seed, device)
    parts = preflight.state_parts(config, data, ext.model)
    preflight.check(parts, available, force)
    if ext.model is not None:
        factory = user_factory(ext.model)
    else:
        factory = model_factory(config, dataset.input_shape, dataset.num_classes, dataset.pad_id)
    template = factory()
    _check_padding(template, dataset)
    _check_outputs(template, dataset)
    executor = make_executor(
        executor_name(config, device.type), compile_step=config.engine.compile, fused=config.engine.fused
    )
    cut = 0 if config.model.cut is None else block_cut(template, config.model.cut)
    sample_bytes = preflight.sample_activation_bytes(template, dataset.input_shape, cut)
    executor.sample_bytes, executor.cut_sample_bytes = sample_bytes
    if available is not None:
        executor.activation_budget = available // 4
    together = executor.clients_at_once(data.num_clients, preflight.training_rows(config, data))
    activations = preflight.activation_parts(config, data, executor.sample_bytes, together)
    preflight.check(parts + activations, available, force)
    algorithm_cls = ALGORITHMS[config.algorithm.name]
    _check_recording(config, algorithm_cls.recorded, group.size)
    if config.eval.attacks:
        from fedge.attacks import in_run

        in_run.check(config)
    if has_random_layers(template):
        executor.noise = NoiseStreams(config.seed, device)
    ctx = Context(
        config=config,
        data=data,
        build_model=factory,
        executor=executor,
        network=Network(Ledger(), config.seed),
        system=SystemModel(config.system, data.num_clients, config.seed),
        device=device,
        seed=config.seed,
        criterion=criterion,
        cohorts=Cohorts(group),
    )
    privacy.prepare(privacy.PLANNERS, config, [len(ix) for ix in client_train], ctx.privacy)
    return Built(config, ctx, algorithm_cls(ctx, config.algorithm))


def default_run_name(config: RunConfig) -> str:
    return config.output.name or f"{config.algorithm.name}-{config.data.name}"


def _communication(ledger: Ledger) -> dict[str, Any]:
    """Cumulative communication and storage figures of the ledger, for a metrics row."""
    by_kind: dict[str, int] = {}
    for (kind, _), bits in ledger.totals().items():
        by_kind[kind] = by_kind.get(kind, 0) + bits
    up, down, peer = (ledger.total_bits(way) for way in ("up", "down", "peer"))
    storage = ledger.storage_bits()
    return {
        "bits_up": up,
        "bits_down": down,
        "bits_peer": peer,
        "mb_up": up / MIB,
        "mb_down": down / MIB,
        "mb_peer": peer / MIB,
        "mb_total": (up + down + peer) / MIB,
        "bits_by_kind": dict(sorted(by_kind.items())),
        "storage_server_bits": storage["server"],
        "storage_client_bits": storage["client_max"],
    }


@dataclass
class Runner:
    """Drives one run in ``run_dir`` from round ``start + 1`` to ``config.rounds``."""

    built: Built
    run_dir: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    start: int = 0
    wall_offset: float = 0.0
    on_round: Callable[[int, dict[str, Any]], None] | None = None  # after every round, with its record
    stopped: stop.Stop | None = None
    lock: results.RunLock | None = None
    checkpointed: int | None = None  # round of the last checkpoint written or restored
    nonfinite: str | None = None  # the first non-finite value met under stop.on_nonfinite=continue
    journal: checkpoint.Journal | None = None  # the checkpoint's history of rows and transfers
    journaled: tuple[int, int] = (0, 0)  # rows and ledger transfers the journal holds

    @property
    def config(self) -> RunConfig:
        return self.built.config

    @property
    def group(self) -> Group:
        """The run's processes; only rank 0 writes the run directory (docs/scale-out.md)."""
        return self.built.context.cohorts.group

    def _checkpoint(self, t: int, wall: float) -> None:
        """Append what is new since the last checkpoint (rows, ledger transfers) to the journal, then
        write the rest of the state: a checkpoint's cost does not grow with the rounds behind it."""
        ledger = self.built.context.ledger
        state = {
            "round": t,
            "algorithm": self.built.algorithm.state_dict(),
            "ledger": ledger.state_dict(entries=False),
            "clock": self.built.context.system.clock.state_dict(),
            "privacy": self.built.context.privacy.ledger.state_dict(),
            "wall_seconds": wall,
            "nonfinite": self.nonfinite,
        }
        stages = self.built.context.stage_state()
        if stages:  # only stages that carry state across rounds (an adaptive clip's bound)
            state["stages"] = stages
        if self.group.writes:
            path = self.run_dir / results.CHECKPOINT
            journal = self.journal or checkpoint.Journal(checkpoint.journal_path(path))
            new = {"rows": self.rows[self.journaled[0] :], "ledger": ledger.entries_since(self.journaled[1])}
            journal.append(new)
            checkpoint.save(path, state, self.config, t, journal)
            self.journal = journal
        self.journaled = (len(self.rows), ledger.entry_count())
        self.group.barrier()  # every rank has the checkpoint's round done before any goes on
        self.checkpointed = t

    def restore(self, saved: checkpoint.Checkpoint) -> None:
        """Continue from a verified checkpoint of this run, once its state makes sense for it
        (:mod:`fedge.runner.restore`)."""
        path = self.run_dir / results.CHECKPOINT
        whole = restore.with_history(saved, checkpoint.journal_path(path))
        state = whole.state
        fresh = {"algorithm": self.built.algorithm.state_dict()}
        restore.check(whole, self.config, fresh, path, self.run_dir / results.METRICS)
        try:
            self.built.algorithm.load_state_dict(state["algorithm"])
            self.built.context.ledger.load_state_dict(state["ledger"])
            self.built.context.system.clock.load_state_dict(state["clock"])
            if "privacy" in state:  # a checkpoint from before the privacy ledger had no releases
                self.built.context.privacy.ledger.load_state_dict(state["privacy"])
            self.built.context.load_stage_state(state.get("stages", {}))
            self.rows = list(state["rows"])
            self.start = int(state["round"])
            self.wall_offset = float(state["wall_seconds"])
            self.nonfinite = state["nonfinite"]
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as error:
            detail = str(error).splitlines()[0] if str(error) else ""
            raise CheckpointError(
                self.run_dir / results.CHECKPOINT, f"does not fit this run ({type(error).__name__}: {detail})"
            ) from None
        self.checkpointed = self.start
        self.journal = saved.journal
        if saved.records:  # else a format-1 checkpoint: its whole past goes to the journal next time
            self.journaled = (len(self.rows), self.built.context.ledger.entry_count())

    def settle(self) -> None:
        """Make the run directory agree with the state the run continues from (once every check passed):
        ``metrics.jsonl`` holds exactly the rows so far (rows a kill left after the checkpoint go, a lost
        or damaged file comes back), and the journal ends where the checkpoint says."""
        results.write_jsonl(self.run_dir / results.METRICS, self.rows)
        if self.journal is not None:
            self.journal.cut()
        else:
            checkpoint.journal_path(self.run_dir / results.CHECKPOINT).unlink(missing_ok=True)

    def _nonfinite(self, metrics: dict[str, Any]) -> str | None:
        """What is not finite after a round: a metric or the algorithm's state (``None``: nothing)."""
        return divergence.nonfinite_metric(metrics) or divergence.nonfinite_state(
            self.built.algorithm.state_dict()
        )

    def _diverged(self, t: int, what: str) -> Diverged:
        """Record why the run stopped in ``summary.json`` (its last good rows stay as they are)."""
        summary = {**summarize(self.config, self.rows), **self._energy_summary()}
        summary.update(
            status="diverged", reason=f"round {t}: {what}", last_checkpoint_round=self.checkpointed
        )
        if self.group.writes:
            results.write_json(self.run_dir / results.SUMMARY, summary)
        return Diverged(self.run_dir, t, what, self.checkpointed)

    def _energy_summary(self) -> dict[str, Any]:
        """The ledger's summary fields and the nodes that spent the most simulated energy (every node's
        joules go to ``energy.csv``)."""
        clock = self.built.context.system.clock
        top = clock.top_nodes(TOP_NODES)
        return {**records.ledger_summary(self.built.context.ledger), "sim_joules_top_nodes": top}

    def run(self) -> Result:
        """Run the remaining rounds and finish; raise :class:`~fedge.errors.Diverged` on a NaN or infinity.

        Every round writes its record to ``metrics.jsonl``. A round is evaluated every ``eval.every``
        rounds, at the last round, and when it crosses a stop budget; the run ends early when a rule of
        ``config.stop`` holds (:mod:`fedge.runner.stop`).
        """
        try:
            return self._rounds()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _rounds(self) -> Result:
        cfg, ledger = self.config, self.built.context.ledger
        began = time.perf_counter() - self.wall_offset
        self.stopped = stop.check(cfg.stop, self.rows)  # a resumed run may have stopped already
        writes = self.group.writes
        tracking = Tracking(
            cfg if writes else cfg.model_copy(update={"tracking": []}), self.run_dir, self.start
        )
        try:
            for t in range(self.start + 1, cfg.rounds + 1):
                if self.stopped:
                    break
                round_metrics = self.built.round(t).row()
                recorded = self.built.context.recorder.take()
                if writes:
                    transfers.write_round(self.run_dir, t, recorded, cfg)
                if cfg.eval.attacks:  # the attacks as evaluators of the round just recorded
                    from fedge.attacks import in_run

                    round_metrics.update(in_run.figures(self.built, self.run_dir, t))
                clock = self.built.context.system.clock
                costs = {**_communication(ledger), "sim_seconds": clock.seconds, "sim_joules": clock.joules}
                costs.update(clock.breakdown())
                costs.update(self.built.context.privacy.ledger.round_fields(t))
                due = t % cfg.eval.every == 0 or t == cfg.rounds or stop.over_budget(cfg.stop, costs)
                row = {"round": t, **(self.built.evaluate(t).row() if due else {}), **round_metrics, **costs}
                wall = self.group.broadcast(time.perf_counter() - began)  # rank 0's clock: one stop decision
                row.update(records.round_costs(ledger), wall_seconds=wall)
                what = self._nonfinite(row)
                if what is not None and cfg.stop.on_nonfinite == "error":
                    raise self._diverged(t, what)
                self.nonfinite = self.nonfinite or (None if what is None else f"round {t}: {what}")
                self.rows.append(row)
                if writes:  # one line added: the checkpoint says how many rows are the run's
                    results.append_jsonl(self.run_dir / results.METRICS, row)
                self.stopped = stop.check(cfg.stop, self.rows)
                if t % cfg.output.checkpoint_every == 0 or t == cfg.rounds or self.stopped:
                    self._checkpoint(t, wall)
                tracking.log(row)
                if self.on_round is not None and writes:
                    self.on_round(t, row)
            result = self.finish()
            tracking.finish(result.summary)
        finally:
            tracking.close()
        return result

    def finish(self) -> Result:
        """Write summary, ledger and plots of a run that reached its last round."""
        summary = {**summarize(self.config, self.rows), **self._energy_summary()}
        summary.update(aggregation=self.built.context.aggregation_summary())
        summary.update(privacy=self.built.context.privacy.ledger.summary())
        summary.update(status="finished", first_nonfinite=self.nonfinite)
        if not self.group.writes:
            self.group.barrier()  # rank 0 has written the results when any rank returns
            return Result(self.run_dir, self.config, self.rows, summary)
        summary.update(transfers.summary(self.run_dir, self.config))
        results.write_jsonl(self.run_dir / results.METRICS, self.rows)
        results.write_text(self.run_dir / results.LEDGER, self.built.context.ledger.to_csv())
        results.write_text(self.run_dir / results.ENERGY, self.built.context.system.clock.to_csv())
        if self.built.context.privacy.ledger.active:
            results.write_text(self.run_dir / results.PRIVACY, self.built.context.privacy.ledger.to_csv())
        results.write_json(self.run_dir / results.SUMMARY, summary)
        if self.config.output.plots:
            plot_run(self.run_dir, self.rows, self.run_dir.name)
        self.group.barrier()
        return Result(self.run_dir, self.config, self.rows, summary)


def _leaks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The in-run attacks' figures of the last recorded round (``eval.attacks``), as ``leaks``."""
    attacked = [row for row in rows if any(key.startswith("leak_") for key in row)]
    if not attacked:
        return {}
    return {"leaks": {k: v for k, v in attacked[-1].items() if k.startswith("leak_")}}


def summarize(config: RunConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures of a run (accuracy from its evaluated rounds; only its names before the
    first), and why it stopped."""
    names = {"algorithm": config.algorithm.name, "dataset": config.data.name}
    scored = records.evaluated(rows)
    if not scored:
        return {**names, "rounds": rows[-1]["round"] if rows else 0}
    last = rows[-1]
    best = max(scored, key=lambda r: r["accuracy"])
    return {
        **names,
        "rounds": last["round"],
        "final_accuracy": scored[-1]["accuracy"],
        "best_accuracy": best["accuracy"],
        "best_round": best["round"],
        "final_loss": scored[-1]["loss"],
        **({"final_perplexity": scored[-1]["perplexity"]} if "perplexity" in scored[-1] else {}),  # an LM
        **_leaks(rows),
        **{
            k: last[k]
            for k in ("bits_up", "bits_down", "bits_peer", "mb_up", "mb_down", "mb_peer", "mb_total")
        },
        "storage_server_bits": last["storage_server_bits"],
        "storage_client_bits": last["storage_client_bits"],
        "sim_seconds": last["sim_seconds"],
        "sim_joules": last["sim_joules"],
        **{k: last[k] for k in BREAKDOWN if k in last},
        "wall_seconds": last["wall_seconds"],
        "epsilon": last.get("epsilon"),  # the privacy ledger's cumulative epsilon (None: nothing private)
        "delta": config.privacy.delta if "epsilon" in last else None,
        **stop.summary_fields(config.stop, rows),
        **(_adversary_fields(rows) if config.adversary is not None else {}),
    }


def _adversary_fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """An adversary's run totals: ``malicious``, the attacking participations over all rounds,
    ``malicious_kept``, the mean of the rounds' kept shares where some attacked (``None``: none did, or
    the reducer does not report it); peers add ``malicious_selected``, the mean of the rounds' shares of
    honest peers' mixed-in neighbours that were malicious, and a backdoor ``final_attack_success``, the
    last evaluated round's attack success rate; a hierarchy's malicious edges ``malicious_edges`` (the
    attacking edge uploads) and ``malicious_edges_kept`` (the mean of the cloud's kept shares)."""
    kept = [r["malicious_kept"] for r in rows if r.get("malicious") and "malicious_kept" in r]
    success = [r["attack_success"] for r in rows if "attack_success" in r]
    fields = {
        "malicious": sum(int(r.get("malicious", 0)) for r in rows),
        "malicious_kept": sum(kept) / len(kept) if kept else None,
        **({"final_attack_success": success[-1]} if success else {}),
    }
    selected = [r["malicious_selected"] for r in rows if r.get("malicious") and "malicious_selected" in r]
    if selected:
        fields["malicious_selected"] = sum(selected) / len(selected)
    if any("malicious_edges" in r for r in rows):  # a hierarchy's malicious edge servers
        edges = [
            r["malicious_edges_kept"] for r in rows if r["malicious_edges"] and "malicious_edges_kept" in r
        ]
        fields["malicious_edges"] = sum(int(r["malicious_edges"]) for r in rows)
        fields["malicious_edges_kept"] = sum(edges) / len(edges) if edges else None
    return fields


def start_run(
    config: RunConfig, on_round=None, force: bool = False, extensions: Extensions | None = None
) -> Runner:
    """Validate and build ``config``, then create its run directory (only once the build succeeded)."""
    if launched_rank() == 0:
        results.check_output_dir(config.output.dir)
    built = build_run(config, force, extensions)
    group = built.context.cohorts.group
    run_dir = None
    if group.writes:
        run_dir = results.create_run_dir(config.output.dir, default_run_name(config), config.to_yaml())
        device = built.context.device
        write_environment(run_dir, str(device), group, executor_name(config, device.type))
        if built.context.system.profiles is not None:  # the run's device profiles, one row per client
            results.write_text(run_dir / "devices.csv", built.context.system.devices_csv())
        inputs.record(run_dir, config)
    run_dir = group.broadcast(run_dir)
    lock = results.RunLock(run_dir) if group.writes else None
    return Runner(built, run_dir, on_round=on_round, lock=lock)


def open_run(
    run_dir: Path,
    on_round=None,
    force: bool = False,
    extensions: Extensions | None = None,
    rounds: int | None = None,
) -> Runner:
    """A runner that continues the run in ``run_dir`` from its last checkpoint (with ``rounds``: to that
    length, a finished run too, where :mod:`fedge.runner.run_length` allows).

    Everything is checked before anything in ``run_dir`` changes: the folder can be written and no other
    process runs it, and the checkpoint is intact and belongs to this run's ``config.yaml``. Only then
    are the temporary files of an interrupted write removed.
    """
    run_dir = Path(run_dir)
    config_path = run_dir / results.CONFIG
    if not config_path.is_file():
        raise FedgeError(f"{run_dir}: not a run directory (no {results.CONFIG})")
    written = load_config(config_path)
    config = written if rounds is None else load_config(config_path, [f"rounds={rounds}"])
    writes = launched_rank() == 0  # every rank reads the run directory, only rank 0 changes it
    if writes:
        results.check_writable(run_dir)
    lock = results.RunLock(run_dir) if writes else None
    path = run_dir / results.CHECKPOINT
    try:
        # anything at the path is read (a directory or a FIFO is refused, not taken for no checkpoint)
        saved = checkpoint.load(path, written) if os.path.lexists(path) else None
        inputs.check(run_dir, config)
        runner = Runner(build_run(config, force, extensions), run_dir, on_round=on_round, lock=lock)
        if saved is not None:
            run_length.check(saved, written, config, runner.built.algorithm, run_dir)
            runner.restore(saved)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if writes:
        results.remove_temporaries(run_dir)
        runner.settle()
        if run_length.changed(saved, written, config):
            run_length.relengthen(run_dir, saved, written, config)
        device = runner.built.context.device
        write_environment(run_dir, str(device), runner.group, executor_name(config, device.type))
    return runner
