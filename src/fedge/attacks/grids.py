"""Image grids of a reconstruction attack: each original above its reconstruction (matplotlib, PNG)."""

from __future__ import annotations

from pathlib import Path

import torch

from fedge.attacks.metrics import as_images
from fedge.files import results

SHOWN = 16  # pairs in a grid


def write_grid(path: Path, original: torch.Tensor, rebuilt: torch.Tensor) -> str:
    """Write up to 16 originals (top row) over their reconstructions (bottom row) to ``path`` atomically;
    the file's name (what ``attacks.json`` points to)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    a, b = as_images(original[:SHOWN]).float(), as_images(rebuilt[:SHOWN]).float()
    low, high = float(a.min()), float(a.max())
    figure, axes = plt.subplots(2, len(a), figsize=(0.9 * len(a), 2.0), squeeze=False)
    for column, (top, bottom) in enumerate(zip(a, b, strict=True)):
        for row, image in enumerate((top, bottom)):
            shown = image.permute(1, 2, 0).squeeze(-1) if image.shape[0] in (1, 3) else image[0]
            axes[row][column].imshow(shown.clamp(low, high).numpy(), cmap="gray", vmin=low, vmax=high)
            axes[row][column].axis("off")
    axes[0][0].set_title("original", fontsize=7, loc="left")
    axes[1][0].set_title("reconstructed", fontsize=7, loc="left")
    figure.tight_layout(pad=0.2)

    def save(handle) -> None:  # type: ignore[no-untyped-def]
        figure.savefig(handle, format="png", dpi=100)

    results.atomic_write(path, save)
    plt.close(figure)
    return path.name
