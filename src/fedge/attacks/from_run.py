"""The attacks on a finished run directory (``fedge attack``): each reads what the run recorded (or its
final model), runs, and its figures go to ``attacks.json`` with the seconds it took on this machine.

The attacker is told what its threat model grants and nothing else; the ground truth a record keeps
(inputs, true labels) is read only to score it. Every random draw of an attack comes from ``seed``.
"""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge.attacks import gradient_inversion, inversion, label_inference, membership, tokens
from fedge.attacks.grids import write_grid
from fedge.attacks.metrics import match_reconstructions
from fedge.attacks.run_view import AttackError, RunView
from fedge.comm.dropout import apply_dropout
from fedge.files import results
from fedge.models.transformer import LANGUAGE_MODELS
from fedge.privacy.cut import clip_rows
from fedge.rng import torch_rng
from fedge.tensors import Tensors

ATTACKS_FILE = "attacks.json"
# the split algorithms that end with one trunk and one server part (lightweight FedSL: a trunk per client)
SPLIT_MODELS = ("splitfed_v1", "splitfed_v2", "fsl_an", "cse_fsl")


@dataclass(frozen=True)
class Budget:
    """How much work each attack may do (its defaults keep a digits or MNIST run's attacks in minutes)."""

    aux_samples: int = 2000  # the curious server's auxiliary data: this many test inputs
    decoder_epochs: int = 30
    inversion_samples: int = 32  # smashed samples inverted by optimisation
    inversion_steps: int = 400
    gradient_steps: int = 1500
    gradient_max_batch: int = 16  # recorded updates trained on more samples are skipped
    gradient_clients: int = 4
    membership_samples: int = 1000  # members and as many non-members
    reference_epochs: int = 10  # the calibrated attack's reference model, trained on half the test set


@dataclass(frozen=True)
class Attack:
    """An attack: its paper, threat model and metric in one line each, and how it runs on a run."""

    paper: str
    threat: str
    metric: str
    run: Callable[[RunView, Budget, int], dict[str, Any]]


def _classes(labels: torch.Tensor) -> int:
    return int(labels.max()) + 1


def _label_norm(view: RunView, budget: Budget, seed: int) -> dict[str, Any]:
    rounds = view.need("label_norm", "cut_gradients", "cut/cut_gradients")
    grads, labels = view.pooled(rounds, "cut/cut_gradients", "cut/true_label")
    return {"rounds": rounds, "samples": len(labels),
            **label_inference.norm_attack(grads, labels, _classes(labels))}  # fmt: skip


def _label_direction(view: RunView, budget: Budget, seed: int) -> dict[str, Any]:
    rounds = view.need("label_direction", "cut_gradients", "cut/cut_gradients")
    grads, labels = view.pooled(rounds, "cut/cut_gradients", "cut/true_label")
    figures = label_inference.direction_attack(
        grads, labels, _classes(labels), generator=torch_rng(seed, "label-direction")
    )
    return {"rounds": rounds, "samples": len(labels), **figures}


def _aux(view: RunView, budget: Budget, seed: int) -> torch.Tensor:
    """The curious server's auxiliary inputs (images, or a language model's token ids): test inputs, from
    the same distribution as the clients' and never trained on."""
    x = view.built.context.data.x_test.cpu()
    order = torch.randperm(len(x), generator=torch_rng(seed, "attack-aux"))
    return x[order[: budget.aux_samples]]


def _bounds(x: torch.Tensor) -> tuple[float, float]:
    return float(x.min()), float(x.max())


def _encoder(view: RunView, t: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The client trunk of round ``t`` as a function (the attacker knows the broadcast model), in
    training mode as the clients ran it (a BatchNorm trunk normalises by the batch's statistics)."""
    trunk, state = view.trunk(t)
    trunk.train()

    def encode(x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(trunk, state, (x,))

    return encode


def _mechanism(view: RunView) -> tuple[float | None, float, float]:
    """What the run does to smashed data before sending it, all public parameters: ``privacy.cut``'s
    clip and noise std (None, 0: sent as computed) and lightweight FedSL's cut dropout rate."""
    algorithm = view.built.algorithm
    knobs = getattr(algorithm, "knobs", None)
    dropout = float(getattr(knobs, "cut_dropout", 0.0))
    cut_privacy = getattr(algorithm, "cut_privacy", None)
    if cut_privacy is None or cut_privacy.smashed_clip is None:
        return None, 0.0, dropout
    clip = cut_privacy.smashed_clip
    return clip, cut_privacy.noise_multiplier() * clip, dropout


def _noisy_encoder(view: RunView, t: int, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The trunk of round ``t`` followed by what the run does to its smashed data (clip and Gaussian
    noise, cut dropout), the attacker's draws seeded: an attacker who knows the mechanism trains on it."""
    encode, (clip, std, dropout) = _encoder(view, t), _mechanism(view)
    if clip is None and dropout == 0.0:
        return encode
    generator = torch_rng(seed, "attack-mechanism")

    def noised(x: torch.Tensor) -> torch.Tensor:
        z = encode(x)
        if clip is not None:
            z = clip_rows(z, clip)
            z = z + std * torch.randn(z.shape, generator=generator).to(z)
        if dropout:
            kept = torch.rand(z.shape, generator=generator) >= dropout
            z = apply_dropout(z, kept, dropout)
        return z

    return noised


def _smashed(view: RunView, attack: str) -> tuple[int, dict[str, np.ndarray]]:
    """The last recorded round with smashed data, and its record."""
    t = view.need(attack, "smashed", "cut/smashed")[-1]
    return t, view.record(t)


def _decoder(view: RunView, budget: Budget, seed: int) -> dict[str, Any]:
    t, held = _smashed(view, "decoder")
    aux = _aux(view, budget, seed).float()
    bounds = _bounds(aux)
    rng = torch_rng(seed, "decoder")
    decoder = inversion.train_decoder(
        _noisy_encoder(view, t, seed),
        aux,
        epochs=budget.decoder_epochs,
        batch_size=64,
        lr=1e-3,
        generator=rng,
        bounds=bounds,
    )
    original = torch.from_numpy(held["cut/input"]).float()
    rebuilt = inversion.decode(decoder, torch.from_numpy(held["cut/smashed"]).float())
    span = bounds[1] - bounds[0]
    figures = inversion.reconstruction_figures(original, rebuilt, span)
    mean_image = aux.mean(dim=0, keepdim=True).expand_as(original)
    baseline = inversion.reconstruction_figures(original, mean_image, span)
    return {"round": t, "samples": len(original), **figures, "mean_image_psnr": baseline["psnr"],
            "_images": (original, rebuilt)}  # fmt: skip


def _inversion(view: RunView, budget: Budget, seed: int) -> dict[str, Any]:
    t, held = _smashed(view, "inversion")
    bounds = _bounds(_aux(view, budget, seed).float())
    steps = held["cut/step"]
    # step 0's smashed data first: the broadcast model the attacker knows computed exactly these
    chosen = np.argsort(steps > 0, kind="stable")[: budget.inversion_samples]
    original = torch.from_numpy(held["cut/input"][chosen]).float()
    z = torch.from_numpy(held["cut/smashed"][chosen]).float()
    rebuilt = inversion.invert_by_optimisation(
        _encoder(view, t), z, tuple(original.shape[1:]), steps=budget.inversion_steps, lr=0.05,
        tv_weight=1e-3, bounds=bounds, generator=torch_rng(seed, "inversion"),
    )  # fmt: skip
    figures = inversion.reconstruction_figures(original, rebuilt, bounds[1] - bounds[0])
    return {"round": t, "samples": len(original), **figures, "_images": (original, rebuilt)}


def _embedding(trunk: nn.Module) -> torch.Tensor:
    """The token embedding table of a language model's client side (its largest embedding)."""
    tables = [m.weight for m in trunk.modules() if isinstance(m, nn.Embedding)]
    if not tables:
        raise AttackError("token recovery needs a language model whose client side embeds the tokens")
    return max(tables, key=len).detach()


def _tokens(view: RunView, budget: Budget, seed: int) -> dict[str, Any]:
    t, held = _smashed(view, "tokens")
    data = view.built.context.data
    if data.x_test.dtype != torch.long:
        raise AttackError(f"{view.run_dir}: token recovery needs a language model's token sequences")
    aux = _aux(view, budget, seed)
    trunk, _ = view.trunk(t)
    embedding = _embedding(trunk)
    encode = _encoder(view, t)
    inversion_map = tokens.train_token_inversion(
        encode, aux, embedding, epochs=budget.decoder_epochs, generator=torch_rng(seed, "tokens")
    )
    sent = torch.from_numpy(held["cut/input"])
    recovered = tokens.recover_tokens(inversion_map, torch.from_numpy(held["cut/smashed"]).float(), embedding)
    pad = data.dataset.pad_id
    mask = None if pad is None else sent != pad
    shown = sent if mask is None else sent[mask]
    frequent = float(torch.bincount(shown.flatten()).max()) / shown.numel()
    accuracy = tokens.token_accuracy(recovered, sent, mask)
    return {
        "round": t,
        "samples": len(sent),
        "token_accuracy": accuracy,
        "most_frequent_token_share": frequent,
    }


def _update_of(held: dict[str, np.ndarray], row: int) -> tuple[Tensors, Tensors]:
    """Recorded update ``row``'s global model and its delta, by parameter name."""
    prefix = "updates/delta/"
    delta = {k[len(prefix) :]: torch.from_numpy(v[row]) for k, v in held.items() if k.startswith(prefix)}
    reference = {name: torch.from_numpy(held[f"global/{name}"]) for name in delta}
    return reference, delta


def _gradient_inversion(view: RunView, budget: Budget, seed: int) -> dict[str, Any]:
    rounds = view.need("gradient_inversion", "updates", "updates/client")
    model = view.built.algorithm.model if hasattr(view.built.algorithm, "model") else None
    if not isinstance(model, nn.Module):
        raise AttackError(f"{view.run_dir}: gradient inversion needs a global model")
    model.eval()
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]  # in the model's order
    bounds = _bounds(_aux(view, budget, seed).float())  # the data's range, known from public data
    last = [name for name in trainable if name.endswith("weight")][-1]
    cases: list[dict[str, Any]] = []
    originals, rebuilt_all = [], []
    for t in rounds:
        held = view.record(t)
        lr = float(held["updates/lr"])
        for row in range(len(held["updates/client"])):
            if len(cases) >= budget.gradient_clients:
                break
            used = held["updates/sample"][row] >= 0
            count = int(used.sum())
            if count > budget.gradient_max_batch:
                continue
            reference, delta = _update_of(held, row)
            params = {k: v for k, v in reference.items() if k in trainable}
            target = gradient_inversion.gradient_from_update({k: delta[k] for k in params}, lr)
            labels = gradient_inversion.infer_labels(target[last], count)
            original = torch.from_numpy(held["updates/input"][row][used]).float()
            true = torch.from_numpy(held["updates/true_label"][row][used])
            rng = torch_rng(seed, "gradient-inversion", t, row)
            rebuilt = gradient_inversion.invert_gradients(
                model, params, target, tuple(original.shape[1:]), labels, steps=budget.gradient_steps,
                lr=0.1, tv_weight=1e-4, bounds=bounds, generator=rng,
            )  # fmt: skip
            order = match_reconstructions(original, rebuilt)
            figures = inversion.reconstruction_figures(original, rebuilt[order], bounds[1] - bounds[0])
            label_hits = _label_hits(labels, true)
            steps = int(held["updates/steps"][row])
            cases.append({"round": t, "client": int(held["updates/client"][row]), "batch": count,
                          "local_steps": steps, "labels_right": label_hits, **figures})  # fmt: skip
            originals.append(original)
            rebuilt_all.append(rebuilt[order])
    if not cases:
        raise AttackError(
            f"{view.run_dir}: no recorded update was trained on at most {budget.gradient_max_batch} samples"
        )
    psnr = float(np.mean([case["psnr"] for case in cases]))
    images = (torch.cat(originals), torch.cat(rebuilt_all))
    return {"cases": cases, "psnr": psnr, "_images": images}


def _label_hits(inferred: torch.Tensor, true: torch.Tensor) -> float:
    """The share of the batch's labels the attack got right (as multisets: the order is unknown)."""
    hits = Counter(inferred.tolist()) & Counter(true.tolist())
    return sum(hits.values()) / len(true)


class _Bound(nn.Module):
    """A model run with a given state through a functional call (the model itself is left untouched:
    in-run, it is the live run's)."""

    def __init__(self, model: nn.Module, state: Tensors):
        super().__init__()
        self.model, self.state = model, state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.model, self.state, (x,))


def _losses(
    view: RunView, model: nn.Module, members: torch.Tensor, others: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each member's (training sample's) and non-member's (test sample's) loss under ``model``, by the
    run's per-sample loss (a sequence: its mean over targets)."""
    data, criterion = view.built.context.data, view.built.context.criterion
    inside = membership.per_sample_losses(
        model, data.x_train[members], data.y_train[members], criterion=criterion
    )
    outside = membership.per_sample_losses(
        model, data.x_test[others], data.y_test[others], criterion=criterion
    )
    return inside, outside


def _membership(view: RunView, budget: Budget, seed: int) -> dict[str, Any]:
    model, state = view.released_model()
    data = view.built.context.data
    generator = torch_rng(seed, "membership")
    count = min(budget.membership_samples, len(data.x_train), len(data.x_test))
    members = torch.randperm(len(data.x_train), generator=generator)[:count]
    others = torch.randperm(len(data.x_test), generator=generator)[:count]
    return membership.loss_threshold_attack(*_losses(view, _Bound(model, state), members, others))


def _reference_model(view: RunView, model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget: Budget,
                     seed: int) -> nn.Module:  # fmt: skip
    """Watson et al.'s reference: the run's architecture from its initial weights, trained centrally with
    the run's loss and step size on the attacker's own data (never the run's members)."""
    reference = copy.deepcopy(model)
    reference.train()
    criterion = view.built.context.criterion
    lr = float(getattr(getattr(view.config.algorithm, "optimizer", None), "lr", 0.05))
    optimiser = torch.optim.SGD(reference.parameters(), lr=lr)
    generator = torch_rng(seed, "membership-reference")
    for _ in range(budget.reference_epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 32):
            batch = order[start : start + 32]
            optimiser.zero_grad()
            criterion(reference(x[batch]), y[batch]).mean().backward()
            optimiser.step()
    return reference


def _membership_calibrated(view: RunView, budget: Budget, seed: int) -> dict[str, Any]:
    model, state = view.released_model()
    data = view.built.context.data
    generator = torch_rng(seed, "membership")
    split = torch.randperm(len(data.x_test), generator=generator)
    own, outside = split[: len(split) // 2], split[len(split) // 2 :]  # the attacker's data; non-members
    count = min(budget.membership_samples, len(data.x_train), len(outside))
    members, others = torch.randperm(len(data.x_train), generator=generator)[:count], outside[:count]
    reference = _reference_model(view, model, data.x_test[own], data.y_test[own], budget, seed)
    target = _losses(view, _Bound(model, state), members, others)
    calibrated = membership.calibrated_attack(*target, *_losses(view, reference, members, others))
    return {**calibrated, "reference_samples": float(len(own))}


ATTACKS: dict[str, Attack] = {
    "label_norm": Attack(
        "Li et al., ICLR 2022 (norm attack)",
        "whoever sees the cut gradients (a client, a downlink eavesdropper) scores labels by their norm",
        "ROC AUC of the norm for the labels",
        _label_norm,
    ),
    "label_direction": Attack(
        "Li et al., ICLR 2022 (direction attack)",
        "the same observer knows one labelled sample per class and labels the rest by cosine similarity",
        "accuracy, and the ROC AUC of cosine similarity for same-label pairs",
        _label_direction,
    ),
    "decoder": Attack(
        "He, Zhang & Lee, ACSAC 2019 (learned inversion)",
        "a curious server with the client model and auxiliary test data trains a decoder from smashed data",
        "PSNR and SSIM of the reconstructions of recorded samples",
        _decoder,
    ),
    "inversion": Attack(
        "He, Zhang & Lee, ACSAC 2019 (white-box inversion); UnSplit, Erdogan et al., WPES 2022",
        "a curious server that knows the client model finds the input whose smashed data matches",
        "PSNR and SSIM of the reconstructions",
        _inversion,
    ),
    "gradient_inversion": Attack(
        "Geiping et al., NeurIPS 2020 (cosine objective); iDLG, Zhao et al. 2020 (labels)",
        "an honest-but-curious FedAvg server inverts a client's update, knowing the global model and lr",
        "PSNR of the matched reconstructions; share of labels right",
        _gradient_inversion,
    ),
    "tokens": Attack(
        "He, Zhang & Lee, ACSAC 2019; Song & Raghunathan, CCS 2020 (embedding inversion)",
        "a curious server maps an LM's hidden states at the cut back to the client's token embeddings",
        "token accuracy against the most frequent token's share",
        _tokens,
    ),
    "membership": Attack(
        "Yeom et al., CSF 2018 (loss threshold)",
        "anyone holding the final model tells training samples from others by their loss",
        "ROC AUC, TPR at 1 % FPR, advantage",
        _membership,
    ),
    "membership_calibrated": Attack(
        "Watson et al., ICLR 2022 (difficulty calibration)",
        "the same, scoring each sample's loss against a reference model the attacker trains on its own data",
        "ROC AUC, TPR at 1 % FPR, advantage",
        _membership_calibrated,
    ),
}


NEEDS = {  # the record key each attack reads (membership: the final model)
    "label_norm": "cut/cut_gradients",
    "label_direction": "cut/cut_gradients",
    "decoder": "cut/smashed",
    "inversion": "cut/smashed",
    "gradient_inversion": "updates/client",
}


def applicable(view: RunView) -> list[str]:
    """The attacks the run's records and model allow."""
    held = set().union(*(view.keys(t) for t in view.recorded))
    names = [name for name, key in NEEDS.items() if key in held]
    if view.config.model.name in LANGUAGE_MODELS:  # tokens, not images, cross its cut
        images = ("decoder", "inversion")
        names = [name for name in names if name not in images] + ["tokens"] * ("cut/smashed" in held)
    single = view.config.algorithm.name in ("fedavg", *SPLIT_MODELS)
    final = single and (view.run_dir / results.CHECKPOINT).is_file()
    return names + (["membership", "membership_calibrated"] if final else [])


def attack(
    run_dir: Path | str,
    names: list[str] | None = None,
    seed: int = 0,
    rounds: list[int] | None = None,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """Run the attacks ``names`` (default: every one the run allows) on the run in ``run_dir`` and merge
    their figures into its ``attacks.json`` (written atomically; an image grid per reconstruction attack
    beside it); the figures of this call, by attack."""
    unknown = [name for name in names or () if name not in ATTACKS]
    if unknown:
        raise AttackError(f"--attack: unknown attack {unknown[0]!r}; known: {', '.join(ATTACKS)}")
    view, budget = RunView(Path(run_dir), rounds), budget or Budget()
    view.config  # a bad directory is refused before any attack runs  # noqa: B018
    if names is None:
        names = applicable(view)
        if not names:
            raise AttackError(f"{view.run_dir}: recorded nothing to attack (output.record) and has no model")
    found: dict[str, Any] = {}
    for name in names:
        spec = ATTACKS[name]
        began = time.perf_counter()
        figures = spec.run(view, budget, seed)
        images = figures.pop("_images", None)
        figures.update(seconds=round(time.perf_counter() - began, 3), seed=seed, paper=spec.paper,
                       threat_model=spec.threat, metric=spec.metric)  # fmt: skip
        if images is not None:
            figures["images"] = write_grid(view.run_dir / f"attack-{name}.png", *images)
        found[name] = figures
    path = view.run_dir / ATTACKS_FILE
    held = json.loads(path.read_text()) if path.is_file() else {}
    held.update(found)
    results.write_json(path, held)
    summary_path = view.run_dir / results.SUMMARY
    if summary_path.is_file():  # the headline figures beside the run's MB, joules and epsilon
        summary = json.loads(summary_path.read_text())
        summary["attacks"] = {name: headline(figures) for name, figures in held.items()}
        results.write_json(summary_path, summary)
    return found


def headline(figures: dict[str, Any]) -> dict[str, float]:
    """An attack's figures that are single numbers (no seed, no seconds): what the summary shows."""
    skipped = ("seconds", "seed", "samples", "round")
    return {k: v for k, v in figures.items() if isinstance(v, float) and k not in skipped}
