"""Benchmark W9: LoRA fine-tuning of a GPT-2-shaped model, every client's adapters over one frozen base.

    python -m benchmarks.llm --out llm.json            # W9: 32 clients, 6 blocks x 384, sequence 128
    python -m benchmarks.llm --quick --out llm.json    # a small version that runs in a minute on a CPU
    python -m benchmarks.llm --device cuda --gpt2-small --clients 100 --out llm.json

For FedAvg-LoRA and SplitFed v2 (cut after block 2), one round of the same clients on the same batches,
timed three ways, interleaved repeat by repeat: fedge's batched executor (the clients folded into one
plain batch over the shared base, every client's adapters as one batched product), fedge's sequential
executor, and a hand-written per-client loop as a researcher writes it with ``peft`` and ``torch.optim``
(one ``get_peft_model`` wrapper, the client's
adapters loaded with ``set_peft_model_state_dict``, plain autograd, PyTorch's own sdpa attention; for
SplitFed the loop cuts the forward pass at the block, passes the hidden states' gradient back by hand and
serves the clients' batches to the one server model step by step in client order, as fedge does).
Reported: median round seconds, ``speedup_vs_loop``, the round's executed FLOPs (counted on a real
training step by ``torch.utils.flop_counter``) per second against the measured matmul peak, and memory.
The peak is read before every timed repeat (a shared machine's speed drifts over the minutes a
measurement takes) and the fractions use the median of those readings.

Memory is measured in a fresh process per way (a process's resident peak only grows, and the three
ways share one here): the memory one round adds to what its built run holds (RSS sampled every
millisecond on a CPU, allocated bytes on a GPU). The loop trains one client at a time, so its round
adds one client's activations. The batched round is compared with W9's memory target, what it must
hold, base + clients x adapters + the activations of one chunk, the last taken as the clients the
executor trains at once times the loop's activations of one client: ``memory_ratio`` (base and
adapters are counted exactly, not measured).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
from pathlib import Path
from typing import Any

import torch
from torch.func import vmap
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.measure import RssSampler, machine, matmul_peak, median, rss_bytes, timed
from fedge.data.sources.text import STDLIB_MODULES
from fedge.engine import cross_entropy
from fedge.engine.host import configure_host
from fedge.runner.loop import Built, build_run
from fedge.runner.preflight import available_bytes

W9 = {"clients": 32, "layers": 6, "hidden": 384, "heads": 6, "seq_len": 128, "sequences": 16, "batch": 8}
QUICK = {"clients": 8, "layers": 3, "hidden": 128, "heads": 4, "seq_len": 64, "sequences": 8, "batch": 4}
GPT2_SMALL = {"layers": 12, "hidden": 768, "heads": 12}


def run_config(shape: dict[str, int], algorithm: str, executor: str, device: str) -> dict[str, Any]:
    """The fedge run of one workload: pystdlib text, one client per module, LoRA r = 8 on attention."""
    options = {"layers": shape["layers"], "hidden": shape["hidden"], "heads": shape["heads"], "lora_rank": 8}
    algo: dict[str, Any] = {"name": algorithm, "batch_size": shape["batch"], "optimizer": {"lr": 0.01}}
    if algorithm == "splitfed_v2":
        algo["clip_norm"] = None
    natural = shape["clients"] <= len(STDLIB_MODULES)  # one client per module, else iid over all of them
    modules_per_client = 1 if natural else shape["clients"] / len(STDLIB_MODULES)
    text_bytes = int(shape["sequences"] * shape["seq_len"] * modules_per_client / 0.8) + 2  # 20 % held out
    return {
        "seed": 0,
        "rounds": 1,
        "data": {"name": "pystdlib", "seq_len": shape["seq_len"], "text_bytes": text_bytes},
        "partition": {"kind": "natural" if natural else "iid", "num_clients": shape["clients"]},
        "model": {"name": "gpt2", "cut": 2, "options": options},
        "algorithm": algo,
        "engine": {"executor": executor, "device": device},
        "output": {"plots": False},
    }


class PeftLoop:
    """The hand-written baseline: one peft-wrapped GPT-2 (the same base weights), each client in turn."""

    def __init__(self, built: Built, algorithm: str, cut: int):
        import peft
        import transformers

        template = built.context.build_model()
        hf_config = template.config
        hf_config._attn_implementation = "sdpa"
        base = transformers.GPT2LMHeadModel(hf_config).to(built.context.device)
        self._copy_base(template, base)
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], lora_dropout=0.0,
                               fan_in_fan_out=True)  # fmt: skip
        self.model = peft.get_peft_model(base, lora)
        self.peft = peft
        self.built, self.algorithm, self.cut = built, algorithm, cut
        start = {peft_name(name): p.detach().clone() for name, p in template.named_parameters()}
        names = self.peft.get_peft_model_state_dict(self.model)
        self.global_state = {k: start[k].to(built.context.device) for k in names}

    @staticmethod
    def _copy_base(template: torch.nn.Module, base: torch.nn.Module) -> None:
        """The fedge model's frozen base weights into the transformers model (both from one config)."""
        blocks = list(template)
        body = base.transformer
        with torch.no_grad():
            body.wte.weight.copy_(blocks[0].embed.wte.weight)
            body.wpe.weight.copy_(blocks[0].embed.wpe.weight)
            for i, block in enumerate(blocks[:-1]):
                for name, tensor in _frozen_named(block.layer).items():
                    body.h[i].get_parameter(name).copy_(tensor)
            body.ln_f.weight.copy_(blocks[-1].norm.weight)
            body.ln_f.bias.copy_(blocks[-1].norm.bias)

    def _client_forward(self, ids: torch.Tensor) -> torch.Tensor:
        body = self.model.base_model.model.transformer
        hidden = body.wte(ids) + body.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in body.h[: self.cut]:
            hidden = block(hidden)
        return hidden[0] if isinstance(hidden, tuple) else hidden

    def _server_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        inner = self.model.base_model.model
        for block in inner.transformer.h[self.cut :]:
            hidden = block(hidden)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return inner.lm_head(inner.transformer.ln_f(hidden)).transpose(1, 2)

    def round(self, t: int) -> None:
        """One round: every client from the global adapters, its batches, then the average."""
        if self.algorithm == "splitfed_v2":
            self._split_round(t)
            return
        data = self.built.context.data
        clients = list(range(data.num_clients))
        plan = data.batch_plan(clients, t, 1, self.built.config.algorithm.batch_size)
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        sums = {k: torch.zeros_like(v) for k, v in self.global_state.items()}
        sizes = torch.as_tensor(data.client_sizes(clients), dtype=torch.float32)
        for c in clients:
            self.peft.set_peft_model_state_dict(self.model, self.global_state)
            params = dict(self.model.named_parameters())
            opt = torch.optim.SGD([params[n] for n in names], lr=0.01)
            for s in range(int(plan.steps[c])):
                idx = plan.client_batch(c, s)
                opt.zero_grad()
                logits = self._server_forward(self._client_forward(data.x_train[idx]))
                cross_entropy(logits, data.y_train[idx]).mean().backward()
                opt.step()
            state = self.peft.get_peft_model_state_dict(self.model)
            for k in sums:
                sums[k] += state[k].detach() * (sizes[c] / sizes.sum())
        self.global_state = sums

    def _split_round(self, t: int) -> None:
        """SplitFed v2's round: step by step, the clients' batches reach the one server model in row order
        (fedge's default ``server_order: round_robin``); each client's side keeps its own adapters, loaded
        into the model for its step; the hidden states go up, their gradient comes back by hand."""
        data = self.built.context.data
        clients = list(range(data.num_clients))
        plan = data.batch_plan(clients, t, 1, self.built.config.algorithm.batch_size)
        self.peft.set_peft_model_state_dict(self.model, self.global_state)
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        mine = [n for n in params if _block_index(n) < self.cut]
        opt = torch.optim.SGD([params[n] for n in mine], lr=0.01)  # plain SGD: no state to keep per client
        server_opt = torch.optim.SGD([p for n, p in params.items() if n not in mine], lr=0.01)
        local = [{n: params[n].detach().clone() for n in mine} for _ in clients]
        for s in range(int(plan.steps.max())):
            for c in clients:
                if s >= plan.steps[c]:
                    continue
                with torch.no_grad():
                    for n in mine:
                        params[n].copy_(local[c][n])
                idx = plan.client_batch(c, s)
                opt.zero_grad()
                server_opt.zero_grad()
                z = self._client_forward(data.x_train[idx])
                received = z.detach().requires_grad_(True)
                cross_entropy(self._server_forward(received), data.y_train[idx]).mean().backward()
                server_opt.step()
                z.backward(received.grad)
                opt.step()
                local[c] = {n: params[n].detach().clone() for n in mine}
        sizes = torch.as_tensor(data.client_sizes(clients), dtype=torch.float32)
        state = self.peft.get_peft_model_state_dict(self.model)  # the server side: the one model's
        for n in mine:
            key = n.replace(".default", "")
            state[key] = sum(local[c][n] * (sizes[c] / sizes.sum()) for c in clients)
        self.global_state = {k: state[k].detach().clone() for k in self.global_state}


def peft_name(name: str) -> str:
    """peft's state-dict name of a fedge adapter (``block3.layer.attn.c_attn.lora_A`` ->
    ``base_model.model.transformer.h.2.attn.c_attn.lora_A.weight``)."""
    block, _, rest = name.split(".", 2)
    return f"base_model.model.transformer.h.{int(block[5:]) - 1}.{rest}.weight"


def fedge_state(built: Built) -> dict[str, torch.Tensor]:
    """The global adapters of a fedge run, by peft's names."""
    algorithm = built.algorithm
    if hasattr(algorithm, "params"):
        state = algorithm.params
    else:
        state = {k.removeprefix("trunk."): v for k, v in algorithm.client["params"].items()}
        state.update(algorithm.server.params)
    return {peft_name(k): v for k, v in state.items()}


def _frozen_named(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen tensors of a fedge decoder layer by transformers' parameter names (LoRA bases too)."""
    out = {}
    for name, sub in module.named_modules():
        for key in ("weight", "bias"):
            value = sub.__dict__.get(key)
            if isinstance(value, torch.Tensor):
                out[f"{name}.{key}" if name else key] = value
    return out


def _block_index(name: str) -> int:
    """The decoder block a peft parameter name belongs to (``...h.<i>....``)."""
    parts = name.split(".")
    return int(parts[parts.index("h") + 1])


def executed_flops(built: Built) -> float:
    """FLOPs of one training step (forward and backward as executed) of the whole model on one
    sequence, counted on a real step of the LoRA model.

    The step runs under ``vmap`` (one row), where the attention is written out as products: PyTorch's
    fused attention, which every way runs on plain tensors, is invisible to the counter on a CPU (it
    counts 0). Attention is thus counted as its scores and weighted values over every position pair,
    the products the written-out form executes, for every way alike."""
    model = built.context.build_model().to(built.context.device)
    x, y = built.context.data.x_train[:2], built.context.data.y_train[:2]
    with FlopCounterMode(display=False) as counter:
        cross_entropy(vmap(model)(x[None])[0], y).mean().backward()
    return counter.get_total_flops() / 2


def adapter_bytes(built: Built) -> tuple[int, int]:
    """Bytes of the frozen base (once) and of one client's adapters."""
    template = built.context.build_model()
    base = sum(t.numel() * t.element_size() for t in template.frozen_tensors())
    adapters = sum(p.numel() * p.element_size() for p in template.parameters())
    return base, adapters


def measure(
    shape: dict[str, int], algorithm: str, device: str, repeats: int, budget: int | None
) -> dict[str, Any]:
    """Round seconds of the three ways, FLOP rate and memory, for one algorithm."""
    batched = built_run(shape, algorithm, "batched", device, budget)
    sequential = built_run(shape, algorithm, "sequential", device, budget)
    loop = PeftLoop(batched, algorithm, cut=2)
    dev = batched.context.device
    columns: dict[str, list[float]] = {"batched": [], "sequential": [], "loop": []}
    rounds = {"batched": batched.algorithm.run_round, "sequential": sequential.algorithm.run_round,
              "loop": loop.round}  # fmt: skip
    agreement = None
    peaks = []
    for r in range(repeats + 1):  # the first repeat warms up
        if r:
            peaks.append(matmul_peak(dev)["gflops"])
        for name, run in rounds.items():
            seconds = timed(lambda run=run, r=r: run(r + 1), dev)
            if r:
                columns[name].append(seconds)
        if r == 0:  # after one round from the same adapters: the loop does the same work
            ours = fedge_state(batched)
            agreement = max(float((ours[k] - loop.global_state[k]).abs().max()) for k in ours)
    samples = int(batched.context.data.client_sizes().sum())
    flops = executed_flops(batched) * samples
    base, adapters = adapter_bytes(batched)
    times = {k: median(v) for k, v in columns.items()}
    gflops = {way: flops / times[way] / 1e9 for way in ("batched", "loop")}
    peak = median(peaks)
    return {
        "round_s": times,
        "matmul_peak_gflops": peak,
        "matmul_peak_readings": peaks,
        "batched_fraction_of_peak": gflops["batched"] / peak,
        "loop_fraction_of_peak": gflops["loop"] / peak,
        "speedup_vs_loop": times["loop"] / times["batched"],
        "loop_vs_fedge_max_diff_round1": agreement,
        "speedup_vs_sequential": times["sequential"] / times["batched"],
        "sequences_per_round": samples,
        "executed_tflop_per_round": flops / 1e12,
        "batched_gflops": gflops["batched"],
        "loop_gflops": gflops["loop"],
        "base_mb": base / 2**20,
        "adapters_mb_per_client": adapters / 2**20,
        "base_plus_clients_mb": (base + shape["clients"] * adapters) / 2**20,
        **memory(shape, algorithm, device, base + shape["clients"] * adapters, budget),
    }


def built_run(shape: dict[str, int], algorithm: str, executor: str, device: str, budget: int | None) -> Built:
    """The fedge run of one way, its executor's activation budget set to ``budget``.

    The runner sets the budget to a quarter of the memory available when the run is built, and this
    process holds the runs built before it: the second of two identical runs got a budget one client
    short of W9's SplitFed client side and recomputed its graph (27.0 s a round against 23.5 s). Every
    way gets the budget the process had before it built anything."""
    built = build_run(_resolved(run_config(shape, algorithm, executor, device)))
    if budget is not None:
        built.context.executor.activation_budget = budget
    return built


def memory(
    shape: dict[str, int], algorithm: str, device: str, held: int, budget: int | None
) -> dict[str, Any]:
    """The batched round's memory against base + clients x adapters (``held`` bytes) + one chunk's
    activations, each way measured in a fresh process."""
    spawn = multiprocessing.get_context("spawn")
    threads = torch.get_num_threads()
    with spawn.Pool(1, maxtasksperchild=1) as pool:
        rounds = {way: pool.apply(round_memory, (shape, algorithm, way, device, threads, budget))
                  for way in ("batched", "loop")}  # fmt: skip
    chunk = rounds["batched"]["clients_at_once"]
    per_client = rounds["loop"]["round_bytes"]
    model = held + chunk * per_client
    return {
        "clients_at_once": chunk,
        "loop_round_mb_one_client": per_client / 2**20,
        "batched_round_mb": rounds["batched"]["round_bytes"] / 2**20,
        "memory_model_mb": model / 2**20,
        "memory_ratio": (held + rounds["batched"]["round_bytes"]) / model,
    }


def round_memory(
    shape: dict[str, int], algorithm: str, way: str, device: str, threads: int, budget: int | None
) -> dict[str, int]:
    """In this (fresh) process: the bytes one round of ``way`` adds to its built run, and how many
    clients the run's executor trains at once."""
    configure_host(threads, True)
    built = built_run(shape, algorithm, "batched", device, budget)
    run = PeftLoop(built, algorithm, cut=2).round if way == "loop" else built.algorithm.run_round
    dev = built.context.device
    together = built.context.executor.clients_at_once(shape["clients"], shape["batch"])
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        run(1)
        return {"round_bytes": torch.cuda.max_memory_allocated(dev) - before, "clients_at_once": together}
    before = rss_bytes() or 0
    with RssSampler() as sampler:
        run(1)
    return {"round_bytes": sampler.peak - before, "clients_at_once": together}


def _resolved(raw: dict[str, Any]):
    import fedge

    return fedge.resolve_config(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="the small version (minutes on a CPU)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--gpt2-small", action="store_true", help="GPT-2 small shapes (12 x 768)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--algorithms", default="fedavg,splitfed_v2")
    parser.add_argument("--threads", type=int, default=None, help="torch threads, every way")
    args = parser.parse_args()
    shape = dict(QUICK if args.quick else W9)
    if args.gpt2_small:
        shape.update(GPT2_SMALL)
    if args.clients:
        shape["clients"] = args.clients
    configure_host(args.threads, True)  # one process: every way runs with the same threads
    device = torch.device(args.device)
    available = available_bytes(device)
    budget = None if available is None else available // 4  # the runner's rule, before any run is built
    result = {
        "workload": "W9" if not args.quick else "W9-quick",
        "shape": shape,
        "machine": machine(device),
        "torch_threads": torch.get_num_threads(),
        "matmul_peak_gflops_at_start": matmul_peak(device)["gflops"],
        "activation_budget_mb": None if budget is None else budget / 2**20,
        "algorithms": {
            a: measure(shape, a, args.device, args.repeats, budget) for a in args.algorithms.split(",")
        },
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
