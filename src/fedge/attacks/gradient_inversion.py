"""Training images back from a FedAvg client's update: gradient inversion by a curious server.

Papers. Zhu, Liu & Han, "Deep leakage from gradients" (NeurIPS 2019), recover a client's batch by
optimising dummy inputs until their gradient matches the shared one. Zhao, Mopuri & Bilen, "iDLG"
(2020), read the label of a single sample off the last layer's gradient: under cross-entropy the
true class is the only one whose logit gradient is negative. Geiping, Bauermeister, Dröge & Moeller,
"Inverting gradients" (NeurIPS 2020), match the gradient's direction rather than its size (cosine
distance), add a total-variation prior, and take signed Adam steps with a decaying step size.
Wainakh et al., "User-level label leakage from gradients in federated learning" (PETS 2022), count a
batch's labels far better than the simple heuristic of :func:`infer_labels`.

Threat model. The attacker is the server, honest but curious: it runs FedAvg as specified and sees
each client's update ``new - global``. It knows the global model the client started from (it sent
it), the model's architecture, the loss (cross-entropy) and the local step size ``lr``. After one
local SGD step on one batch the update is exactly ``-lr`` times that batch's gradient
(:func:`gradient_from_update`); after several steps or epochs the same division gives only an
approximation (the gradients along the client's path, summed), and the attack recovers a blurred
average of the batches.

Success metric. PSNR and SSIM (:mod:`fedge.attacks.metrics`) of each reconstruction against its
original after :func:`fedge.attacks.metrics.match_reconstructions` has paired them (a batch's
gradient does not say which dummy is which sample), and whether the inferred labels are right.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedge.attacks.metrics import reads_as_image, total_variation


def gradient_from_update(update: dict[str, torch.Tensor], lr: float) -> dict[str, torch.Tensor]:
    """The gradient a one-step SGD update ``new - old = -lr * g`` came from: ``-update / lr``."""
    if lr <= 0:
        raise ValueError(f"lr must be positive, got {lr}")
    return {name: -delta / lr for name, delta in update.items()}


def infer_labels(last_grad: torch.Tensor, count: int) -> torch.Tensor:
    """The labels of a batch of ``count`` samples, from the gradient of the last layer's weight
    ``[classes, features]`` (summed over features) or bias ``[classes]``.

    Assumes cross-entropy on the last layer's logits and non-negative inputs to that layer (after a
    ReLU or sigmoid): a sample's weight gradient row ``(p_c - y_c) h`` is then negative only for its own
    class, so the classes present are the negative rows. A single sample's label is the negative row;
    a batch takes the ``count`` most negative rows, and when fewer rows are negative than ``count`` it
    hands the surplus labels out by magnitude (each next one to the row whose magnitude per label
    stays largest with it, D'Hondt's rule). This is the simple count heuristic; Wainakh et al. (2022) estimate
    counts much better. With larger batches of a barely trained model a class held by one sample can
    show a positive row (the other samples' softmax mass on it outweighs its own pull) and be missed.
    """
    if count < 1:
        raise ValueError(f"count must be positive, got {count}")
    if last_grad.dim() not in (1, 2):
        raise ValueError(f"last_grad must be [classes, features] or [classes], got {tuple(last_grad.shape)}")
    scores = last_grad.detach().double()
    scores = scores.sum(1) if scores.dim() == 2 else scores
    negative = torch.nonzero(scores < 0).flatten()
    if len(negative) == 0:
        raise ValueError("no row of the last layer's gradient is negative: labels cannot be inferred")
    magnitude = -scores[negative]
    by_magnitude = negative[magnitude.argsort(descending=True)]
    if len(negative) >= count:
        return by_magnitude[:count].long()
    labels = negative.tolist()
    given = torch.ones(len(negative), dtype=torch.float64)
    for _ in range(count - len(negative)):
        pick = int((magnitude / (given + 1)).argmax())
        given[pick] += 1
        labels.append(int(negative[pick]))
    return torch.tensor(labels, dtype=torch.long)


def _check(
    params: dict[str, torch.Tensor],
    target: dict[str, torch.Tensor],
    labels: torch.Tensor,
    steps: int,
    lr: float,
    tv_weight: float,
    bounds: tuple[float, float],
    restarts: int,
) -> None:
    if not target:
        raise ValueError("target holds no gradient")
    for name, grad in target.items():
        if name not in params:
            raise ValueError(f"target key {name!r} is not a parameter")
        if grad.shape != params[name].shape:
            raise ValueError(
                f"target {name!r} has shape {tuple(grad.shape)}, not {tuple(params[name].shape)}"
            )
    if labels.dim() != 1 or len(labels) == 0 or labels.dtype != torch.long:
        raise ValueError("labels must be a non-empty 1-d LongTensor")
    if steps < 1 or restarts < 1 or lr <= 0 or tv_weight < 0:
        raise ValueError("steps and restarts must be positive, lr positive and tv_weight non-negative")
    if not bounds[0] < bounds[1]:
        raise ValueError(f"bounds must be (low, high) with low < high, got {bounds}")


def invert_gradients(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    target: dict[str, torch.Tensor],
    x_shape: tuple[int, ...],
    labels: torch.Tensor,
    *,
    steps: int,
    lr: float,
    tv_weight: float,
    bounds: tuple[float, float],
    generator: torch.Generator,
    restarts: int = 1,
) -> torch.Tensor:
    """A batch of ``len(labels)`` inputs whose cross-entropy gradient at ``params`` points along
    ``target`` (Geiping et al.'s cosine objective over all of ``target``'s parameters flattened
    together, plus ``tv_weight`` times the total variation for image inputs).

    Each restart draws dummy inputs uniformly in ``bounds`` from ``generator`` and takes ``steps``
    signed Adam steps, the step size cut tenfold at 3/8, 5/8 and 7/8 of them, the inputs clamped into
    ``bounds``; the restart with the lowest final objective wins. Parameters missing from ``target``
    are frozen and left out. The model is called as it is (no dropout or batch norm expected).
    """
    _check(params, target, labels, steps, lr, tv_weight, bounds, restarts)
    low, high = float(bounds[0]), float(bounds[1])
    names = list(target)
    frozen = {name: value.detach() for name, value in params.items() if name not in target}
    goal = torch.cat([target[name].detach().flatten() for name in names])
    use_tv = tv_weight > 0 and reads_as_image(tuple(x_shape))

    def objective(x: torch.Tensor, create_graph: bool) -> torch.Tensor:
        live = {name: params[name].detach().requires_grad_(True) for name in names}
        loss = F.cross_entropy(functional_call(model, {**frozen, **live}, (x,)), labels)
        grads = torch.autograd.grad(loss, [live[name] for name in names], create_graph=create_graph)
        flat = torch.cat([grad.flatten() for grad in grads])
        value = 1 - F.cosine_similarity(flat, goal, dim=0)
        return value + tv_weight * total_variation(x).mean() if use_tv else value

    milestones = [steps * 3 // 8, steps * 5 // 8, steps * 7 // 8]
    finals: list[tuple[float, torch.Tensor]] = []
    for _ in range(restarts):
        start = low + (high - low) * torch.rand((len(labels), *x_shape), generator=generator)
        x = start.requires_grad_(True)
        optimiser = torch.optim.Adam([x], lr=lr)
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimiser, milestones, gamma=0.1)
        for _ in range(steps):
            (step,) = torch.autograd.grad(objective(x, create_graph=True), [x])
            x.grad = step.sign()
            optimiser.step()
            schedule.step()
            with torch.no_grad():
                x.clamp_(low, high)
        finals.append((float(objective(x, create_graph=False).detach()), x.detach()))
    return min(finals, key=lambda final: final[0])[1]
