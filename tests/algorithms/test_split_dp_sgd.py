"""DP-SGD in split learning's client step (privacy.sample): per-sample clipped gradients against a hand
loop and Opacus, the non-private run recovered, both executors with noise, the releases on the ledger and
DP-LoRA on a tiny language-model split."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cases import invoke, split_case, whole_and_resumed
from cases import trained_rounds as trained
from llm_cases import lm_config, needs_llm, write_corpus
from torch import nn

import fedge
from fedge.algorithms.split.private_step import make_private_apply, make_private_local_step
from fedge.engine.split import make_forward
from fedge.engine.step import cross_entropy
from fedge.errors import ConfigError
from fedge.privacy.split_sample import plan_split_sample
from fedge.runner.loop import build_run

CUT = {"clip": 1.0, "noise_multiplier": 1.0}
SAMPLE = {"clip": 0.5, "noise_multiplier": 1.0}


def split(out: Path, algorithm: str, privacy: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    if algorithm in ("cse_fsl", "fsl_sage", "cse_fsl_async"):
        options.setdefault("h", 2)
    return split_case(out, algorithm, privacy, **options)


def fingerprint(built, metrics) -> list[float]:
    return [m["train_loss"] for m in metrics] + [float(built.algorithm.evaluate()["loss"])]


def client_batch(tmp_path: Path, algorithm: str):
    """A built run's client model (trunk + aux head for local-loss algorithms), its client optimizer
    (plain SGD) and a batch of 12."""
    built = build_run(fedge.resolve_config(split(tmp_path, algorithm, {"sample": SAMPLE})))
    algo = built.algorithm
    data = built.context.data
    idx = torch.arange(12)
    params = {k: v.clone() for k, v in algo.client["params"].items()}
    return algo.parts, algo.client_sgd, params, data.x_train[idx], data.y_train[idx]


def hand_dp_sgd(grads: list[dict[str, torch.Tensor]], clip: float) -> dict[str, torch.Tensor]:
    """DP-SGD's mean of clipped per-sample gradients (noise 0), one sample at a time."""
    total: dict[str, torch.Tensor] = {}
    for g in grads:
        norm = math.sqrt(sum(float(v.double().square().sum()) for v in g.values()))
        scale = min(1.0, clip / norm)
        for name, v in g.items():
            total[name] = total.get(name, torch.zeros_like(v)) + v * scale
    return {name: v / len(grads) for name, v in total.items()}


def opacus_step(module: nn.Module, loss_of_batch, clip: float, batch: int) -> dict[str, torch.Tensor]:
    """One Opacus DP-SGD step (noise 0, plain SGD with lr 1): the gradient it applied, by name."""
    opacus = pytest.importorskip("opacus")
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    wrapped = opacus.GradSampleModule(module)
    sgd = torch.optim.SGD(wrapped.parameters(), lr=1.0)
    optimizer = opacus.optimizers.DPOptimizer(
        sgd, noise_multiplier=0.0, max_grad_norm=clip, expected_batch_size=batch
    )
    optimizer.zero_grad()
    loss_of_batch(wrapped).backward()
    optimizer.step()
    return {n: before[n] - p.detach() for n, p in module.named_parameters()}


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_local_loss_step_clips_each_samples_gradient_like_a_hand_loop_and_opacus(tmp_path):
    """FSL_AN's step: per-sample gradients of the aux loss over trunk and aux head, clipped at 0.05 (below
    every sample's norm here), averaged: the same as one sample at a time and as Opacus's DP-SGD."""
    parts, sgd, params, x, y = client_batch(tmp_path, "fsl_an")
    clip, local = 0.05, parts.local
    step = make_private_local_step(local, sgd, cross_entropy, clip, lambda name: True)
    zeros = {k: torch.zeros_like(v) for k, v in params.items()}
    out = step(params, {}, {}, zeros, x, y, torch.ones(len(y)), 1.0)
    applied = {k: params[k] - out.state[0][k] for k in params}
    trunk, aux = local.get_submodule("trunk"), local.get_submodule("aux")
    model = copy.deepcopy(nn.Sequential(trunk, aux))
    model.load_state_dict({k.replace("trunk.", "0.").replace("aux.", "1."): v for k, v in params.items()})
    grads = []
    for i in range(len(y)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    norms = [math.sqrt(sum(float(v.square().sum()) for v in g.values())) for g in grads]
    assert min(norms) > clip  # every sample is clipped
    by_hand = hand_dp_sgd(grads, clip)
    loss_sum = lambda m: nn.functional.cross_entropy(m(x), y, reduction="sum")  # noqa: E731
    by_opacus = opacus_step(model, loss_sum, clip, len(y))
    for name, value in applied.items():
        local_name = name.replace("trunk.", "0.").replace("aux.", "1.")
        assert torch.allclose(value, by_hand[local_name], atol=1e-6)
        assert torch.allclose(value, by_opacus[local_name], atol=1e-6)


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_splitfed_step_clips_each_samples_gradient_through_its_cut_gradient(tmp_path):
    """SplitFed's trunk update: sample i's gradient is the vector-Jacobian product of its smashed data with
    n times its row of the returned (mean-loss) cut gradient; clipped, averaged: hand loop and Opacus."""
    parts, sgd, params, x, _ = client_batch(tmp_path, "splitfed_v2")
    clip, n = 0.05, len(x)
    trunk_params = {k: v for k, v in params.items() if k.startswith("trunk.")}
    z = parts.trunk(x)
    grad_z = torch.randn(z.shape, generator=torch.Generator().manual_seed(0)) / n  # a mean loss's gradient
    apply = make_private_apply(make_forward(parts.trunk), sgd, None, clip)
    zeros = {k: torch.zeros_like(v) for k, v in trunk_params.items()}
    out = apply(trunk_params, {}, {}, zeros, x, grad_z, torch.ones(n), 1.0)
    applied = {k: trunk_params[k] - out.state[0][k] for k in trunk_params}
    model = copy.deepcopy(parts.trunk)
    model.load_state_dict({k[len("trunk.") :]: v for k, v in trunk_params.items()})
    grads = []
    for i in range(n):
        model.zero_grad()
        (model(x[i : i + 1]) * grad_z[i : i + 1] * n).sum().backward()
        grads.append({f"trunk.{k}": p.grad.clone() for k, p in model.named_parameters()})
    by_hand = hand_dp_sgd(grads, clip)
    by_opacus = opacus_step(model, lambda m: (m(x) * grad_z * n).sum(), clip, n)
    for name, value in applied.items():
        assert torch.allclose(value, by_hand[name], atol=1e-6)
        assert torch.allclose(value, by_opacus[name[len("trunk.") :]], atol=1e-6)


@pytest.mark.parametrize(
    ("algorithm", "options"),
    [
        ("splitfed_v2", {}),
        ("splitfed_v2", {"server_order": "client_after_client"}),
        ("splitfed_v1", {"agg_every": 2}),
        ("cse_fsl", {}),
        ("fsl_an", {"smashed_from": "post_step"}),
        ("cse_fsl", {"optimizer": {"kind": "adam", "lr": 0.01}, "client_optimizer_state": "keep"}),
        ("splitfed_v2", {"optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "clip_norm": 0.5}),
        ("fsl_sage", {}),
    ],
)
def test_a_huge_clip_and_no_noise_train_as_without_privacy(tmp_path, algorithm, options):
    plain = fingerprint(*trained(split(tmp_path, algorithm, **options)))
    exact = {"sample": {"clip": 1e9, "noise_multiplier": 0.0}}
    assert fingerprint(*trained(split(tmp_path, algorithm, exact, **options))) == pytest.approx(
        plain, abs=1e-6
    )


@pytest.mark.parametrize("algorithm", ["splitfed_v1", "fsl_an", "cse_fsl_async"])
def test_both_executors_agree_with_the_noise_on(tmp_path, algorithm):
    raw = split(tmp_path, algorithm, {"sample": SAMPLE, "cut": CUT})
    (seq, m1), (bat, m2) = (trained(raw, executor=ex) for ex in ("sequential", "batched"))
    assert fingerprint(seq, m1) == pytest.approx(fingerprint(bat, m2), abs=1e-5)
    assert seq.context.privacy.ledger.releases == bat.context.privacy.ledger.releases
    plain = fingerprint(*trained(split(tmp_path, algorithm, {"cut": CUT})))
    assert abs(fingerprint(seq, m1)[-1] - plain[-1]) > 1e-4  # the DP-SGD noise changed the training


def test_the_noise_is_the_keyed_stream_at_std_z_c_over_the_batch(tmp_path):
    """One local step of SplitFed v2: the noisy and the noise-free runs differ by exactly the step's
    noise, each client's from the stream (gradient, round, client, draw, run, step) with std z * C,
    divided by the batch of 16 and averaged over the 4 equal clients."""
    options = {"local_steps": 1}
    private = split(tmp_path, "splitfed_v2", {"sample": SAMPLE, "cut": CUT}, **options)
    silent = split(
        tmp_path, "splitfed_v2", {"sample": {**SAMPLE, "noise_multiplier": 0.0}, "cut": CUT}, **options
    )
    (noisy, _), (quiet, _) = trained(private, rounds=1), trained(silent, rounds=1)
    lr = noisy.algorithm.learning_rates(1)[0]
    trunk = sorted(k for k in quiet.algorithm.client["params"] if k.startswith("trunk."))
    like = torch.empty(sum(quiet.algorithm.client["params"][k].numel() for k in trunk))
    std = SAMPLE["noise_multiplier"] * SAMPLE["clip"]
    draws = [noisy.context.privacy.gaussian(like, std, "gradient", 1, c, 0, 0, 0) for c in range(4)]
    expected = -lr * torch.stack(draws).mean(dim=0) / 16
    moved = torch.cat(
        [(noisy.algorithm.client["params"][k] - quiet.algorithm.client["params"][k]).flatten() for k in trunk]
    )
    assert torch.allclose(moved, expected, atol=1e-6)
    assert float(expected.abs().max()) > 1e-3  # the noise is not negligible at this size


def test_cse_fsls_server_backprop_pass_is_private_and_counted(tmp_path):
    """Every-l-rounds CSE-FSL with the server-backprop z_b step: the trunk steps on the returned cut
    gradient in a server round, a DP-SGD step too, whose batch adds one use of its samples."""
    options = {"server_trigger": "every_l_rounds", "zb_step": "server_backprop", "h": 1}
    raw = split(tmp_path, "cse_fsl", {"sample": SAMPLE, "cut": CUT}, **options)
    (seq, m1), (bat, m2) = (trained(raw, executor=ex) for ex in ("sequential", "batched"))
    assert fingerprint(seq, m1) == pytest.approx(fingerprint(bat, m2), abs=1e-5)
    uses = {
        (r.round, r.clients[0]): r.count for r in seq.context.privacy.ledger.releases if r.kind == "gradient"
    }
    assert uses == {**{(1, c): 1 for c in range(4)}, **{(2, c): 2 for c in range(4)}}


def test_the_ledger_records_one_gradient_release_per_client_and_round_as_planned(tmp_path):
    """Two local epochs: each sample is in two steps a round; with privacy.cut on, every epsilon is finite
    and the planner foresees exactly the recorded releases."""
    raw = split(tmp_path, "splitfed_v2", {"sample": SAMPLE, "cut": CUT}, local_epochs=2)
    built, _ = trained(raw)
    ledger = built.context.privacy.ledger
    gradient = [r for r in ledger.releases if r.kind == "gradient"]
    assert sorted((r.round, r.clients, r.count) for r in gradient) == [
        (t, (c,), 2) for t in (1, 2) for c in range(4)
    ]
    assert {(r.unit, r.noise_multiplier, r.clip, r.sampling) for r in gradient} == {
        ("sample", 1.0, 0.5, "none")
    }
    summary = ledger.summary()
    assert math.isfinite(summary["epsilon_by_unit"]["sample"])
    assert summary["epsilon_by_unit"]["sample"] > summary["epsilon_by_kind"]["gradient"] > 0
    sizes = [int(s) for s in built.context.data.client_sizes()]
    planned = plan_split_sample(built.context.config, sizes, 1.0)
    assert sorted(planned, key=repr) == sorted(gradient, key=repr)


def test_without_cut_noise_the_smashed_data_is_a_release_without_noise(tmp_path):
    built, _ = trained(split(tmp_path, "splitfed_v2", {"sample": SAMPLE}))
    summary = built.context.privacy.ledger.summary()
    smashed = [r for r in built.context.privacy.ledger.releases if r.kind == "smashed"]
    assert smashed and {r.noise_multiplier for r in smashed} == {0.0}
    assert math.isinf(summary["epsilon"]) and math.isfinite(summary["epsilon_by_kind"]["gradient"])


def test_cse_fsl_spends_less_than_splitfed_at_the_same_noise(tmp_path):
    """Both step on every sample once per epoch (equal DP-SGD epsilon); CSE-FSL with h = 8 sends each
    sample's smashed data once a round against SplitFed's twice: its sample epsilon is smaller."""
    privacy = {"sample": SAMPLE, "cut": CUT}
    v2, _ = trained(split(tmp_path, "splitfed_v2", privacy, local_epochs=2))
    cse, _ = trained(split(tmp_path, "cse_fsl", privacy, local_epochs=2, h=8))
    s2, sc = v2.context.privacy.ledger.summary(), cse.context.privacy.ledger.summary()
    assert sc["epsilon_by_kind"]["gradient"] == pytest.approx(s2["epsilon_by_kind"]["gradient"], rel=1e-12)
    assert sc["epsilon_by_unit"]["sample"] < s2["epsilon_by_unit"]["sample"]


def test_target_epsilon_calibrates_the_dp_sgd_multiplier_and_the_cli_reports_it(tmp_path):
    privacy = {"target_epsilon": 10.0, "sample": {"clip": 0.5}, "cut": CUT}
    raw = split(tmp_path, "fsl_an", privacy)
    built, _ = trained(raw)
    assert built.context.privacy.ledger.summary()["epsilon"] == pytest.approx(10.0, rel=1e-3)
    path = tmp_path / "dp.json"
    path.write_text(json.dumps({**raw, "output": {**raw["output"], "name": "cli"}}))
    outcome = invoke(["run", str(path), "-q"])
    assert outcome.code == 0, outcome.output
    summary = json.loads(next(tmp_path.glob("cli*/summary.json")).read_text())
    assert summary["privacy"]["epsilon_by_kind"]["gradient"] > 0
    assert summary["epsilon"] == pytest.approx(10.0, rel=1e-3)


VGG = {"name": "vgg", "cut": 2, "options": {"depth": 11, "width": 0.125}}
DROPOUT = {"name": "fcnn", "cut": 1, "options": {"dropout": 0.2}}


@pytest.mark.parametrize(
    ("algorithm", "model", "reason"),
    [
        ("splitfed_v2", VGG, "privacy.sample: .* without BatchNorm"),
        ("cse_fsl", DROPOUT, "privacy.sample: .* without dropout"),
        ("splitfed_v2", None, r"privacy\.sample\.noise_multiplier"),
    ],
)
def test_refusals_name_the_key(tmp_path, algorithm, model, reason):
    sample = {"clip": 1.0} if "multiplier" in reason else SAMPLE
    raw = split(tmp_path, algorithm, {"sample": sample})
    if model is not None:
        raw["model"] = model
        raw["data"]["shape"] = [3, 32, 32]
    with pytest.raises(ConfigError, match=reason):
        trained(raw, rounds=1)


def test_a_resumed_run_adds_the_same_noise_and_spends_the_same(tmp_path):
    privacy = {"sample": SAMPLE, "cut": CUT}
    whole, resumed = whole_and_resumed(lambda out: split(out, "cse_fsl", privacy), tmp_path, 3, 2)
    assert resumed.summary["privacy"] == whole.summary["privacy"]
    assert resumed.metrics[-1]["train_loss"] == whole.metrics[-1]["train_loss"]


def test_a_target_epsilon_without_cut_noise_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"privacy\.target_epsilon: smashed data"):
        trained(split(tmp_path, "splitfed_v2", {"target_epsilon": 5.0, "sample": {"clip": 1.0}}), rounds=1)


def test_a_deployed_split_run_refuses_dp_sgd(tmp_path):
    """A deployed node trains itself: its steps would not be DP-SGD, so the key is refused."""
    pytest.importorskip("flwr")
    from fedge.deploy.split_rounds import DeployedCseFsl

    cfg = fedge.resolve_config(split(tmp_path, "cse_fsl", {"sample": SAMPLE}))
    algorithm = DeployedCseFsl(build_run(cfg).context, cfg.algorithm)
    with pytest.raises(ConfigError, match=r"privacy\.sample"):
        algorithm.check_deployable()


def _distributed_helpers():
    """The two-rank launcher of tests/distributed (loaded by path: that folder is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "distributed" / "test_distributed.py"
    spec = importlib.util.spec_from_file_location("distributed_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.ci
def test_two_ranks_add_one_process_dp_sgd_noise(tmp_path):
    helpers = _distributed_helpers()
    cfg = helpers.split_config(tmp_path, "splitfed_v2")
    cfg["privacy"] = {"sample": SAMPLE, "cut": CUT}
    (tmp_path / "seen").mkdir()
    helpers.launch(2, [(cfg, "two")], tmp_path / "seen")
    fedge.run(cfg, ["output.name=one"])
    two, one = tmp_path / "runs" / "two", tmp_path / "runs" / "one"
    assert (two / "privacy.csv").read_text() == (one / "privacy.csv").read_text()
    assert np.abs(helpers.final_state(two) - helpers.final_state(one)).max() <= 1e-5


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@needs_llm
def test_dp_lora_on_a_tiny_lm_split(corpus):
    """GPT-2 with LoRA split after one block: DP-SGD on the adapters (the only client parameters) with
    the hidden-state noise at the cut; a huge clip without noise trains as the plain run; both executors
    agree with the noise on and the run reports a finite epsilon."""
    algorithm = {"name": "splitfed_v2"}
    plain = fingerprint(*trained(lm_config(corpus, algorithm), rounds=1))
    exact = lm_config(corpus, algorithm, privacy={"sample": {"clip": 1e9, "noise_multiplier": 0.0}})
    assert fingerprint(*trained(exact, rounds=1)) == pytest.approx(plain, abs=1e-5)
    noisy = lm_config(corpus, algorithm, privacy={"sample": {"clip": 0.1, "noise_multiplier": 1.0},
                                                  "cut": {"clip": 0.5, "noise_multiplier": 1.0}})  # fmt: skip
    (seq, m1), (bat, m2) = (trained(noisy, rounds=1, executor=ex) for ex in ("sequential", "batched"))
    assert fingerprint(seq, m1) == pytest.approx(fingerprint(bat, m2), abs=1e-5)
    assert fingerprint(seq, m1)[-1] != pytest.approx(plain[-1], abs=1e-4)
    names = set(seq.algorithm.client["params"])
    assert names and all("lora_" in name for name in names)
    summary = seq.context.privacy.ledger.summary()
    assert {"gradient", "smashed"} <= set(summary["epsilon_by_kind"]) and math.isfinite(summary["epsilon"])
