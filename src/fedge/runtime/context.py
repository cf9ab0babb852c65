"""What an algorithm is built from: the run's data, model factory, engine, network, system and seed, and
the aggregation pipelines of its sites (:class:`Context`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fedge.aggregation import Pipeline, build_pipeline
from fedge.aggregation.stage import StageRun
from fedge.comm import Ledger, Network
from fedge.config import RunConfig
from fedge.data.federated import FederatedData
from fedge.distributed import SINGLE_PROCESS, Cohorts
from fedge.engine import Criterion, Executor, cross_entropy
from fedge.models import SplitModel
from fedge.privacy.run import RunPrivacy
from fedge.rng import derive_seed
from fedge.runtime.recording import TransferRecorder
from fedge.system import SystemModel


@dataclass
class Context:
    """What an algorithm is built from: data, a model factory, the engine, the network (links and the
    ledger behind them), the wireless system (with its simulated clock), the device, the seed and the
    cohorts (which rows of a set of participants this process runs)."""

    config: RunConfig
    data: FederatedData
    build_model: Callable[[], SplitModel]
    executor: Executor
    network: Network
    system: SystemModel
    device: torch.device
    seed: int
    criterion: Criterion = cross_entropy  # the per-sample training loss (train.loss, or the API's)
    cohorts: Cohorts = SINGLE_PROCESS  # which rows this process runs, and how they come back together
    pipelines: dict[str, Pipeline] = field(default_factory=dict, repr=False)  # built by pipeline(site)
    privacy: RunPrivacy = field(init=False, repr=False)  # the privacy ledger, its noise and calibration
    recorder: TransferRecorder = field(init=False, repr=False)  # output.record: transfers for the attacks

    def __post_init__(self) -> None:
        self.privacy = RunPrivacy(self.config.privacy, self.data.num_clients, self.seed)
        self.recorder = TransferRecorder(self.config.output, self.config.rounds, self.seed)

    @property
    def ledger(self) -> Ledger:
        """The run's ledger (what the runner reports; algorithms send through ``network`` links)."""
        return self.network.ledger

    def pipeline(self, site: str) -> Pipeline:
        """The aggregation pipeline at ``site`` (server, edge, cloud, peer, buffer) from the config's
        ``aggregation`` block, built once: every aggregation of the algorithm goes through it."""
        if site not in self.pipelines:
            run = StageRun(site, self.seed, self.privacy, self.network, self.system)
            self.pipelines[site] = build_pipeline(self.config.aggregation, site, run)
        return self.pipelines[site]

    def records_upload(self, site: str) -> bool:
        """Whether the runtime records the plain upload of the rows ``site`` aggregates: not where its
        reducer puts the senders' upload on the ledger itself (secure aggregation's masked vectors,
        :attr:`~fedge.aggregation.Reducer.carries_upload`), so that each upload is counted once."""
        return not self.pipeline(site).reducer.carries_upload

    def aggregation_summary(self) -> dict[str, list[str]]:
        """The stages of every site this run aggregates at, by site (``summary.json``)."""
        return {site: list(pipeline.names) for site, pipeline in sorted(self.pipelines.items())}

    def stage_state(self) -> dict[str, dict[str, Any]]:
        """The state of every built stage that has one, by site and position (an adaptive clip's bound):
        what the run's checkpoint keeps of its pipelines."""
        out: dict[str, dict[str, Any]] = {}
        for site, pipeline in sorted(self.pipelines.items()):
            held = {str(i): stage.state_dict() for i, stage in enumerate(pipeline.stages)}
            held = {i: state for i, state in held.items() if state}
            if held:
                out[site] = held
        return out

    def load_stage_state(self, state: dict[str, dict[str, Any]]) -> None:
        """Give :meth:`stage_state`'s state back to the stages (building their pipelines)."""
        for site, held in state.items():
            stages = self.pipeline(site).stages
            for i, stage_state in held.items():
                stages[int(i)].load_state_dict(stage_state)

    def start(self, purpose: str, round_: int) -> None:
        """Open the random streams of ``purpose`` (``train`` or ``evaluate``) in round ``round_``.

        Called once by the runner before each round and each evaluation: training noise (dropout) then
        comes from keys derived from ``(seed, purpose, round, phase, client)`` (:mod:`fedge.engine.noise`),
        and torch's global generator, left to layers fedge does not key, is seeded from the same names.
        """
        torch.manual_seed(derive_seed(self.seed, f"{purpose}-noise", round_))
        if purpose == "train":
            self.privacy.round = round_
            self.recorder.begin(round_)
        if self.executor.noise is not None:
            self.executor.noise.open(purpose, round_)
