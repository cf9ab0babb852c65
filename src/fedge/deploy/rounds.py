"""Which algorithms deploy, and the server side of a deployed run: the registered algorithm's own round,
with the run's executor replaced by a :class:`~fedge.deploy.executor.RemoteExecutor`.

Broadcasts, uploads, peer exchanges, server steps, averaging, the simulated clock and every ledger entry
go through the algorithm's own methods and links in the server app, fed with the rows the nodes trained,
so a deployed run without faults has the simulation's numbers. :class:`DeployedRounds` is the one hook
around a round: it tells the executor the round and adds the round's dropped clients to its metrics row
(``dropped``, ``dropped_nodes``); the rule a dropped client follows is the executor's (it keeps the rows
it was sent). The split family plugs its clients' steps into its own round instead
(:mod:`fedge.deploy.split_rounds`, :mod:`fedge.deploy.fedsl_rounds`).
"""

from __future__ import annotations

from typing import Any

from fedge.algorithms import ALGORITHMS
from fedge.comm import nodes
from fedge.config import (
    EDGE_ADVERSARY_ALGORITHMS,
    PEER_ADVERSARY_ALGORITHMS,
    SPLIT_ADVERSARY_ALGORITHMS,
    RunConfig,
)
from fedge.deploy.executor import RemoteExecutor
from fedge.deploy.fedsl_rounds import DeployedLightFedSL, DeployedTraditionalFedSL
from fedge.deploy.secagg import secagg_options
from fedge.deploy.secagg_round import SecAggPlusUpload, SecureRounds
from fedge.deploy.split_rounds import (
    DeployedCseFsl,
    DeployedFslAn,
    DeployedFslSage,
    DeployedSplitFedV1,
    DeployedSplitFedV2,
)
from fedge.deploy.transport import Transport
from fedge.errors import ConfigError
from fedge.metrics import RoundReport

REFUSED = {
    "centralized": "it has no clients: one model trains on the pooled data",
    "fedbuff": "its asynchronous event queue runs on the simulated clock only",
    "fedasync": "its asynchronous event queue runs on the simulated clock only",
    "fedavg_deadline": "its round deadline is on the simulated clock only",
    "cse_fsl_async": "its asynchronous event queue runs on the simulated clock only",
}
"""Algorithms that cannot be deployed, with the reason ``fedge deploy`` prints."""
ADVERSARY_DEPLOYED = (
    "fedavg",
    "fedavg_ft",
    *(name for name in PEER_ADVERSARY_ALGORITHMS if name != "fedfomo"),  # fedfomo's: untested deployed
    *EDGE_ADVERSARY_ALGORITHMS,
    *SPLIT_ADVERSARY_ALGORITHMS,
)
"""The algorithms whose ``adversary`` deploys: the star server's, the peers' (not yet FedFomo's), a
hierarchy's (members and edges) and the split server's; the asynchronous servers' (FedBuff, FedAsync)
do not deploy at all."""
SPLIT_ROUNDS: dict[str, type] = {
    "cse_fsl": DeployedCseFsl,
    "fsl_an": DeployedFslAn,
    "fsl_sage": DeployedFslSage,
    "splitfed_v1": DeployedSplitFedV1,
    "splitfed_v2": DeployedSplitFedV2,
    "light_fedsl": DeployedLightFedSL,
    "fedsl": DeployedTraditionalFedSL,
}


class DeployedRounds:
    """Mixed in front of a registered algorithm: its ``run_round`` with the clients' training on their
    nodes (the executor seam), and the round's dropouts in its metrics row."""

    transport: Transport
    ctx: Any
    rounds: Any
    secure: SecAggPlusUpload | None = None

    def check_deployable(self) -> None:
        """Every setting is carried: the codecs run in the server app's links."""

    def attach(self, transport: Transport) -> None:
        """Train through ``transport`` from now on; with a ``secagg`` stage, each round's upload and sum
        through Flower's SecAgg+ (:mod:`fedge.deploy.secagg_round`)."""
        self.transport = transport
        self.ctx.executor = RemoteExecutor(self, transport, self.ctx.executor)
        options = secagg_options(self.ctx.config)
        if options is not None:
            self.secure = SecAggPlusUpload(self.ctx, transport, options)  # type: ignore[arg-type]
            self.rounds = SecureRounds(self.rounds, self.secure)

    def run_round(self, t: int) -> RoundReport:
        executor: RemoteExecutor = self.ctx.executor
        executor.round = t
        report = super().run_round(t)
        lost = sorted(executor.untrained.get(t, ()))
        figures = {"dropped": len(lost), "dropped_nodes": [nodes.client(c) for c in lost]}
        return RoundReport(report.train_loss, {**report.extra, **figures})


def refusal(name: str) -> str | None:
    """Why algorithm ``name`` cannot be deployed (None: it can)."""
    return REFUSED.get(name)


def check_stages(config: RunConfig) -> None:
    """Refuse, in one line naming the key, what a deployment cannot carry: an ``adversary`` where it does
    not deploy (outside :data:`ADVERSARY_DEPLOYED`, whose rounds apply the attacks where the simulation
    does: :mod:`fedge.runtime.adversary`, :mod:`fedge.deploy.split_rounds`; a malicious node finds its
    poisoned data view by name, :func:`fedge.deploy.executor.attribute_name`) or next to a
    ``secagg`` stage (Flower's SecAgg+ hides the rows the attacks replace), ``output.record`` (the
    transfers are sampled in the simulation's exchange) and an aggregation stage that does not map: a
    ``secagg`` stage runs on Flower's SecAgg+ where its settings map
    (:func:`fedge.deploy.secagg.secagg_options`)."""
    if config.adversary is not None and config.algorithm.name not in ADVERSARY_DEPLOYED:
        deployed = ", ".join(ADVERSARY_DEPLOYED)
        raise ConfigError("adversary", f"deploys with {deployed}, not {config.algorithm.name} (yet)")
    if config.adversary is not None and secagg_options(config) is not None:
        raise ConfigError("adversary", "replaces rows the server receives; a deployed secagg hides them")
    if config.output.record:
        raise ConfigError("output.record", "is kept by a simulated run (fedge run), not a deployed one")
    secagg_options(config)


def deployed_class(name: str) -> type:
    """The deployed form of algorithm ``name``; a ConfigError naming why when it cannot deploy."""
    reason = refusal(name)
    if reason is not None:
        raise ConfigError("algorithm.name", f"{name!r} cannot be deployed: {reason}")
    if name in SPLIT_ROUNDS:
        return SPLIT_ROUNDS[name]
    algorithm = ALGORITHMS[name]
    return type(f"Deployed{algorithm.__name__}", (DeployedRounds, algorithm), {})
