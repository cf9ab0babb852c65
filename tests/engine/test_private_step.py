"""DP-SGD in the local step (``privacy.sample``): per-sample clipped gradients as Opacus computes them,
padding that adds nothing, seeded noise of the stated std that both executors draw alike, a huge clip
without noise that trains as the non-private run, and the releases, epsilon and calibration a run
reports."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from cases import invoke, tiny
from opacus import GradSampleModule
from torch import nn

import fedge
from fedge.config import PrivacyConfig
from fedge.engine import classification_loss, make_step, parameters_of
from fedge.engine.executors import BatchedExecutor, PrivateKernel
from fedge.engine.private_chain import (
    CPU_CHAIN_CLIENTS,
    PrivateChainKernel,
    chain_layers,
    private_chain_kernel,
)
from fedge.engine.private_step import PrivateStep, SampleMechanism, sample_keys
from fedge.engine.step import SGD
from fedge.errors import ConfigError
from fedge.models import build_model
from fedge.privacy import Release, epsilon
from fedge.privacy.run import RunPrivacy
from fedge.runner.loop import build_run


def mechanism(clip: float, multiplier: float = 0.0, seed: int = 0) -> SampleMechanism:
    return SampleMechanism(RunPrivacy(PrivacyConfig(), 4, seed), clip, multiplier)


def dp_step(model: nn.Module, clip: float, multiplier: float = 0.0) -> PrivateStep:
    step = make_step(classification_loss(model), SGD())
    return PrivateStep(step.loss_fn, step.optimizer, mechanism(clip, multiplier))


def group_norm_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    )


MODELS = {
    "mlp": lambda: build_model("mlp", (1, 8, 8), 3, hidden=(16,)),
    "lenet5": lambda: build_model("lenet5", (1, 28, 28), 3),
    "groupnorm": group_norm_cnn,
}
SHAPES = {"mlp": (1, 8, 8), "lenet5": (1, 28, 28), "groupnorm": (1, 8, 8)}


def opacus_clipped(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float) -> list[dict[str, Any]]:
    """Each sample's gradient as Opacus's GradSampleModule computes it, clipped to ``clip`` over all
    parameters as its DP optimizer does."""
    wrapped = GradSampleModule(model)
    loss = nn.functional.cross_entropy(wrapped(x), y, reduction="sum")
    loss.backward()
    grads = {name.removeprefix("_module."): p.grad_sample for name, p in wrapped.named_parameters()}
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()]).norm(dim=0)
    factor = (clip / (norms + 1e-6)).clamp(max=1.0)
    out = [{name: g[i] * factor[i] for name, g in grads.items()} for i in range(len(x))]
    wrapped._close()
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_per_sample_clipped_gradients_and_their_sum_equal_opacus(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    params = parameters_of(model)
    x, y = torch.randn(6, *SHAPES[name]), torch.randint(0, 3, (6,))
    clip = 0.05  # below every sample's norm here: every gradient is scaled
    step = dp_step(model, clip)
    reference = MODELS[name]()
    reference.load_state_dict(model.state_dict())
    expected = opacus_clipped(reference, x, y, clip)
    ones = torch.ones(1)
    for i in range(len(x)):
        mine, _ = step.clipped_sum(params, {}, x[i : i + 1], y[i : i + 1], ones)
        for k in params:
            torch.testing.assert_close(mine[k], expected[i][k], rtol=0, atol=1e-6)
    total, _ = step.clipped_sum(params, {}, x, y, torch.ones(len(x)))
    for k in params:
        torch.testing.assert_close(total[k], sum(e[k] for e in expected), rtol=0, atol=1e-6)


def test_padding_samples_add_nothing():
    model = MODELS["mlp"]()
    params, step = parameters_of(model), dp_step(model, 0.1)
    x, y = torch.randn(5, 1, 8, 8), torch.randint(0, 3, (5,))
    real, _ = step.clipped_sum(params, {}, x[:3], y[:3], torch.ones(3))
    padded, _ = step.clipped_sum(params, {}, x, y, torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]))
    for k in params:
        torch.testing.assert_close(padded[k], real[k], rtol=0, atol=1e-7)


def test_the_noise_has_std_z_c_over_b_and_is_keyed():
    model = MODELS["mlp"]()
    step = PrivateStep(dp_step(model, 1.0).loss_fn, SGD(), mechanism(0.5, 2.0, seed=7))
    zero = {k: torch.zeros(400, *p.shape) for k, p in parameters_of(model).items()}
    noisy = step.noisy_gradients(zero, list(range(400)), width=8)
    values = torch.cat([g.flatten() for g in noisy.values()])
    assert values.std().item() == pytest.approx(2.0 * 0.5 / 8, rel=0.01)
    assert abs(values.mean().item()) < 1e-3
    again = step.noisy_gradients({k: v[:2] for k, v in zero.items()}, [0, 1], width=8)
    other = step.noisy_gradients({k: v[:2] for k, v in zero.items()}, [1, 0], width=8)
    for k in zero:
        assert torch.equal(again[k], noisy[k][:2])  # a key draws the same noise wherever it is used
        assert torch.equal(other[k][0], noisy[k][1])


def test_samples_of_a_batch_get_distinct_dropout_keys():
    keys = sample_keys(torch.tensor(12345), 64)
    assert len(set(keys.tolist())) == 64 and bool((keys >= 0).all())


def config(out, algorithm: str = "fedavg", sample: dict[str, Any] | None = None, **extra: Any) -> dict:
    raw = tiny(algorithm, out)
    if algorithm in ("fedavg", "gossip"):
        raw["algorithm"].update(batch_size=10)  # 60 samples a client: every batch full
    if sample is not None:
        raw["privacy"] = {"sample": sample, **extra}
    return raw


def trained(raw: dict[str, Any], executor: str, rounds: int = 2):
    built = build_run(fedge.resolve_config({**raw, "engine": {"executor": executor}}))
    losses = [built.algorithm.run_round(t)["train_loss"] for t in range(1, rounds + 1)]
    return built, losses


def model_of(built) -> dict[str, torch.Tensor]:
    algorithm = built.algorithm
    return {k: v.clone() for k, v in algorithm.params.items()} if hasattr(algorithm, "params") else {}


NOISY = {"clip": 0.5, "noise_multiplier": 1.0}


@pytest.mark.parametrize("algorithm", ["fedavg", "hfedavg", "hist", "gossip", "ditto"])
def test_both_executors_agree_with_seeded_noise(tmp_path, algorithm):
    raw = config(tmp_path, algorithm, NOISY)
    (seq, seq_losses), (bat, bat_losses) = (trained(raw, ex) for ex in ("sequential", "batched"))
    assert seq_losses == pytest.approx(bat_losses, abs=1e-5)
    seq_model, bat_model = model_of(seq), model_of(bat)
    for k in seq_model:
        torch.testing.assert_close(seq_model[k], bat_model[k], rtol=0, atol=1e-5)
    held_out = float(seq.algorithm.evaluate()["loss"])  # after Ditto's personal models, a fine-tune
    assert held_out == pytest.approx(float(bat.algorithm.evaluate()["loss"]), abs=1e-4)
    assert seq.context.privacy.ledger.releases == bat.context.privacy.ledger.releases
    _, plain_losses = trained(config(tmp_path, algorithm), "sequential")
    assert abs(seq_losses[1] - plain_losses[1]) > 1e-4  # the noise changed the training


def test_dropout_masks_are_keyed_per_sample_and_agree_across_executors(tmp_path):
    raw = config(tmp_path, "fedavg", NOISY)
    raw["model"] = {"name": "fcnn", "options": {"dropout": 0.5}}
    (seq, seq_losses), (bat, bat_losses) = (trained(raw, ex) for ex in ("sequential", "batched"))
    assert seq_losses == pytest.approx(bat_losses, abs=1e-5)
    for k, v in model_of(seq).items():
        torch.testing.assert_close(v, model_of(bat)[k], rtol=0, atol=1e-5)


@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_a_huge_clip_without_noise_trains_as_the_non_private_run(tmp_path, executor):
    plain, plain_losses = trained(config(tmp_path), executor)
    private, losses = trained(config(tmp_path, sample={"clip": 1e9, "noise_multiplier": 0.0}), executor)
    assert losses == pytest.approx(plain_losses, abs=1e-6)
    for k, v in model_of(plain).items():
        torch.testing.assert_close(model_of(private)[k], v, rtol=0, atol=1e-6)


def test_the_run_reports_sample_epsilon_from_the_cli(tmp_path):
    raw = config(tmp_path, sample=NOISY)
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(raw))
    outcome = invoke(["run", str(path)])
    assert outcome.code == 0, outcome.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    # 60 samples in batches of 10, one epoch a round: each sample released once a round, 2 rounds
    shape = Release(1, "gradient", "sample", "gaussian", 1.0, 0.5).shape()
    assert summary["privacy"]["epsilon_by_unit"]["sample"] == pytest.approx(epsilon({shape: 2}, 1e-5))
    assert summary["privacy"]["releases_by_kind"] == {"gradient": 8}  # 4 clients, 2 rounds
    assert summary["epsilon"] == summary["privacy"]["epsilon_by_unit"]["sample"]


def test_the_releases_count_each_samples_uses_in_the_round(tmp_path):
    raw = config(tmp_path, sample=NOISY)
    raw["algorithm"].update(local_epochs=3)
    built, _ = trained(raw, "batched", rounds=1)
    assert {r.count for r in built.context.privacy.ledger.releases} == {3}
    assert {r.clients for r in built.context.privacy.ledger.releases} == {(0,), (1,), (2,), (3,)}


def test_target_epsilon_calibrates_the_multiplier(tmp_path):
    raw = config(tmp_path, sample={"clip": 1.0}, target_epsilon=3.0)
    built, _ = trained(raw, "batched")
    summary = built.context.privacy.ledger.summary()
    assert summary["epsilon"] == pytest.approx(3.0, rel=1e-3)
    assert built.context.privacy.calibrated > 1.0


def test_batch_norm_is_refused_naming_the_key(tmp_path):
    raw = config(tmp_path, sample=NOISY)
    raw["model"] = {"name": "vgg", "options": {"batch_norm": True}}
    raw["data"]["shape"] = [3, 32, 32]
    with pytest.raises(ConfigError, match="privacy.sample"):
        build_run(fedge.resolve_config(raw))


def test_an_unset_multiplier_without_a_target_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="privacy.sample.noise_multiplier"):
        build_run(fedge.resolve_config(config(tmp_path, sample={"clip": 1.0})))


def test_centralized_training_without_a_dp_sgd_step_refuses_it(tmp_path):
    with pytest.raises(ConfigError, match="privacy.sample"):
        build_run(fedge.resolve_config(config(tmp_path, "centralized", NOISY)))


def test_the_pure_form_equals_the_in_place_step_and_leaves_its_inputs():
    model = MODELS["mlp"]()
    step = PrivateStep(dp_step(model, 1.0).loss_fn, SGD(momentum=0.9), mechanism(0.2, 1.0))
    params = parameters_of(model)
    state = step.optimizer.init(params)
    before = {k: v.clone() for k, v in params.items()}
    x, y, keys = torch.randn(4, 1, 8, 8), torch.randint(0, 3, (4,)), torch.tensor([99, -1])
    new_params, _, _, loss = step(params, {}, state, x, y, torch.ones(4), 0.1, keys, 8)
    assert all(torch.equal(params[k], before[k]) for k in params)
    loss_in_place = step.step_(params, {}, state, x, y, torch.ones(4), 0.1, keys, 8, False)
    assert float(loss) == float(loss_in_place)
    assert all(torch.equal(params[k], new_params[k]) for k in params)
    assert not all(torch.equal(params[k], before[k]) for k in params)


def small_cnn() -> nn.Module:
    """A conv chain off LeNet-5's beaten path: strides, padding, dilation, a bias-free convolution, a
    3 x 3 pooling (PyTorch's kernel, not the three maxima), a 2 x 2 one on an odd map."""
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=1, padding=1),
        nn.Sequential(nn.Conv2d(4, 5, 2, dilation=2, bias=False), nn.MaxPool2d(2), nn.ReLU()),
        nn.Flatten(),
        nn.Linear(5 * 2 * 2, 6),
        nn.ReLU(),
        nn.Linear(6, 3),
    )


CHAINS = {
    "mlp": (lambda: build_model("mlp", (1, 6, 6), 3, hidden=(16, 8)), (1, 6, 6)),
    "lenet5": (lambda: build_model("lenet5", (1, 28, 28), 3), (1, 28, 28)),
    "small_cnn": (small_cnn, (2, 13, 13)),
}


def stacked(model: nn.Module, rows: int) -> dict[str, torch.Tensor]:
    """``rows`` clients' copies of ``model``'s parameters, each a little different."""
    return {k: v[None] + 0.05 * torch.randn(rows, *v.shape) for k, v in parameters_of(model).items()}


@pytest.mark.parametrize("name", list(CHAINS))
def test_the_chain_kernel_without_vmap_equals_the_per_sample_path(name):
    torch.manual_seed(1)
    build, shape = CHAINS[name]
    model = build()
    step = make_step(classification_loss(model), SGD(momentum=0.9))
    private = PrivateStep(step.loss_fn, step.optimizer, mechanism(0.3, 1.0))
    rows, batch = 3, 5
    params = stacked(model, rows)
    other = {k: v.clone() for k, v in params.items()}
    states = [private.optimizer.init(p) for p in (params, other)]
    x, y = torch.randn(rows, batch, *shape), torch.randint(0, 3, (rows, batch))
    weight = torch.ones(rows, batch)
    weight[2, 3:] = 0.0  # a short batch: its padding adds nothing on either path
    keys = torch.tensor([[11, -1], [12, -1], [13, -1]])
    kernel = private_chain_kernel(private, shape, list(params))
    assert isinstance(kernel, PrivateChainKernel)
    for _ in range(2):
        loss = kernel(params, {}, states[0], x, y, weight, 0.1, keys)
        reference = PrivateKernel(private)(other, {}, states[1], x, y, weight, 0.1, keys)
        torch.testing.assert_close(loss, reference, rtol=0, atol=1e-6)
    for k in params:
        torch.testing.assert_close(params[k], other[k], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["lenet5", "small_cnn"])
def test_the_chain_kernels_clipped_sums_equal_opacus(name):
    torch.manual_seed(2)
    build, shape = CHAINS[name]
    model = build()
    clip, batch = 0.05, 6  # the clip below every sample's norm: every gradient is scaled
    step = make_step(classification_loss(model), SGD())
    kernel = private_chain_kernel(
        PrivateStep(step.loss_fn, SGD(), mechanism(clip)), shape, parameters_of(model)
    )
    assert kernel is not None
    before = {k: v[None].clone() for k, v in parameters_of(model).items()}
    params = {k: v.clone() for k, v in before.items()}
    x, y = torch.randn(1, batch, *shape), torch.randint(0, 3, (1, batch))
    kernel(params, {}, {}, x, y, torch.ones(1, batch), 1.0, torch.tensor([[0, -1]]))
    expected = opacus_clipped(model, x[0], y[0], clip)
    for k in params:  # plain SGD at lr 1 without noise: the step is the clipped sum over the batch size
        total = sum(e[k] for e in expected)
        torch.testing.assert_close((before[k] - params[k])[0] * batch, total, rtol=0, atol=1e-6)


def test_the_batched_executor_takes_the_chain_kernel_unless_fused_is_off():
    model = build_model("lenet5", (1, 28, 28), 3)
    step = dp_step(model, 1.0)
    trained = parameters_of(model)
    kernel = BatchedExecutor()._kernel(step, False, (1, 28, 28), trained)
    assert isinstance(kernel, PrivateChainKernel)
    assert kernel.per_sample == (
        "conv1.conv.weight",
        "conv1.conv.bias",
        "conv2.conv.weight",
        "conv2.conv.bias",
    )
    assert isinstance(BatchedExecutor(fused=False)._kernel(step, False, (1, 28, 28), trained), PrivateKernel)
    other = dp_step(group_norm_cnn(), 1.0)  # GroupNorm is not in a chain: per-sample gradients by vmap
    assert isinstance(
        BatchedExecutor()._kernel(other, False, (1, 8, 8), parameters_of(other.loss_fn.model)), PrivateKernel
    )


def test_what_is_not_a_chain_keeps_the_vmap_path():
    def chain(*layers: nn.Module, shape: tuple[int, ...] = (2, 6, 6)):
        return chain_layers(nn.Sequential(*layers), shape)

    head = (nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    assert chain(nn.Conv2d(2, 3, 3), nn.Dropout(0.0), nn.Identity(), *head) is not None
    assert chain(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4 * 4 * 4, 2)) is None
    assert chain(nn.Conv2d(2, 3, 3, padding="same"), nn.Flatten(), nn.Linear(3 * 6 * 6, 2)) is None
    assert chain(nn.Conv2d(2, 3, 3, padding_mode="reflect"), *head) is None
    assert chain(nn.Conv2d(2, 3, 3), nn.Tanh(), *head) is None
    assert chain(nn.Conv2d(2, 3, 3), nn.Dropout(0.5), *head) is None
    assert chain(nn.Linear(6, 2)) is None  # a Linear on an image's rows
    assert chain(nn.Conv2d(2, 3, 3)) is None  # no flat logits
    assert chain(nn.Flatten(), nn.Linear(72, 2)) is not None
    assert chain(nn.Linear(6, 2), shape=(6,)) is not None


def test_a_lenet5_run_agrees_across_executors_and_with_fused_off(tmp_path):
    raw = config(tmp_path, "fedavg", NOISY)
    raw["model"] = {"name": "lenet5"}
    raw["data"]["shape"] = [1, 28, 28]
    raw["partition"]["num_clients"] = CPU_CHAIN_CLIENTS + 2  # two chunks of the chain kernel
    raw["data"]["num_train"] = 20 * raw["partition"]["num_clients"]
    (seq, seq_losses), (bat, bat_losses) = (trained(raw, ex, rounds=1) for ex in ("sequential", "batched"))
    unfused = build_run(fedge.resolve_config({**raw, "engine": {"executor": "batched", "fused": False}}))
    unfused_losses = [unfused.algorithm.run_round(1)["train_loss"]]
    assert bat_losses == pytest.approx(seq_losses, abs=1e-5)
    assert bat_losses == pytest.approx(unfused_losses, abs=1e-5)
    for k, v in model_of(seq).items():
        torch.testing.assert_close(model_of(bat)[k], v, rtol=0, atol=1e-5)
        torch.testing.assert_close(model_of(unfused)[k], v, rtol=0, atol=1e-5)
