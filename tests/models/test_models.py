"""The model zoo: the papers' parameter counts, cuts, aux heads, option checking and vmap-readiness."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from fedge.errors import ConfigError
from fedge.models import (
    MODELS,
    aux_head,
    build_model,
    count_parameters,
    model_cut_points,
    model_descriptions,
    output_shape,
    split,
)

# Small inputs (and small widths) so every zoo model runs in milliseconds.
SMALL = {
    "mlp": ((1, 8, 8), {"hidden": [16, 8]}),
    "fcnn": ((1, 8, 8), {}),
    "lenet5": ((1, 16, 16), {}),
    "cnn2": ((1, 16, 16), {}),
    "cnn4": ((3, 16, 16), {}),
    "resnet18": ((3, 8, 8), {"width": 4}),
    "vgg": ((1, 8, 8), {"depth": 11, "width": 0.125}),
    "cse_cifar": ((3, 8, 8), {}),
    "cse_femnist": ((1, 8, 8), {"dropout": False}),
    "cifar_cnn": ((3, 8, 8), {"dropout": 0.0}),
    "gpt2": ((8,), {"layers": 2, "hidden": 16, "heads": 2, "lora_rank": 0}),  # token sequences
    "llama": ((8,), {"layers": 2, "hidden": 16, "heads": 2, "lora_rank": 0}),
    "bert": ((8,), {"layers": 2, "hidden": 16, "heads": 2, "lora_rank": 0}),
}
TOKEN_MODELS = {"gpt2", "llama", "bert"}  # inputs are token ids (vocabulary = the 5 classes)


def small_model(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    shape, options = SMALL[name]
    return build_model(name, shape, 5, **options)


def small_batch(name: str, size: int = 4) -> torch.Tensor:
    if name in TOKEN_MODELS:
        return torch.randint(0, 5, (size, *SMALL[name][0]))
    return torch.randn(size, *SMALL[name][0])


def test_every_zoo_model_has_a_small_case() -> None:
    assert set(SMALL) == set(MODELS)


@pytest.mark.parametrize(
    ("name", "shape", "classes", "client", "server", "smashed"),
    [
        ("cse_cifar", (3, 24, 24), 10, 107_328, 960_970, (64, 6, 6)),
        ("cse_femnist", (1, 28, 28), 62, 18_816, 1_187_774, (64, 12, 12)),
    ],
)
def test_cse_fsl_split_models_match_the_paper(name, shape, classes, client, server, smashed) -> None:
    model = build_model(name, shape, classes)
    client_part, server_part = split(model, model.default_cut)
    assert (count_parameters(client_part), count_parameters(server_part)) == (client, server)
    assert output_shape(client_part, shape) == smashed


def test_cse_femnist_conv_relu_flag_changes_activations_not_counts() -> None:
    x = torch.randn(3, 1, 28, 28)
    outputs = {}
    for relu in (True, False):
        model = build_model("cse_femnist", (1, 28, 28), 62, conv_relu=relu).eval()
        assert count_parameters(model) == 1_206_590
        outputs[relu] = split(model, 2)[0](x)
    assert outputs[True].min() >= 0
    assert outputs[False].min() < 0


def test_cse_femnist_dropout_flag() -> None:
    with_dropout = build_model("cse_femnist", (1, 28, 28), 62)
    without = build_model("cse_femnist", (1, 28, 28), 62, dropout=False)
    rates = sorted(m.p for m in with_dropout.modules() if isinstance(m, nn.Dropout))
    assert rates == [0.25, 0.5]
    assert not any(isinstance(m, nn.Dropout) for m in without.modules())


@pytest.mark.parametrize(
    ("name", "params", "fc_params"),
    [("fcnn", 238_510, 238_510), ("lenet5", 44_426, 41_854)],
)
def test_hist_models_match_the_spec(name, params, fc_params) -> None:
    model = build_model(name, (1, 28, 28), 10)
    linear = sum(count_parameters(m) for m in model.modules() if isinstance(m, nn.Linear))
    assert (count_parameters(model), linear) == (params, fc_params)


@pytest.mark.parametrize(("name", "rate"), [("fcnn", 0.5), ("lenet5", 0.3)])
def test_dropout_option_adds_layers_without_parameters(name, rate) -> None:
    plain = build_model(name, (1, 28, 28), 10)
    dropped = build_model(name, (1, 28, 28), 10, dropout=rate)
    assert count_parameters(plain) == count_parameters(dropped)
    assert not any(isinstance(m, nn.Dropout) for m in plain.modules())
    assert any(isinstance(m, nn.Dropout) and m.p == rate for m in dropped.modules())


@pytest.mark.parametrize(
    ("name", "shape", "flatten"),
    [("cnn2", (1, 28, 28), 1024), ("cnn4", (3, 32, 32), 1600), ("cnn4", (1, 28, 28), 1024)],
)
def test_afind_cnn_flatten_sizes(name, shape, flatten) -> None:
    model = build_model(name, shape, 10)
    first_linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
    assert first_linear.in_features == flatten


def test_vgg19_cuts_match_light_fedsl() -> None:
    with torch.device("meta"):
        model = build_model("vgg", (3, 32, 32), 10)
    assert model.default_cut == 8
    assert model.cut_points == list(range(1, 17))
    for cut, activations, conv_weights in [(4, 8192, 259_776), (8, 4096, 2_324_160), (12, 2048, 10_581_696)]:
        client, _ = split(model, cut)
        assert math.prod(output_shape(client, (3, 32, 32))) == activations
        weights = sum(p.numel() for n, p in client.named_parameters() if n.endswith("conv.weight"))
        assert weights == conv_weights


def test_vgg_skips_pools_below_one_pixel_and_scales_width() -> None:
    model = build_model("vgg", (1, 8, 8), 10, depth=19, width=0.25)
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 3
    assert model[-1].linear.in_features == 128
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_resnet18_stages_are_blocks() -> None:
    model = build_model("resnet18", (3, 32, 32), 100)
    assert model.block_names == ["stem", "layer1", "layer2", "layer3", "layer4", "out"]
    assert count_parameters(model) == 11_220_132
    assert isinstance(model.get_submodule("layer4.1.conv2"), nn.Conv2d)


@pytest.mark.parametrize(
    ("in_shape", "classes", "kind", "channels", "params"),
    [
        ((64, 6, 6), 10, "linear", None, 23_050),
        ((64, 6, 6), 10, "cnn_mlp", 54, 22_960),
        ((64, 6, 6), 10, "cnn_mlp", 27, 11_485),
        ((64, 6, 6), 10, "cnn_mlp", 14, 5_960),
        ((64, 6, 6), 10, "cnn_mlp", 7, 2_985),
        ((64, 12, 12), 62, "linear", None, 571_454),
        ((64, 12, 12), 62, "cnn_mlp", 64, 575_614),
        ((64, 12, 12), 62, "cnn_mlp", 32, 287_838),
        ((64, 12, 12), 62, "cnn_mlp", 8, 72_006),
        ((64, 12, 12), 62, "cnn_mlp", 2, 18_048),
    ],
)
def test_aux_heads_match_cse_fsl_tables(in_shape, classes, kind, channels, params) -> None:
    head = aux_head(kind, in_shape, classes, channels=channels)
    assert count_parameters(head) == params
    assert head(torch.randn(3, *in_shape)).shape == (3, classes)


def test_mlp_aux_head() -> None:
    head = aux_head("mlp", (16,), 10, hidden=32)
    assert count_parameters(head) == 16 * 32 + 32 + 32 * 10 + 10
    assert head(torch.randn(2, 16)).shape == (2, 10)


@pytest.mark.parametrize(
    ("kind", "in_shape", "settings", "key"),
    [
        ("mlp", (64, 6, 6), {}, "model.aux.hidden"),
        ("cnn_mlp", (64, 6, 6), {}, "model.aux.channels"),
        ("cnn_mlp", (2304,), {"channels": 8}, "model.aux.kind"),
        ("linear", (64, 6, 6), {"hidden": 8}, "model.aux.hidden"),
        ("conv", (64, 6, 6), {}, "model.aux.kind"),
    ],
)
def test_aux_head_errors_name_the_key(kind, in_shape, settings, key) -> None:
    with pytest.raises(ConfigError) as error:
        aux_head(kind, in_shape, 10, **settings)
    assert error.value.key == key


@pytest.mark.parametrize("name", sorted(SMALL))
def test_split_composes_to_the_whole_model_at_every_cut(name) -> None:
    model = small_model(name).eval()
    x = small_batch(name)
    whole = model(x)
    for cut in model.cut_points:
        client, server = split(model, cut)
        assert len(client) == cut and len(client) + len(server) == len(model)
        shared = [*client.parameters(), *server.parameters()]
        assert all(a is b for a, b in zip(shared, model.parameters(), strict=True))
        torch.testing.assert_close(server(client(x)), whole, rtol=0, atol=0)


@pytest.mark.parametrize("cut", [0, 5, -1])
def test_split_rejects_cuts_outside_the_model(cut) -> None:
    model = build_model("lenet5", (1, 28, 28), 10)
    with pytest.raises(ConfigError, match=r"valid cuts are 1\.\.4 for lenet5") as error:
        split(model, cut)
    assert error.value.key == "model.cut"


@pytest.mark.parametrize(
    ("name", "shape", "options", "key", "text"),
    [
        ("alexnet", (3, 32, 32), {}, "model.name", "unknown model 'alexnet'; known: mlp,"),
        ("vgg", (3, 32, 32), {"dpth": 19}, "model.options.dpth", "unknown option for vgg; known: depth,"),
        ("cnn2", (1, 28, 28), {"width": 2}, "model.options.width", "known: none"),
        ("vgg", (3, 32, 32), {"depth": 17}, "model.options.depth", "got 17"),
        ("fcnn", (1, 28, 28), {"dropout": 1.5}, "model.options.dropout", "got 1.5"),
        ("mlp", (1, 8, 8), {"hidden": [8, 0]}, "model.options.hidden", "greater than 0"),
        ("resnet18", (3, 32, 32), {"width": "wide"}, "model.options.width", "got 'wide'"),
        ("lenet5", (1, 8, 8), {}, "model.name", "input [1, 8, 8] is too small for lenet5"),
        ("cnn4", (64,), {}, "model.name", "cnn4 needs image input [C, H, W]"),
    ],
)
def test_build_model_errors_name_the_key(name, shape, options, key, text) -> None:
    with pytest.raises(ConfigError) as error:
        build_model(name, shape, 10, **options)
    assert error.value.key == key
    assert text in str(error.value)


def test_options_are_coerced_from_config_values() -> None:
    model = build_model("mlp", (1, 8, 8), 10, hidden=[16, 8])
    assert model.block_names == ["fc1", "fc2", "out"]
    assert build_model("mlp", (64,), 10, hidden=[]).cut_points == []


def test_construction_draws_from_the_global_rng() -> None:
    first, again, other = small_model("cnn4", 1), small_model("cnn4", 1), small_model("cnn4", 2)
    for a, b in zip(first.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(next(first.parameters()), next(other.parameters()))


def test_listing_helpers() -> None:
    descriptions = model_descriptions()
    assert set(descriptions) == set(MODELS)
    assert all(text and "\n" not in text for text in descriptions.values())
    state = torch.random.get_rng_state()
    cuts = model_cut_points("cse_cifar", (3, 24, 24), 10)
    assert torch.equal(state, torch.random.get_rng_state())
    assert cuts == [(1, "conv1"), (2, "conv2"), (3, "fc1"), (4, "fc2")]


def test_output_shape_leaves_buffers_untouched() -> None:
    model = small_model("resnet18").train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert output_shape(split(model, 2)[0], (3, 8, 8)) == (4, 8, 8)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_vmap_functional_call_over_stacked_clients_matches_each_client(name, train) -> None:
    clients = [small_model(name, seed).train(train) for seed in (1, 2)]
    params, buffers = stack_module_state(clients)
    x = torch.stack([small_batch(name) for _ in clients])
    template = clients[0]

    def forward(p: dict, b: dict, inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(template, (p, b), (inputs,))

    batched = vmap(forward)(params, buffers, x)
    for i, client in enumerate(clients):
        torch.testing.assert_close(batched[i], client(x[i]))
        for key, buffer in client.named_buffers():
            torch.testing.assert_close(buffers[key][i], buffer)


def test_conv_blocks_pool_before_relu_with_the_same_values_and_gradients():
    from fedge.models.cnn import build_lenet5

    block = build_lenet5((1, 28, 28), 10).conv1
    assert list(block._modules) == ["conv", "pool", "relu"]
    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    paper_order = torch.nn.Sequential(block.conv, block.relu, block.pool)
    out, reference = block(x), paper_order(x)
    assert torch.equal(out, reference) and bool((reference == 0).any())  # some windows are all negative
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, [block.conv.weight, block.conv.bias], upstream)
    expected = torch.autograd.grad(paper_order(x), [block.conv.weight, block.conv.bias], upstream)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))
