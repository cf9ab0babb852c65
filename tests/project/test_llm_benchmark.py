"""W9's hand-written baseline does the work fedge does: peft's LoRA and a torch.optim loop per client give
fedge's adapters after a round (FedAvg and SplitFed v2), so the benchmark compares like with like."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import llm


# found without importing it: importing peft takes ~6 s, paid at collection by every xdist worker
@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft")
@pytest.mark.ci
@pytest.mark.parametrize("algorithm", ["fedavg", "splitfed_v2"])
def test_the_peft_loop_computes_fedges_round(algorithm):
    shape = {**llm.QUICK, "clients": 3, "layers": 3, "hidden": 32, "heads": 2, "seq_len": 16, "sequences": 4,
             "batch": 2}  # fmt: skip
    # two steps per client, so that SplitFed v2's server order shows
    built = llm.build_run(llm._resolved(llm.run_config(shape, algorithm, "batched", "cpu")))
    loop = llm.PeftLoop(built, algorithm, cut=2)
    built.algorithm.run_round(1)
    loop.round(1)
    ours = llm.fedge_state(built)
    assert sorted(ours) == sorted(loop.global_state)
    gap = max(float((ours[k] - loop.global_state[k]).abs().max()) for k in ours)
    assert gap < 1e-7  # rounding alone (sdpa vs spelled-out attention); client after client: 4e-7
    assert max(float(v.abs().max()) for k, v in ours.items() if "lora_B" in k) > 0  # trained
