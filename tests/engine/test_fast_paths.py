"""Fast paths that must not change a number: HIST's unmasked step when every slot is real."""

from __future__ import annotations

import torch
from tiers import parametrize_first_by_default

from fedge.api import resolve_config
from fedge.runner.loop import build_run

HIST = {
    "seed": 0,
    "data": {"name": "synthetic", "num_train": 480, "num_test": 60, "shape": [1, 6, 6]},
    "partition": {"kind": "iid", "num_clients": 8},
    "model": {"name": "fcnn", "options": {"dropout": 0.3}},
    "algorithm": {
        "name": "hist",
        "cells": 4,
        "edge_rounds": 2,
        "local_steps": 3,
        "batch_size": 8,
        "optimizer": {"lr": 0.1, "momentum": 0.9},
    },
    "output": {"plots": False},
}


@parametrize_first_by_default("executor", ["sequential", "batched"])
def test_hist_with_equal_cells_skips_the_mask_and_keeps_its_numbers(executor):
    models = []
    for fold in (False, True):
        built = build_run(resolve_config(HIST, [f"engine.executor={executor}"]))
        if not fold:  # the masked step at every edge round, as before the fast path
            built.algorithm.plain_step = built.algorithm.step
        for t in (1, 2):
            built.round(t)
        models.append(built.algorithm.params)
    masked, folded = models
    assert all(torch.equal(masked[k], folded[k]) for k in masked)
