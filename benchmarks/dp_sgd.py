"""W10: DP-SGD in every local step, fedge's batched executor against a per-client Opacus loop.

    python -m benchmarks.dp_sgd                       # 100 clients, 96 MNIST samples each, 3 steps
    python -m benchmarks.dp_sgd --samples 600 --models mlp

One FedAvg round of ``--clients`` clients on an MNIST subset (``--samples`` a client, batches of
``--batch``, one local epoch), every local step DP-SGD (clip ``--clip``, noise multiplier ``--noise``),
on the MNIST MLP (784-200-10) and LeNet-5, timed three ways in one process on one thread:

* fedge, batched executor, ``privacy.sample`` on: for these chains of layers, without ``vmap(grad)``
  (:mod:`fedge.engine.private_chain`: one forward and one backward pass over every client's samples,
  per-sample norms of the ``Linear`` layers from activations and output gradients, per-sample
  convolution gradients by one grouped convolution backward, the clipped sums as weighted products);
* the same run without privacy (DP-SGD's overhead over non-private batched training);
* a per-client Opacus loop as a researcher would write it, made as fast as we could: one model wrapped
  once by ``PrivacyEngine.make_private`` (hooks installed once, never re-wrapped), each client loading
  the global weights into it and stepping through its batches (the same batches as fedge's plan) with
  Opacus's DP optimizer, the server averaging the trained states. Each of Opacus's per-sample modes
  (``--opacus-modes``: hooks, expanded weights ``ew``, ghost clipping ``ghost``) is timed and the
  fastest is the baseline (the last column names it and lists every mode's seconds).

After timing, both sides (Opacus in its fastest mode) run a round with noise 0 from the same weights
and the ``max diff`` column gives the largest difference of the averaged models (they agree to float
rounding: the same clipped gradients over the same batch size). Seconds are the median of ``--repeats``
rounds after a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

import fedge
from fedge.runner.loop import Built, build_run

MODELS = {"mlp": {"name": "mlp", "options": {"hidden": [200]}}, "lenet5": {"name": "lenet5"}}
OPACUS_MODES = ("hooks", "ew", "ghost")  # grad_sample_mode: hooks, expanded weights, ghost clipping


def config(model: str, args: argparse.Namespace, sample: dict[str, float] | None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "seed": 0,
        "rounds": 1,
        "data": {"name": "mnist", "train_limit": args.clients * args.samples, "test_limit": 100},
        "partition": {"kind": "iid", "num_clients": args.clients},
        "model": MODELS[model],
        "algorithm": {"name": "fedavg", "batch_size": args.batch, "optimizer": {"lr": 0.05}},
        "engine": {"executor": "batched", "threads": 1},
        "output": {"plots": False},
    }
    if sample is not None:
        raw["privacy"] = {"sample": sample}
    return raw


def built(model: str, args: argparse.Namespace, sample: dict[str, float] | None) -> Built:
    return build_run(fedge.resolve_config(config(model, args, sample)))


def fedge_round(run: Built, t: int) -> float:
    start = time.perf_counter()
    run.algorithm.run_round(t)
    return time.perf_counter() - start


class OpacusLoop:
    """FedAvg with Opacus's DP-SGD, client after client, on the fedge run's data and batch plans;
    ``mode``: Opacus's ``grad_sample_mode``."""

    def __init__(self, run: Built, clip: float, noise: float, mode: str = "hooks"):
        algorithm, cfg = run.algorithm, run.config.algorithm
        self.data, self.batch, self.lr = run.context.data, cfg.batch_size, cfg.optimizer.lr
        self.params = {k: v.clone() for k, v in algorithm.params.items()}
        model = run.context.build_model()
        model.load_state_dict(self.params, strict=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=self.lr)
        dummy = DataLoader(TensorDataset(self.data.x_train[:1], self.data.y_train[:1]), batch_size=self.batch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            private = PrivacyEngine().make_private(
                module=model,
                optimizer=optimizer,
                criterion=torch.nn.CrossEntropyLoss(),
                data_loader=dummy,
                noise_multiplier=noise,
                max_grad_norm=clip,
                poisson_sampling=False,
                grad_sample_mode=mode,
            )
        # ghost clipping's loss runs both of its backward passes; the other modes use the plain loss
        self.model, self.optimizer = private[0], private[1]
        self.loss = private[2] if mode == "ghost" else torch.nn.CrossEntropyLoss()
        self.optimizer.expected_batch_size = self.batch  # divide by B, as fedge does
        sizes = torch.as_tensor(self.data.client_sizes(), dtype=torch.float32)
        self.weights = sizes / sizes.sum()

    def round(self, t: int) -> float:
        clients = tuple(range(self.data.num_clients))
        plan = self.data.batch_plan(clients, t, 1, self.batch, False)
        start = time.perf_counter()
        inner = self.model._module
        total = {k: torch.zeros_like(v) for k, v in self.params.items()}
        for c in clients:
            with torch.no_grad():
                for name, p in inner.named_parameters():
                    p.copy_(self.params[name])
            for s in range(int(plan.steps[c])):
                idx = plan.client_batch(c, s)
                loss = self.loss(self.model(self.data.x_train[idx]), self.data.y_train[idx])
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, p in inner.named_parameters():
                    total[name].add_(p, alpha=float(self.weights[c]))
        self.params = total
        return time.perf_counter() - start


def agreement(model: str, args: argparse.Namespace, mode: str) -> float:
    """The largest difference of fedge's and Opacus's (``mode``) averaged models after a round with
    noise 0."""
    run = built(model, args, {"clip": args.clip, "noise_multiplier": 0.0})
    loop = OpacusLoop(run, args.clip, 0.0, mode)
    run.algorithm.run_round(1)
    loop.round(1)
    return max(float((run.algorithm.params[k] - v).abs().max()) for k, v in loop.params.items())


def measure(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Median seconds of fedge's private and non-private rounds and of the fastest Opacus mode's, that
    mode, and its agreement with fedge."""
    private = {"clip": args.clip, "noise_multiplier": args.noise}
    dp_run, plain_run = built(model, args, private), built(model, args, None)
    loops = {mode: OpacusLoop(dp_run, args.clip, args.noise, mode) for mode in args.opacus_modes}
    times: dict[str, list[float]] = {"fedge_dp": [], "fedge_plain": [], **{mode: [] for mode in loops}}
    for t in range(1, args.repeats + 2):
        rounds = {"fedge_dp": fedge_round(dp_run, t), "fedge_plain": fedge_round(plain_run, t)}
        rounds |= {mode: loop.round(t) for mode, loop in loops.items()}
        if t > 1:  # the first round warms up
            for name, seconds in rounds.items():
                times[name].append(seconds)
    out: dict[str, Any] = {k: statistics.median(v) for k, v in times.items()}
    out["mode"] = min(loops, key=lambda mode: out[mode])
    out["opacus"] = out[out["mode"]]
    out["agreement"] = agreement(model, args, out["mode"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--samples", type=int, default=96, help="MNIST samples per client")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--opacus-modes", nargs="+", default=list(OPACUS_MODES), choices=list(OPACUS_MODES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    steps = -(-args.samples // args.batch)
    print(f"W10: {args.clients} clients x {args.samples} MNIST samples, batch {args.batch}, {steps} steps")
    columns = ["fedge DP-SGD s", "Opacus loop s", "fedge speed-up", "fedge non-private s", "DP-SGD overhead"]
    print("| model | " + " | ".join(columns) + " | max diff (z=0) | Opacus mode (each mode's s) |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models:
        r = measure(model, args)
        modes = ", ".join(f"{mode} {r[mode]:.3f}" for mode in args.opacus_modes)
        print(
            f"| {model} | {r['fedge_dp']:.3f} | {r['opacus']:.3f} | {r['opacus'] / r['fedge_dp']:.2f}x | "
            f"{r['fedge_plain']:.3f} | {r['fedge_dp'] / r['fedge_plain']:.2f}x | {r['agreement']:.2e} | "
            f"{r['mode']} ({modes}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
