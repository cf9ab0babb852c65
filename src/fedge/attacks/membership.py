"""Membership inference on a final model: was this sample in the training set?

Threat model. The attacker holds the released model (a run's final global model, which every client
and any later user receives) and a sample with its label, and queries the model's loss on it. A model
fits its training samples better than unseen ones, so a low loss hints at membership.

Two attacks:

- Loss threshold (Yeom et al., "Privacy Risk in Machine Learning: Analyzing the Connection to
  Overfitting", IEEE CSF 2018): the negative loss is the membership score.
- Difficulty calibration (Watson et al., "On the Importance of Difficulty Calibration in Membership
  Inference Attacks", ICLR 2022): some samples are easy for any model, so the score is the loss
  drop from a reference model trained without the sample (say on the attacker's auxiliary data) to
  the target model. The attacker additionally needs such a reference model.

Success metrics: ROC AUC; the true-positive rate at 1 % false positives, the low-FPR regime that
Carlini et al. ("Membership Inference Attacks From First Principles", IEEE S&P 2022) argue matters;
and the membership advantage, the largest TPR - FPR over thresholds (Yeom et al.'s measure).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from sklearn.metrics import roc_curve
from torch import nn

from fedge.attacks.metrics import roc_auc, tpr_at_fpr


def per_sample_losses(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 512,
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Each sample's loss under ``model`` (inputs to logits), in eval mode and without gradients, ``[N]``:
    ``criterion`` (a per-sample loss, such as a run's, which gives a sequence its mean over its targets)
    or plain cross-entropy; the model's training mode is restored afterwards."""
    loss = criterion or (lambda logits, target: nn.functional.cross_entropy(logits, target, reduction="none"))
    if len(x) != len(y):
        raise ValueError(f"{len(x)} inputs for {len(y)} labels")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            losses = [
                loss(model(x[start : start + batch_size]), y[start : start + batch_size])
                for start in range(0, len(x), batch_size)
            ]
    finally:
        model.train(training)
    return torch.cat(losses) if losses else torch.zeros(0)


def loss_threshold_attack(member_losses: torch.Tensor, nonmember_losses: torch.Tensor) -> dict[str, float]:
    """Yeom et al.'s attack: score ``-loss``; ``auc``, ``tpr_at_1pct_fpr``, ``advantage`` and the counts."""
    return _figures(-member_losses, -nonmember_losses)


def calibrated_attack(
    member_losses: torch.Tensor,
    nonmember_losses: torch.Tensor,
    member_reference: torch.Tensor,
    nonmember_reference: torch.Tensor,
) -> dict[str, float]:
    """Watson et al.'s calibrated attack: score = reference model's loss - target model's loss (the
    reference trained without the samples); the same figures as :func:`loss_threshold_attack`."""
    if member_reference.shape != member_losses.shape or nonmember_reference.shape != nonmember_losses.shape:
        raise ValueError("reference losses must match the target losses sample for sample")
    return _figures(member_reference - member_losses, nonmember_reference - nonmember_losses)


def _figures(member_scores: torch.Tensor, nonmember_scores: torch.Tensor) -> dict[str, float]:
    """The success figures of membership scores (higher: more likely a member)."""
    members, nonmembers = member_scores.reshape(-1), nonmember_scores.reshape(-1)
    if len(members) == 0 or len(nonmembers) == 0:
        raise ValueError("membership inference needs at least one member and one non-member")
    scores = torch.cat([members, nonmembers]).detach().double().cpu().numpy()
    positives = np.concatenate([np.ones(len(members)), np.zeros(len(nonmembers))])
    false, true, _ = roc_curve(positives, scores)
    return {
        "auc": roc_auc(scores, positives),
        "tpr_at_1pct_fpr": tpr_at_fpr(scores, positives, 0.01),
        "advantage": float((true - false).max()),
        "members": float(len(members)),
        "nonmembers": float(len(nonmembers)),
    }
