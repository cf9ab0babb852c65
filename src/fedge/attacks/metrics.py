"""The success metrics the attacks report: PSNR and SSIM of reconstructed images (torchmetrics'
maintained implementations), ROC AUC and the true-positive rate at a low false-positive rate
(scikit-learn's), and the matching of a batch's reconstructions to its originals."""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import roc_auc_score, roc_curve
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

SSIM_WINDOW = 11  # Wang et al. (2004)'s Gaussian window; smaller images: the largest odd one that fits


def as_images(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a ``[N, C, H, W]`` batch: ``[N, H, W]`` gains a channel, ``[N, D]`` with a square ``D`` is
    read as one-channel ``sqrt(D) x sqrt(D)`` images (flattened inputs such as an MLP's)."""
    if x.dim() == 4:
        return x
    if x.dim() == 3:
        return x.unsqueeze(1)
    side = int(round(x.shape[1] ** 0.5))
    if x.dim() != 2 or side * side != x.shape[1]:
        raise ValueError(f"inputs of shape {tuple(x.shape[1:])} are not images")
    return x.reshape(-1, 1, side, side)


def reads_as_image(x_shape: tuple[int, ...]) -> bool:
    """Whether inputs of shape ``x_shape`` read as images (:func:`as_images`)."""
    try:
        as_images(torch.zeros(1, *x_shape))
    except ValueError:
        return False
    return True


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Each image's mean absolute difference between neighbouring pixels (``[N]``): the smoothness prior
    of the inversion attacks (He et al. 2019; Geiping et al. 2020)."""
    images = as_images(x)
    down = (images[..., 1:, :] - images[..., :-1, :]).abs().flatten(1).mean(1)
    right = (images[..., :, 1:] - images[..., :, :-1]).abs().flatten(1).mean(1)
    return down + right


def psnr(original: torch.Tensor, reconstructed: torch.Tensor, data_range: float) -> torch.Tensor:
    """Each image's peak signal-to-noise ratio in dB, ``10 log10(range^2 / MSE)`` (``[N]``)."""
    a, b = as_images(original).float(), as_images(reconstructed).float()
    value = peak_signal_noise_ratio(b, a, data_range=data_range, reduction="none", dim=(1, 2, 3))
    assert isinstance(value, torch.Tensor)
    return value


def ssim(original: torch.Tensor, reconstructed: torch.Tensor, data_range: float) -> torch.Tensor:
    """Each image's structural similarity (Wang et al. 2004) in [-1, 1] (``[N]``); images smaller than the
    11-pixel window (8x8 digits) use the largest odd window that fits."""
    a, b = as_images(original).float(), as_images(reconstructed).float()
    side = min(a.shape[-2:])
    window = min(SSIM_WINDOW, side if side % 2 else side - 1)
    value = structural_similarity_index_measure(
        b, a, data_range=data_range, kernel_size=window, reduction="none"
    )
    assert isinstance(value, torch.Tensor)
    return value


def roc_auc(scores: torch.Tensor | np.ndarray, positives: torch.Tensor | np.ndarray) -> float:
    """The area under the ROC curve of ``scores`` (higher: more likely positive) for the 0/1 ``positives``."""
    return float(roc_auc_score(np.asarray(positives), np.asarray(scores)))


def tpr_at_fpr(
    scores: torch.Tensor | np.ndarray, positives: torch.Tensor | np.ndarray, fpr: float = 0.01
) -> float:
    """The largest true-positive rate at a threshold whose false-positive rate is at most ``fpr`` (the
    low-FPR figure membership-inference work reports, Carlini et al. 2022)."""
    false, true, _ = roc_curve(np.asarray(positives), np.asarray(scores))
    return float(true[false <= fpr].max())


def match_reconstructions(original: torch.Tensor, reconstructed: torch.Tensor) -> torch.Tensor:
    """The order of ``reconstructed`` that best matches ``original`` one to one (least total squared error,
    the Hungarian method): a batch's reconstructions come in no particular order."""
    a, b = original.flatten(1).float(), reconstructed.flatten(1).float()
    cost = torch.cdist(a, b).pow(2).cpu().numpy()
    _, order = linear_sum_assignment(cost)
    return torch.as_tensor(order, dtype=torch.long)
