"""Convolutions over stacked clients: one per client against PyTorch's grouped vmap rule.

    python -m benchmarks.conv --device cuda --clients 100 --batch 32

Times one training step's convolution work of LeNet-5's two convolutional layers (forward, and the
input and weight gradients) under ``torch.func.vmap`` with per-client weights, two ways:
:class:`fedge.engine.convolution.PerClientConv2d` (one kernel call per client, what the batched executor
uses on the devices of ``PER_CLIENT_DEVICES``) and plain ``F.conv2d`` (PyTorch's rule: one grouped
convolution over every client). It decides which devices get the per-client rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from benchmarks.measure import machine, median, timed
from fedge.engine.convolution import PerClientConv2d

# LeNet-5's convolutions on 1 x 28 x 28 input: (in channels, out channels, kernel, padding, input side)
LAYERS = ((1, 6, 5, 2, 28), (6, 16, 5, 0, 14))


def _conv(per_client: bool) -> Callable[..., torch.Tensor]:
    if per_client:
        return lambda x, w, b, pad: PerClientConv2d.apply(x, w, b, (1, 1), (pad, pad), (1, 1), 1)
    return lambda x, w, b, pad: F.conv2d(x, w, b, padding=pad)


def step_seconds(device: torch.device, clients: int, batch: int, per_client: bool, repeats: int) -> float:
    """Median seconds of the vmapped forward and backward of both layers over ``clients`` clients."""
    gen = torch.Generator(device=device).manual_seed(0)
    conv = _conv(per_client)
    cases = []
    for c_in, c_out, k, pad, side in LAYERS:
        x = torch.randn(clients, batch, c_in, side, side, device=device, generator=gen, requires_grad=True)
        w = torch.randn(clients, c_out, c_in, k, k, device=device, generator=gen)
        b = torch.randn(clients, c_out, device=device, generator=gen)
        cases.append((x, w, b, pad))

    def loss(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, pad: int) -> torch.Tensor:
        return conv(x, w, b, pad).square().sum()

    gradient = vmap(grad(loss, argnums=(0, 1, 2)), in_dims=(0, 0, 0, None))

    def run() -> None:
        for x, w, b, pad in cases:
            gradient(x, w, b, pad)

    for _ in range(2):
        run()
    return median([timed(run, device) for _ in range(repeats)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.conv", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.clients < 1 or args.batch < 1 or args.repeats < 1:
        parser.error("--clients, --batch and --repeats must be >= 1")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    per_client = step_seconds(device, args.clients, args.batch, True, args.repeats)
    grouped = step_seconds(device, args.clients, args.batch, False, args.repeats)
    report = {
        "machine": machine(device),
        "clients": args.clients,
        "batch": args.batch,
        "per_client_seconds": per_client,
        "grouped_seconds": grouped,
        "grouped_over_per_client": grouped / per_client,
    }
    print(json.dumps(report, indent=2))
    faster = "per-client" if per_client < grouped else "grouped"
    summary = f"per-client {per_client * 1e3:.2f} ms, grouped {grouped * 1e3:.2f} ms: {faster}"
    print(f"{device}: {summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
