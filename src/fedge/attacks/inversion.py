"""Input reconstruction from split learning's smashed data by a curious server.

Papers. He, Zhang & Lee, "Model inversion attacks against collaborative inference" (ACSAC 2019), set
out three settings against a model cut between a client and a server: white-box (the server knows the
client part's weights and solves a regularised maximum-likelihood problem for the input), query-free
black-box, and query access (the server trains an inverse network). Pasquini, Ateniese & Bernaschi,
"Unleashing the tiger" (CCS 2021), show how much a server learns from auxiliary data drawn from the
clients' distribution. Erdoğan, Küpçü & Çiçek, "UnSplit" (WPES 2022), optimise the input by gradient
descent on the distance between its smashed data and the observed one (they also search the client
weights; here the weights are known).

Threat model. The attacker is the server of a split (or SplitFed) run, honest but curious: it follows
the protocol and sees every smashed batch ``z = f(x)`` the clients send. It knows the client part
``f``: its weights (in SplitFed the fed server averages them, so they pass through the server side) or
at least query access to it. For :func:`train_decoder` it also holds auxiliary inputs from the same
distribution as the clients' data; :func:`invert_by_optimisation` needs no data, only ``f`` itself.

Success metric. PSNR and SSIM (:mod:`fedge.attacks.metrics`) of each reconstruction against the input
it came from, averaged over the batch (:func:`reconstruction_figures`); the smashed data keeps the
order of the inputs, so no matching is needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from fedge.attacks.metrics import psnr, reads_as_image, ssim, total_variation

Encode = Callable[[torch.Tensor], torch.Tensor]


def _check_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    low, high = float(bounds[0]), float(bounds[1])
    if not low < high:
        raise ValueError(f"bounds must be (low, high) with low < high, got {bounds}")
    return low, high


def _seeded_linear(fan_in: int, fan_out: int, generator: torch.Generator) -> nn.Linear:
    """A linear layer with PyTorch's default initialisation, drawn from ``generator``."""
    layer = nn.Linear(fan_in, fan_out)
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
    nn.init.uniform_(layer.bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in), generator=generator)
    return layer


class Decoder(nn.Module):
    """Smashed data back to inputs: standardise the flattened ``z`` (with the auxiliary data's statistics,
    since smashed features come in any scale), an MLP ``z -> hidden -> hidden -> x``, and a sigmoid
    scaled into ``bounds`` reshaped to the input shape.

    A flattening MLP fits every cut (dense or convolutional smashed data, any input shape) with one
    design; the squashed output never leaves the inputs' range, so no capacity is spent there and
    training stays stable. A convolutional decoder would do better on large images, so the PSNR it
    reaches is a lower bound on what the smashed data leaks.
    """

    z_mean: torch.Tensor
    z_std: torch.Tensor

    def __init__(
        self,
        z_mean: torch.Tensor,
        z_std: torch.Tensor,
        x_shape: tuple[int, ...],
        bounds: tuple[float, float],
        hidden: int,
        generator: torch.Generator,
    ):
        super().__init__()
        self.register_buffer("z_mean", z_mean)
        self.register_buffer("z_std", z_std)
        self.x_shape = x_shape
        self.low, self.high = bounds
        width = z_mean.numel()
        self.net = nn.Sequential(
            _seeded_linear(width, hidden, generator),
            nn.ReLU(),
            _seeded_linear(hidden, hidden, generator),
            nn.ReLU(),
            _seeded_linear(hidden, math.prod(x_shape), generator),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = (z.flatten(1) - self.z_mean) / self.z_std
        x = self.low + (self.high - self.low) * torch.sigmoid(self.net(h))
        return x.reshape(-1, *self.x_shape)


@torch.no_grad()
def _encode_all(encode: Encode, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    return torch.cat([encode(x[i : i + batch_size]).flatten(1) for i in range(0, len(x), batch_size)])


def train_decoder(
    encode: Encode,
    aux_x: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    bounds: tuple[float, float],
    hidden: int = 512,
) -> nn.Module:
    """Train a :class:`Decoder` from ``encode(aux_x)`` back to ``aux_x`` (mean squared error, Adam,
    batches shuffled by ``generator``): the learned inverse of the client part."""
    low, high = _check_bounds(bounds)
    if aux_x.dim() < 2 or len(aux_x) < 2:
        raise ValueError(f"aux_x must be a batch of at least two inputs, got shape {tuple(aux_x.shape)}")
    if epochs < 1 or batch_size < 1 or hidden < 1 or lr <= 0:
        raise ValueError("epochs, batch_size and hidden must be positive integers and lr positive")
    x = aux_x.detach().float()
    z = _encode_all(encode, x, batch_size).float()
    decoder = Decoder(z.mean(0), z.std(0).clamp_min(1e-6), tuple(x.shape[1:]), (low, high), hidden, generator)
    optimiser = torch.optim.Adam(decoder.parameters(), lr=lr)
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            loss = (decoder(z[batch]) - x[batch]).pow(2).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return decoder.eval()


@torch.no_grad()
def decode(decoder: nn.Module, z: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """The decoder's reconstructions of the smashed batch ``z``, ``batch_size`` at a time."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    return torch.cat([decoder(z[i : i + batch_size]) for i in range(0, len(z), batch_size)])


def invert_by_optimisation(
    encode: Encode,
    z: torch.Tensor,
    x_shape: tuple[int, ...],
    *,
    steps: int,
    lr: float,
    tv_weight: float,
    bounds: tuple[float, float],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The inputs whose smashed data is closest to ``z``: minimise each sample's ``||encode(x) - z||^2``
    plus ``tv_weight`` times its total variation (images only) with Adam, ``x`` clamped into ``bounds``
    after every step. It starts from a constant mid-range input, or from uniform noise drawn from
    ``generator`` when one is given."""
    low, high = _check_bounds(bounds)
    if steps < 1 or lr <= 0 or tv_weight < 0:
        raise ValueError("steps must be positive, lr positive and tv_weight non-negative")
    target = z.detach().float()
    shape = (len(target), *x_shape)
    if generator is None:
        start = torch.full(shape, (low + high) / 2)
    else:
        start = low + (high - low) * torch.rand(shape, generator=generator)
    x = start.requires_grad_(True)
    use_tv = tv_weight > 0 and reads_as_image(tuple(x_shape))
    optimiser = torch.optim.Adam([x], lr=lr)
    for _ in range(steps):
        loss = (encode(x) - target).flatten(1).pow(2).sum(1)
        if use_tv:
            loss = loss + tv_weight * total_variation(x)
        optimiser.zero_grad()
        loss.sum().backward()  # a sum of per-sample losses: each sample's step is its own
        optimiser.step()
        with torch.no_grad():
            x.clamp_(low, high)
    return x.detach()


def reconstruction_figures(
    original: torch.Tensor, reconstructed: torch.Tensor, data_range: float
) -> dict[str, float]:
    """Mean PSNR (dB) and SSIM of ``reconstructed`` against ``original``, image by image."""
    if original.shape != reconstructed.shape:
        raise ValueError(f"shapes differ: {tuple(original.shape)} and {tuple(reconstructed.shape)}")
    return {
        "psnr": float(psnr(original, reconstructed, data_range).mean()),
        "ssim": float(ssim(original, reconstructed, data_range).mean()),
    }
