"""FSL-SAGE: the estimated-gradient step, alignment, executor agreement, its traffic per round against the
formula, its config errors and its examples."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from cases import killed_after, tiny
from tiers import parametrize_first_by_default

import fedge
from fedge.algorithms.split.alignment import Aligner
from fedge.algorithms.split.estimated import make_estimated_step
from fedge.algorithms.split.participation import participants
from fedge.algorithms.split.parts import aux_only, trunk_only
from fedge.algorithms.split.plans import round_plan
from fedge.engine import cross_entropy, make_optimizer
from fedge.errors import ConfigError
from fedge.rng import numpy_rng
from fedge.runner.loop import build_run
from fedge.system import forward_flops
from tests.algorithms.test_split_algorithms import config, max_diff, model_state, trained
from tests.data.test_data_sources import write_idx_set
from tests.project.test_paper_examples import write_cifar10

EXAMPLES = Path(__file__).parents[2] / "examples"
SAGE = {"name": "fsl_sage", "h": 2, "align_every": 2, "align_epochs": 3, "align_batch_size": 16}
CODE_FORMS = {"alignment_timing": "first_batch", "alignment_loss": "mean_loss_gradients"}  # the public code's


def test_the_trunk_steps_on_the_aux_models_gradient_at_the_cut_and_the_aux_model_stays():
    """One step equals back-propagating d(aux loss)/dz through the trunk by hand; the aux model is fixed."""
    torch.manual_seed(0)
    local = torch.nn.Sequential()
    local.add_module("trunk", torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU()))
    local.add_module("aux", torch.nn.Linear(4, 3))
    params = {k: v.detach().clone() for k, v in local.named_parameters()}
    x, y, weight = torch.randn(6, 5), torch.randint(0, 3, (6,)), torch.ones(6)
    sgd = make_optimizer(fedge.config.OptimizerConfig(lr=0.1))
    step = make_estimated_step(local, sgd, cross_entropy).eager
    out = step(params, {}, {}, x, y, weight, 0.1)
    new_params = out.state[0]
    z = local.trunk(x)
    z_leaf = z.detach().requires_grad_(True)
    estimate = torch.autograd.grad(cross_entropy(local.aux(z_leaf), y).mean(), z_leaf)[0]
    trunk = list(local.trunk.parameters())
    by_hand = torch.autograd.grad(z, trunk, grad_outputs=estimate)
    for (name, p), g in zip(local.trunk.named_parameters(), by_hand, strict=True):
        assert torch.allclose(new_params[f"trunk.{name}"], p - 0.1 * g, atol=1e-6)
    for name in aux_only(params):
        assert torch.equal(new_params[name], params[name])
    assert torch.allclose(out.per_sample[0], z.detach())


def test_alignment_fits_the_aux_model_to_the_servers_per_sample_gradients():
    torch.manual_seed(1)
    server, aux = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    z, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    params = {k: v.detach() for k, v in server.named_parameters()}
    adam = make_optimizer(fedge.config.OptimizerConfig(kind="adam", lr=0.05))
    aligner = Aligner(server, aux, cross_entropy, adam, 0.05, 200, 32)
    g = aligner.true_gradients(params, {}, z, y, key=0)
    leaf = z.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(cross_entropy(server(leaf), y).sum(), leaf)
    assert torch.allclose(g, expected)
    start = {f"aux.{k}": v.detach() for k, v in aux.named_parameters()}
    aligned = aligner.align(start, None, (z, y), g, np.random.default_rng(0))
    assert aligned.loss_after < 0.05 * aligned.loss_before
    # a linear aux model of the server's shape can match it: the server's own weights have no mismatch
    same = {f"aux.{k}": v for k, v in params.items()}
    assert float(aligner.mismatch(same, z, y, g).detach()) < 1e-10


VARIANTS = {
    "first": SAGE,
    "last-client-after-client": {**SAGE, "upload_phase": "last", "server_order": "client_after_client"},
    "adam-keep-sampled": {
        **SAGE,
        "optimizer": {"kind": "adam", "lr": 0.01},
        "client_optimizer_state": "keep",
        "participation": "without_replacement",
        "clients_per_round": 3,
    },
    "code-forms": {**SAGE, **CODE_FORMS},
    "first-batch-client-after-client-duplicates": {
        **SAGE,
        "alignment_timing": "first_batch",
        "server_order": "client_after_client",
        "participation": "with_replacement",
        "clients_per_round": 6,
    },
    "first-batch-duplicates-together": {
        **SAGE,
        "alignment_timing": "first_batch",
        "participation": "with_replacement",
        "clients_per_round": 6,
    },
}


@parametrize_first_by_default("variant", list(VARIANTS), ids=list(VARIANTS))
def test_batched_and_sequential_executors_agree(variant):
    runs = {}
    for executor in ("sequential", "batched"):
        runs[executor] = trained(config(VARIANTS[variant], engine={"executor": executor}), rounds=3)
    (seq, seq_metrics), (bat, bat_metrics) = runs["sequential"], runs["batched"]
    assert max_diff(model_state(seq.algorithm), model_state(bat.algorithm)) < 1e-5
    for client, head in seq.algorithm.local_aux.items():
        assert max_diff(head, bat.algorithm.local_aux[client]) < 1e-5
    assert seq.context.ledger.totals() == bat.context.ledger.totals()
    for a, b in zip(seq_metrics, bat_metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        assert a["aligned"] == b["aligned"] and a["uploads"] == b["uploads"]
    algorithm, data = seq.algorithm, seq.context.data
    for t in (1, 3):  # rounds 1 and 3 align every participating client once
        draws = participants(seq.context.seed, t, data, algorithm.cfg, None)[0]
        assert seq_metrics[t - 1]["aligned"] == len(set(draws.clients.tolist()))
    assert seq_metrics[1]["aligned"] == 0


def test_traffic_per_round_is_the_papers_formula():
    """Per participant and round: its trunk down and up, B_s * d smashed values (and B_s labels) for each
    upload step s (s = 0, h, 2h, ...: ceil(n/h) uploads of n batches), and its aux model down in an
    alignment round (rounds 1, l + 1, ...); 32 bits a value."""
    h, batch, rounds = 3, 8, 3
    raw = config({**SAGE, "h": h, "align_every": 2, "batch_size": batch})
    built = build_run(fedge.resolve_config(raw))
    algorithm, ledger = built.algorithm, built.context.ledger
    sizes = built.context.data.client_sizes()
    d = int(np.prod(algorithm.parts.smashed_shape))
    trunk = sum(v.numel() for v in trunk_only(algorithm.client["params"]).values())
    aux = sum(v.numel() for v in aux_only(algorithm.client["params"]).values())
    before = dict(ledger.totals())
    for t in range(1, rounds + 1):
        algorithm.run_round(t)
        after = dict(ledger.totals())
        sent = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in after}
        before = after
        uploaded = 0
        for size in sizes:
            batches = [min(batch, size - start) for start in range(0, size, batch)]
            uploaded += sum(b for s, b in enumerate(batches) if s % h == 0)
        clients = len(sizes)
        assert sent[("smashed_up", "up")] == 32 * d * uploaded
        assert sent[("labels_up", "up")] == 32 * uploaded
        assert sent[("model_down", "down")] == sent[("model_up", "up")] == 32 * trunk * clients
        assert sent.get(("aux_down", "down"), 0) == (32 * aux * clients if t % 2 == 1 else 0)
        assert set(sent) <= {("smashed_up", "up"), ("labels_up", "up"), ("model_down", "down"),
                             ("model_up", "up"), ("aux_down", "down")}  # fmt: skip


def test_an_alignment_round_lasts_the_alignment_and_the_aux_downloads_longer_on_the_clock():
    """Round 2 with l = 1 aligns, with l = 2 it does not; both runs are identical up to the alignment.
    The difference is the server computing, per participant with N stored samples, a training pass of
    the server part (its true gradients) and 3 training passes of the aux model per sample and epoch
    (the gradient-matching loss differentiated in the aux weights) at its speed, then the slowest
    participant's download of its aux model; and the energy of both."""
    epochs = 3

    def figures(clock) -> np.ndarray:
        return np.array([clock.seconds, clock.joules, clock.seconds_by_phase.get("align", 0.0)])

    runs = {}
    for every in (1, 2):
        raw = config({**SAGE, "align_every": every, "align_epochs": epochs})
        built = build_run(fedge.resolve_config(raw))
        built.algorithm.run_round(1)
        before = figures(built.context.system.clock)
        built.algorithm.run_round(2)
        runs[every] = (built, figures(built.context.system.clock) - before)  # round 2's cost
    (aligning, (seconds, joules, align_s)), (_, (plain_s, plain_j, plain_align)) = runs[1], runs[2]
    algorithm, system = aligning.algorithm, aligning.context.system
    parts, cfg = algorithm.parts, system.cfg
    server_f = forward_flops(parts.server, parts.smashed_shape)
    aux_f = forward_flops(parts.local.aux, parts.smashed_shape)
    stored = [len(algorithm.store.samples(c)[1]) for c in range(5)]
    flops = sum(3 * server_f * n + 9 * aux_f * n * epochs for n in stored)
    compute = flops * cfg.cycles_per_flop / cfg.server_cpu_hz
    aux_bits = 32 * sum(v.numel() for v in aux_only(algorithm.client["params"]).values())
    download = aux_bits / system.link(2).down_bps[:5]
    assert plain_align == 0 and align_s == pytest.approx(compute, rel=1e-12)
    assert seconds - plain_s == pytest.approx(compute + download.max(), rel=1e-9)
    energy = cfg.server_compute_w * compute + system.server_power_w * download.sum()
    assert joules - plain_j == pytest.approx(energy, rel=1e-9)
    assert compute > 0 and download.max() > 0


def test_the_aux_models_change_only_at_alignment_and_are_never_averaged():
    built, _ = trained(config({**SAGE, "align_every": 2}), rounds=1)
    algorithm = built.algorithm
    heads = {c: {k: v.clone() for k, v in h.items()} for c, h in algorithm.local_aux.items()}
    assert len(heads) == 5 and max_diff(heads[0], heads[1]) > 0  # each client its own aligned head
    algorithm.run_round(2)  # no alignment in round 2
    for client, head in heads.items():
        assert max_diff(head, algorithm.local_aux[client]) == 0
    assert algorithm.store.samples(0)[0].shape[0] > 0


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="algorithm.agg_every"):
        build_run(fedge.resolve_config(config({**SAGE, "agg_every": 2})))
    with pytest.raises(ConfigError, match="algorithm.h"):
        build_run(fedge.resolve_config(config({**SAGE, "h": 500, "upload_phase": "last"})))
    with pytest.raises(Exception, match="align_every"):
        fedge.resolve_config(config({**SAGE, "align_every": 0}))
    last = {**SAGE, "upload_phase": "last", "alignment_timing": "first_batch"}
    with pytest.raises(ConfigError, match="algorithm.alignment_timing"):
        build_run(fedge.resolve_config(config(last)))
    build_run(fedge.resolve_config(config({**last, "h": 1})))  # h = 1 uploads every batch
    for key in ("alignment_timing", "alignment_loss"):
        with pytest.raises(Exception, match=key):
            fedge.resolve_config(config({**SAGE, key: "sometimes"}))


def test_a_deployed_run_refuses_the_first_batch_timing_naming_the_key():
    """A node trains its whole round in one message: nothing can reach it after its first upload."""
    pytest.importorskip("flwr")
    from fedge.deploy.split_rounds import DeployedFslSage

    raw = config({**SAGE, "alignment_timing": "first_batch"}, engine={"executor": "sequential"})
    cfg = fedge.resolve_config(raw)
    with pytest.raises(ConfigError, match=r"algorithm\.alignment_timing"):
        DeployedFslSage(build_run(cfg).context, cfg.algorithm).check_deployable()
    plain = fedge.resolve_config(config({**SAGE, "alignment_loss": "mean_loss_gradients"}))
    DeployedFslSage(build_run(plain).context, plain.algorithm).check_deployable()


@pytest.mark.ci
def test_the_fashion_mnist_example_validates_and_its_first_round_runs(tmp_path):
    path = EXAMPLES / "fsl-sage-fashion-mnist.yaml"
    write_idx_set(tmp_path / "data", n_train=400, n_test=100, gz=True)
    overrides = ["rounds=1", f"data.root={tmp_path / 'data'}", f"output.dir={tmp_path / 'runs'}"]
    overrides.append("output.plots=false")
    result = fedge.run(str(path), overrides)
    assert result.metrics[0]["aligned"] == 5 and np.isfinite(result.metrics[0]["train_loss"])


@pytest.mark.ci
def test_the_paper_scale_example_runs_its_first_round_on_cifar10_files(tmp_path):
    path = EXAMPLES / "fsl-sage-cifar10.yaml"
    config_ = fedge.config.load_config(path)
    assert config_.rounds >= 200 and config_.algorithm.h == 5 and config_.algorithm.align_every == 10
    write_cifar10(tmp_path / "data", per_batch=60, test=40)
    overrides = [f"data.root={tmp_path / 'data'}", "rounds=1", f"output.dir={tmp_path / 'runs'}",
                 "output.plots=false", "algorithm.align_epochs=2", "model.options.width=8"]  # fmt: skip
    result = fedge.run(str(path), overrides)
    row = result.metrics[0]
    assert row["round"] == 1 and row["aligned"] == 3 and np.isfinite(row["train_loss"])


@parametrize_first_by_default("forms", [{}, CODE_FORMS], ids=["default", "code-forms"])
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, forms):
    """The alignment store (samples and the aux models' optimizer state) travels in the checkpoint."""

    def run_config(name: str) -> dict:
        raw = tiny("fsl_sage", tmp_path / "runs", rounds=4)
        raw["algorithm"].update(h=2, align_every=3, align_epochs=2, optimizer={"kind": "adam", "lr": 0.01})
        raw["algorithm"].update(forms)
        raw["output"].update(name=name, checkpoint_every=1)
        return raw

    whole = fedge.run(run_config("whole"))

    killed_after(run_config("cut"), 2)
    resumed = fedge.resume(tmp_path / "runs" / "cut")
    drop = ("wall_seconds", "run_dir")
    clean = [{k: v for k, v in row.items() if k not in drop} for row in resumed.metrics]
    assert clean == [{k: v for k, v in row.items() if k not in drop} for row in whole.metrics]
    assert resumed.metrics[3]["aligned"] == 4  # round 4 aligns with the store and Adam state of rounds 1-3


# ----- the public code's alignment timing and loss (alignment_timing: first_batch, alignment_loss) ----------


def test_the_mean_loss_gradients_form_is_the_codes_sum_over_batch_and_store_mean_gradients():
    """On one batch of the whole store of N the code's loss is 1/N^2 sum ||ghat - g||^2, 1/N of the
    per-sample mean; on a batch of B from that store it compares ghat / B with g / N."""
    torch.manual_seed(2)
    server, aux = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    z, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    params = {f"aux.{k}": v.detach() for k, v in aux.named_parameters()}
    adam = make_optimizer(fedge.config.OptimizerConfig(kind="adam", lr=0.05))
    forms = {loss: Aligner(server, aux, cross_entropy, adam, 0.05, 1, 40, loss) for loss in
             ("per_sample_mean", "mean_loss_gradients")}  # fmt: skip
    g = forms["per_sample_mean"].true_gradients(dict(server.named_parameters()), {}, z, y, key=0)
    mean = float(forms["per_sample_mean"].mismatch(params, z, y, g).detach())
    code = float(forms["mean_loss_gradients"].mismatch(params, z, y, g).detach())
    assert code == pytest.approx(mean / 40, rel=1e-5)
    leaf = z[:8].clone().requires_grad_(True)
    (ghat,) = torch.autograd.grad(cross_entropy(aux(leaf), y[:8]).mean(), leaf)  # batch-mean loss
    by_hand = float((ghat - g[:8] / 40).pow(2).sum())
    piece = forms["mean_loss_gradients"].mismatch(params, z[:8], y[:8], g[:8], 40)
    assert float(piece.detach()) == pytest.approx(by_hand)


def code_loop(built, rounds: int, lr: float) -> tuple[list[float], list[dict[int, dict]]]:
    """An independent reference of FSL-SAGE as its authors' public code runs it, in plain PyTorch on the
    run's own modules, initial weights and batches: clients one after another; per batch the trunk's
    forward, every h-th batch (from the first) a server Adam step on the smashed data, stored for
    alignment (the last ``align_samples``); in rounds 1, l + 1, ... right after a client's first batch's
    server step, its aux model fitted (its own Adam, kept) to the server's gradients of the store's mean
    loss by the summed squared difference with its own batch-mean gradients; then the trunk's Adam step
    on the aux model's estimate; trunks averaged by size. Returns the test accuracy and aux models per
    round."""
    algorithm, data, cfg = built.algorithm, built.context.data, built.algorithm.cfg
    parts, client0 = algorithm.parts, algorithm.client["params"]

    def module(template, params, prefix):
        copy_ = copy.deepcopy(template)
        mine = {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
        copy_.load_state_dict({k: v.clone() for k, v in mine.items()})
        return copy_

    clients = range(data.num_clients)
    trunks = {c: module(parts.trunk, client0, "trunk.") for c in clients}
    auxes = {c: module(parts.local.aux, client0, "aux.") for c in clients}
    server = module(parts.server, algorithm.server.params, "")
    opts = {c: torch.optim.Adam(trunks[c].parameters(), lr=lr) for c in clients}
    aux_opts = {c: torch.optim.Adam(auxes[c].parameters(), lr=cfg.aux_optimizer.lr) for c in clients}
    server_opt = torch.optim.Adam(server.parameters(), lr=lr)
    stores: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    ce = torch.nn.functional.cross_entropy

    def align(t: int, c: int) -> None:
        z, y = stores[c]
        leaf = z.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(ce(server(leaf), y), leaf)  # the store's mean-loss gradients
        rng = numpy_rng(built.context.seed, "fsl-sage-align", t, c)
        rng.integers(2**31)  # the server's noise key (no random layers here)
        for _ in range(cfg.align_epochs):
            for batch in torch.as_tensor(rng.permutation(len(y))).split(cfg.align_batch_size):
                aux_opts[c].zero_grad()
                zb = z[batch].clone().requires_grad_(True)
                (ghat,) = torch.autograd.grad(ce(auxes[c](zb), y[batch]), zb, create_graph=True)
                (ghat - g[batch]).pow(2).sum().backward()
                aux_opts[c].step()

    accuracy, heads = [], []
    for t in range(1, rounds + 1):
        plan = round_plan(data, participants(built.context.seed, t, data, cfg, None)[0], t, cfg.batch_size,
                          cfg.local_epochs, cfg.local_steps, cfg.drop_last)  # fmt: skip
        for c in clients:
            for s in range(plan.index.shape[1]):
                pick = plan.index[c, s][plan.weight[c, s] > 0]
                if not len(pick):
                    continue
                x, y = data.x_train[pick], data.y_train[pick]
                opts[c].zero_grad()
                z = trunks[c](x)
                if s % cfg.h == 0:
                    leaf = z.detach().clone().requires_grad_(True)
                    server_opt.zero_grad()
                    ce(server(leaf), y).backward()
                    server_opt.step()
                    old_z, old_y = stores.get(c, (z[:0].detach(), y[:0]))
                    keep = cfg.align_samples
                    stores[c] = (torch.cat([old_z, z.detach()])[-keep:], torch.cat([old_y, y])[-keep:])
                if (t - 1) % cfg.align_every == 0 and s == 0:
                    align(t, c)
                leaf = z.detach().requires_grad_(True)
                (estimate,) = torch.autograd.grad(ce(auxes[c](leaf), y), leaf)
                z.backward(estimate)
                opts[c].step()
        sizes = torch.as_tensor(data.client_sizes(), dtype=torch.float32)
        weights = sizes / sizes.sum()
        states = [trunks[c].state_dict() for c in clients]
        average = {k: sum(w * s[k] for w, s in zip(weights, states, strict=True)) for k in states[0]}
        for c in clients:
            trunks[c].load_state_dict(average)
        with torch.no_grad():
            right = server(trunks[0](data.x_test)).argmax(dim=1) == data.y_test
        accuracy.append(float(right.double().mean()))
        heads.append({c: {f"aux.{k}": v.clone() for k, v in auxes[c].state_dict().items()} for c in clients})
    return accuracy, heads


@parametrize_first_by_default("executor", ["sequential", "batched"])
def test_the_code_switches_run_fsl_sage_as_its_authors_code_does_round_for_round(executor):
    """With ``first_batch`` and ``mean_loss_gradients`` (and the code's client after client and Adam
    states kept) fedge equals the independent reference of the public code's loop: accuracy each round,
    aux models to float noise; an alignment every 2 rounds on a store larger than an alignment batch."""
    rounds, lr = 3, 0.01
    algorithm = {**SAGE, **CODE_FORMS, "server_order": "client_after_client", "align_epochs": 4,
                 "client_optimizer_state": "keep", "optimizer": {"kind": "adam", "lr": lr},
                 "align_batch_size": 24}  # fmt: skip
    raw = config(algorithm, engine={"executor": executor, "fused": False})
    built = build_run(fedge.resolve_config(raw))
    expected, expected_heads = code_loop(build_run(fedge.resolve_config(raw)), rounds, lr)
    for t in range(1, rounds + 1):
        built.algorithm.run_round(t)
        assert built.algorithm.evaluate().accuracy == pytest.approx(expected[t - 1], abs=1e-9)
        for client, head in expected_heads[t - 1].items():
            assert max_diff(built.algorithm.local_aux[client], head) < 1e-5
    assert max(len(built.algorithm.store.samples(c)[1]) for c in range(5)) > 24  # several alignment batches


def test_fedges_default_timing_differs_from_the_codes_from_round_one():
    """After the local steps, round 1 trains on the initial aux model; at the first batch on the aligned
    one: the trunks differ after round 1, the per-sample loss alone changes the aligned aux models."""
    runs = {}
    for name, forms in {"default": {}, "first_batch": {"alignment_timing": "first_batch"},
                        "code_loss": {"alignment_loss": "mean_loss_gradients"}}.items():  # fmt: skip
        adam = {"optimizer": {"kind": "adam", "lr": 0.01}}
        runs[name], _ = trained(config({**SAGE, **adam, **forms}), rounds=1)
    trunk = {name: trunk_only(run.algorithm.client["params"]) for name, run in runs.items()}
    assert max_diff(trunk["default"], trunk["first_batch"]) > 1e-4
    assert max_diff(trunk["default"], trunk["code_loss"]) == 0  # the aux models align after the steps
    heads = {name: run.algorithm.local_aux[0] for name, run in runs.items()}
    assert max_diff(heads["default"], heads["code_loss"]) > 1e-4


@pytest.mark.slow
def test_the_first_batch_timing_on_two_ranks_is_one_processs_run(tmp_path):
    """Spread over 2 gloo ranks (3 + 3 clients, a random queue order), each rank retakes the first steps
    of its own rows with the aux models aligned on every rank: the ledger and metrics are one process's,
    the final state within 1e-5 (docs/scale-out.md)."""
    from tests.distributed.test_distributed import final_state, launch, rows, split_config

    raw = split_config(tmp_path, "fsl_sage")
    raw["algorithm"].update(CODE_FORMS)
    (tmp_path / "seen").mkdir()
    launch(2, [(raw, "two")], tmp_path / "seen")
    fedge.run(raw, ["output.name=one"])
    two, one = tmp_path / "runs" / "two", tmp_path / "runs" / "one"
    assert (two / "ledger.csv").read_text() == (one / "ledger.csv").read_text()
    assert np.abs(final_state(two) - final_state(one)).max() <= 1e-5
    drop = ("accuracy", "loss", "train_loss", "server_loss", "align_loss_before", "align_loss_after")
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows(two)] == [
        {k: v for k, v in r.items() if k not in drop} for r in rows(one)
    ]
    assert [r["aligned"] for r in rows(one)] == [6, 6]
