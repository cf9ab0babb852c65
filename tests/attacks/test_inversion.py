"""Input reconstruction from smashed data (fedge.attacks.inversion) on the 8x8 digits: a decoder trained
on auxiliary digits inverts the identity cut well, a moderate MLP client part less and a deep, strongly
compressing one least; white-box optimisation inverts an injective client part almost exactly; the
total-variation prior smooths images only; figures, batching, determinism and the errors people see."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from fedge.attacks.inversion import decode, invert_by_optimisation, reconstruction_figures, train_decoder

BOUNDS = (0.0, 1.0)
DECODER = {"epochs": 10, "batch_size": 64, "lr": 3e-3, "bounds": BOUNDS, "hidden": 256}


def seeded_mlp(widths: list[int], seed: int) -> nn.Module:
    """A frozen ReLU MLP client part with PyTorch's default initialisation drawn from ``seed``."""
    generator, layers = torch.Generator().manual_seed(seed), []
    for fan_in, fan_out in zip(widths, widths[1:], strict=False):
        layer = nn.Linear(fan_in, fan_out)
        nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
        nn.init.uniform_(layer.bias, -(fan_in**-0.5), fan_in**-0.5, generator=generator)
        layers += [layer, nn.ReLU()]
    return nn.Sequential(*layers).requires_grad_(False)


ENCODERS = {
    "identity": lambda x: x,  # cut 0: the server sees the inputs themselves
    "mlp": seeded_mlp([64, 32, 32], seed=0),  # two layers of moderate width
    "deep": seeded_mlp([64, 4, 4, 4, 4], seed=1),  # four layers, 64 pixels down to 4 features
}


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The auxiliary digits the server holds (the first 1,500) and the clients' (the other 297), in [0, 1]."""
    x = torch.tensor(load_digits().data / 16.0, dtype=torch.float32)
    return x[:1500], x[1500:]


@pytest.fixture(scope="module")
def decoder_psnr(digits) -> dict[str, float]:
    """Each client part's mean PSNR of the clients' digits decoded from their smashed data."""
    aux, private = digits
    figures = {}
    for name, encode in ENCODERS.items():
        decoder = train_decoder(encode, aux, generator=torch.Generator().manual_seed(0), **DECODER)
        figures[name] = reconstruction_figures(private, decode(decoder, encode(private)), 1.0)["psnr"]
    return figures


def test_decoder_inverts_the_identity_cut(decoder_psnr):
    assert decoder_psnr["identity"] > 20


def test_a_deep_compressing_client_part_leaks_clearly_less(decoder_psnr):
    assert decoder_psnr["identity"] - decoder_psnr["deep"] >= 6


def test_a_moderate_mlp_client_part_leaks_in_between(decoder_psnr):
    assert decoder_psnr["deep"] + 1 < decoder_psnr["mlp"] < decoder_psnr["identity"] - 1


def test_decoder_fits_any_smashed_and_input_shape_and_stays_in_bounds(digits):
    images = digits[0][:200].reshape(-1, 1, 8, 8)
    conv = nn.Conv2d(1, 3, 3, stride=2).requires_grad_(False)  # smashed data [N, 3, 3, 3]
    decoder = train_decoder(
        conv,
        images,
        epochs=1,
        batch_size=50,
        lr=1e-3,
        generator=torch.Generator(),
        bounds=(-1.0, 2.0),
        hidden=16,
    )
    out = decode(decoder, 100 * torch.randn(7, 3, 3, 3, generator=torch.Generator().manual_seed(1)))
    assert out.shape == (7, 1, 8, 8)
    assert out.min() >= -1 and out.max() <= 2


def test_decoder_training_is_deterministic_and_decoding_batches_alike(digits):
    aux = digits[0][:300]
    encode = ENCODERS["mlp"]
    first, second = (
        train_decoder(encode, aux, generator=torch.Generator().manual_seed(4), **DECODER) for _ in range(2)
    )
    z = encode(digits[1])
    assert torch.equal(decode(first, z), decode(second, z))
    assert torch.allclose(decode(first, z, batch_size=7), decode(first, z), atol=1e-6)


@pytest.mark.parametrize("shape", [(64,), (1, 8, 8)])
def test_optimisation_inverts_the_identity_cut_nearly_exactly(digits, shape):
    private = digits[1][:100].reshape(-1, *shape)
    recovered = invert_by_optimisation(
        lambda x: x,
        private,
        shape,
        steps=300,
        lr=0.05,
        tv_weight=1e-3,
        bounds=BOUNDS,
        generator=torch.Generator().manual_seed(0),
    )
    assert reconstruction_figures(private, recovered, 1.0)["psnr"] > 30


def test_optimisation_inverts_an_injective_client_part_of_non_image_inputs():
    encode = seeded_mlp([10, 40], seed=2)  # 10 features widened to 40: injective, TV does not apply
    x = torch.rand(50, 10, generator=torch.Generator().manual_seed(3))
    recovered = invert_by_optimisation(
        encode, encode(x), (10,), steps=300, lr=0.05, tv_weight=1.0, bounds=BOUNDS
    )
    without_tv = invert_by_optimisation(
        encode, encode(x), (10,), steps=300, lr=0.05, tv_weight=0.0, bounds=BOUNDS
    )
    assert torch.equal(recovered, without_tv)
    assert 10 * torch.log10(1 / (recovered - x).pow(2).mean()) > 30


def test_total_variation_smooths_image_reconstructions(digits):
    noisy = digits[1][:50] + 0.3 * torch.randn(50, 64, generator=torch.Generator().manual_seed(5))

    def roughness(x: torch.Tensor) -> float:
        images = x.reshape(-1, 8, 8)
        return float(images.diff(dim=1).abs().mean() + images.diff(dim=2).abs().mean())

    plain, smooth = (
        invert_by_optimisation(lambda x: x, noisy, (64,), steps=200, lr=0.05, tv_weight=w, bounds=BOUNDS)
        for w in (0.0, 50.0)
    )
    assert roughness(smooth) < 0.5 * roughness(plain)
    assert plain.min() >= 0 and plain.max() <= 1  # the noise leaves [0, 1]; the reconstruction does not


def test_figures_are_the_mean_psnr_and_ssim(digits):
    original = digits[1][:20]
    figures = reconstruction_figures(original, original + 0.1, 1.0)  # MSE 0.01 everywhere
    assert figures["psnr"] == pytest.approx(20.0, abs=1e-3)
    assert reconstruction_figures(original, original, 1.0)["ssim"] == pytest.approx(1.0)
    assert figures["ssim"] < 1


@pytest.mark.parametrize(
    "call",
    [
        lambda x: train_decoder(
            lambda t: t, x, epochs=0, batch_size=8, lr=1e-3, generator=torch.Generator(), bounds=BOUNDS
        ),
        lambda x: train_decoder(
            lambda t: t, x, epochs=1, batch_size=8, lr=1e-3, generator=torch.Generator(), bounds=(1.0, 0.0)
        ),
        lambda x: invert_by_optimisation(
            lambda t: t, x, (64,), steps=0, lr=0.1, tv_weight=0.0, bounds=BOUNDS
        ),
        lambda x: decode(nn.Identity(), x, batch_size=0),
        lambda x: reconstruction_figures(x, x[:1], 1.0),
    ],
)
def test_bad_input_is_refused_in_one_line(digits, call):
    with pytest.raises(ValueError, match=r"^[^\n]+$"):
        call(digits[1][:4])
