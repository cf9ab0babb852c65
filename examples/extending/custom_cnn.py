"""Your own CNN on your own numpy arrays: FedAvg, then CSE-FSL cut after the CNN's second block."""

import numpy as np
import torch
from torch import nn

import fedge

# Your data: any arrays of images and integer labels (here 600 random 1x12x12 images, 4 classes).
rng = np.random.default_rng(0)
labels = rng.integers(0, 4, 600)
images = rng.normal(size=(600, 1, 12, 12)).astype(np.float32)
images[np.arange(600), 0, labels * 3, :] += 2.0  # each class brightens its own row: learnable
train, test = (images[:500], labels[:500]), (images[500:], labels[500:])

# Your model: an nn.Sequential of named blocks (the names are where split learning may cut).
torch.manual_seed(0)
cnn = nn.Sequential()
cnn.add_module("block1", nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)))
cnn.add_module("block2", nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)))
cnn.add_module("head", nn.Sequential(nn.Flatten(), nn.Linear(16 * 3 * 3, 4)))

CONFIG = """
rounds: 3
partition: {kind: dirichlet, num_clients: 5, alpha: 0.5}
algorithm: {name: fedavg, batch_size: 20, optimizer: {kind: adam, lr: 0.01}}
output: {dir: runs/guide, plots: false}
"""


def main() -> dict[str, fedge.Result]:
    fedavg = fedge.run(CONFIG, model=cnn, train=train, test=test)
    cnn.cut = "block2"  # clients run block1 and block2; the server runs the head
    cse = fedge.run(CONFIG, ["algorithm.name=cse_fsl", "algorithm.h=2"], model=cnn, train=train, test=test)
    return {"fedavg": fedavg, "cse_fsl": cse}


if __name__ == "__main__":
    for name, result in main().items():
        print(name, result.summary["final_accuracy"], f"{result.summary['mb_total']:.2f} MB")
