"""Deployed adversaries of the decentralized and hierarchical families, in process: the server side of
``fedge deploy`` over the loopback transport against the simulation.

A malicious node builds its poisoned data view (flipped labels, a backdoor's stamped samples) from the
config and seed and trains on it; model poisoning stays where the simulation applies it, in the server
app (the peers' sent models as the exchange forms them, a cell's uploads and an edge's upload to the
cloud at receipt). Each case must end with the simulation's model, ledger and adversary figures, and the
attack must change the run.
"""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from fedge.deploy.loopback import LoopbackTransport  # noqa: E402
from fedge.deploy.rounds import check_stages  # noqa: E402
from fedge.deploy.server_app import run_deployed  # noqa: E402
from fedge.errors import ConfigError  # noqa: E402
from fedge.runner import checkpoint  # noqa: E402
from tests.deploy.test_deploy import ROUNDS, assert_equal_runs, config, simulate, tensors_of  # noqa: E402

FIGURES = (
    "malicious",
    "malicious_selected",
    "malicious_kept",
    "malicious_edges",
    "malicious_edges_kept",
    "attack_success",
    "accuracy",
)
"""The adversary's figures a round may report (and the accuracy they are about)."""
PEERS = {
    "gossip_label_flip": ("gossip", {"clients": [1], "attack": "label_flip"}, []),
    "gossip_alie_median": ("gossip", {"clients": [1], "attack": "alie"}, ["median"]),
    "afind_sign_flip_honest_probes": (
        "afind", {"clients": [1], "attack": "sign_flip", "options": {"scale": 2.0}}, [],
    ),
    "afind_label_flip_poisoned_probes": (
        "afind", {"clients": [1], "attack": "label_flip", "probes": "poisoned"}, [],
    ),
    "pens_ipm_poisoned_probes": ("pens", {"clients": [2], "attack": "ipm", "probes": "poisoned"}, []),
    "ditto_backdoor": ("ditto", {"clients": [1], "attack": "backdoor"}, []),
    "afind_backdoor_poisoned_probes": (
        "afind", {"clients": [1], "attack": "backdoor", "probes": "poisoned"}, [],
    ),
    "federico_backdoor": ("federico", {"clients": [2], "attack": "backdoor"}, []),
    "dispfl_label_flip": ("dispfl", {"clients": [1], "attack": "label_flip"}, []),
}  # fmt: skip
"""Malicious peers: data poisoning on the node (Gossip's and AFIND+'s flipped labels, also in AFIND+'s
probe answers; Ditto's, AFIND+'s and FedeRiCo's stamped samples, AFIND+'s probed too), model poisoning
of the sent models, rank-local and omniscient (before a median), with a selector that probes honestly
and one that scores the poisoned models (PENS); Dis-PFL's flipped labels on its sparse models."""
CELLS = 5
"""Clients of a hierarchy's runs: two cells of two members, client 4 idles."""
EDGE_MEDIAN = [{"name": "median", "at": ["edge"]}]
HIERARCHY = {
    "hfedavg_sign_flip_edge_median": ("hfedavg", {"clients": [0], "attack": "sign_flip"}, EDGE_MEDIAN),
    "hfedavg_label_flip": ("hfedavg", {"clients": [2], "attack": "label_flip"}, []),
    "hfedavg_ipm_edge": ("hfedavg", {"edges": [1], "attack": "ipm"}, []),
    "hist_backdoor": ("hist", {"clients": [1], "attack": "backdoor"}, []),
    "hist_gaussian_member_and_edge": ("hist", {"clients": [3], "edges": [0], "attack": "gaussian"}, []),
}
"""Malicious cell members (model poisoning at the edge's receipt, before an edge median; data poisoning
on the node) and malicious edge servers (their upload at the cloud's receipt), in HFedAvg and HIST."""


def model_gap(run_dir, honest) -> float:
    """The largest difference between the final models of a run and of its honest simulation."""
    got = tensors_of(checkpoint.load(run_dir / "checkpoint.pt").state["algorithm"])
    want = tensors_of(checkpoint.load(honest.run_dir / "checkpoint.pt").state["algorithm"])
    return max(float((got[k].double() - want[k].double()).abs().max()) for k in want)


def check_case(
    tmp_path, algorithm: str, adversary: dict, stages: list, clients: int, trained: range | None = None
) -> list:
    """Deploy ``algorithm`` under ``adversary`` over the loopback transport: the simulation's model,
    ledger and figures, and a model the attack moved from the honest run's; the deployed metrics rows."""
    stages_of = {"aggregation": {"stages": stages}}
    cfg = config(tmp_path, algorithm, ROUNDS.get(algorithm, 2), clients, adversary=adversary, **stages_of)
    check_stages(cfg)
    deployed = run_deployed(cfg, lambda n: LoopbackTransport(cfg, n))
    simulated = simulate(cfg, tmp_path)
    assert_equal_runs(deployed.run_dir, simulated, algorithm, trained)
    for key in FIGURES:
        got = [r.get(key) for r in deployed.metrics]
        assert got == pytest.approx([r.get(key) for r in simulated.metrics], abs=1e-6), key
    honest = simulate(cfg.model_copy(update={"adversary": None}), tmp_path / "honest")
    assert model_gap(deployed.run_dir, honest) > 1e-3
    return deployed.metrics


@pytest.mark.parametrize("case", list(PEERS))
def test_deployed_malicious_peers_equal_the_simulation(tmp_path, case):
    algorithm, adversary, stages = PEERS[case]
    rows = check_case(tmp_path, algorithm, adversary, stages, clients=3)
    assert [r["malicious"] for r in rows] == [1] * len(rows)
    if adversary["attack"] == "backdoor":
        assert all("attack_success" in r for r in rows)


@pytest.mark.parametrize("case", list(HIERARCHY))
def test_a_deployed_hierarchy_adversary_equals_the_simulation(tmp_path, case):
    algorithm, adversary, stages = HIERARCHY[case]
    rows = check_case(tmp_path, algorithm, adversary, stages, clients=CELLS, trained=range(CELLS - 1))
    if "clients" in adversary:  # two edge rounds, one malicious member's upload in each
        assert [r["malicious"] for r in rows] == [2] * len(rows)
    if "edges" in adversary:
        assert [r["malicious_edges"] for r in rows] == [1] * len(rows)


def test_a_deployed_fedfomo_adversary_is_refused_on_adversary(tmp_path):
    cfg = config(tmp_path, "fedfomo", 2, 3, adversary={"clients": [1], "attack": "label_flip"})
    with pytest.raises(ConfigError) as error:
        check_stages(cfg)
    assert error.value.key == "adversary"
