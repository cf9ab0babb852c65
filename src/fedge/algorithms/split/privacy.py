"""A split run's privacy at the cut (``privacy.cut``, ``privacy.labels``): the mechanisms of
:mod:`fedge.privacy.cut` applied where the data crosses, and the releases they make.

Smashed data is clipped on the client (inside the trunk's forward pass, so a SplitFed client's own
backward pass goes through the clip as computed) and noised as it is sent; the cut gradient is clipped
and noised as the server returns it; the labels the server sees are one randomized response per sample
for the whole run. Every draw is keyed by (round, client, draw of the client in the round, its run in
the round, step), so both executors and any split of the rows over processes add the same noise. The
releases are counted exactly from the round's batch plan and upload schedule: per client and round,
the most times any of its samples crossed the cut.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedge.algorithms.base import Context
from fedge.config import CutDPConfig, LabelDPConfig
from fedge.errors import ConfigError
from fedge.privacy.cut import add_row_noise, clip_rows, label_release, most_sends, randomized_response
from fedge.privacy.release import GAUSSIAN, Release
from fedge.privacy.run import RunPrivacy

SMASHED = "smashed"
CUT_GRADIENT = "cut_gradient"


class CutPrivacy:
    """The cut's mechanisms for one run (built only when ``privacy.cut`` or ``privacy.labels`` is set)."""

    def __init__(self, ctx: Context, cut: CutDPConfig | None, labels: LabelDPConfig | None):
        self.privacy: RunPrivacy = ctx.privacy
        self.cut, self.labels = cut, labels
        self.labelled: set[int] = set()  # clients whose label release is recorded (checkpointed)
        self.runs: dict[tuple[int, int], int] = {}  # (round, client) -> local runs begun in the round
        data = ctx.data
        self.classes = data.num_classes
        if labels is not None and data.y_train.dim() != 1:
            raise ConfigError("privacy.labels", "randomized response needs class labels, not token targets")
        self.sent_labels = data.y_train
        if labels is not None:  # one draw per sample for the whole run, keyed by the sample's index
            gen = self.privacy.generator("labels")
            self.sent_labels = randomized_response(data.y_train, labels.epsilon, self.classes, gen)

    @classmethod
    def of(cls, ctx: Context) -> CutPrivacy | None:
        """The run's cut privacy, or None when neither mechanism is configured."""
        config = ctx.config.privacy
        if config.cut is None and config.labels is None:
            return None
        return cls(ctx, config.cut, config.labels)

    @property
    def smashed_clip(self) -> float | None:
        """The L2 bound of one sample's smashed data (None: sent as computed)."""
        return None if self.cut is None else self.cut.clip

    def noise_multiplier(self) -> float:
        """The smashed data's noise multiplier (configured, or calibrated to ``privacy.target_epsilon``)."""
        assert self.cut is not None
        return self.privacy.multiplier(self.cut.noise_multiplier, "privacy.cut.noise_multiplier")

    def begin(self, t: int, clients: np.ndarray) -> None:
        """A local run of ``clients`` begins in round ``t``: a client's second run in one round
        (asynchronous CSE-FSL dispatches a client again once it is back) draws other noise."""
        self.runs = {key: n for key, n in self.runs.items() if key[0] == t}
        for c in np.unique(clients).tolist():
            self.runs[t, c] = self.runs.get((t, c), -1) + 1

    def _keys(self, t: int, clients: np.ndarray, occurrence: np.ndarray, step: int) -> list[tuple[int, ...]]:
        runs = self.runs
        return [
            (t, int(c), int(k), runs.get((t, int(c)), 0), step)
            for c, k in zip(clients, occurrence, strict=True)
        ]

    def smashed(
        self,
        t: int,
        clients: np.ndarray,
        occurrence: np.ndarray,
        step: int,
        z: torch.Tensor,
        counts: torch.Tensor,
    ) -> torch.Tensor:
        """Rows ``z`` (of ``clients``, already clipped) with the smashed data's Gaussian noise."""
        if self.cut is None:
            return z
        std = self.noise_multiplier() * self.cut.clip
        return add_row_noise(z, counts, std, self.privacy, SMASHED, self._keys(t, clients, occurrence, step))

    def gradient(
        self,
        t: int,
        clients: np.ndarray,
        occurrence: np.ndarray,
        step: int,
        g: torch.Tensor,
        counts: torch.Tensor,
    ) -> torch.Tensor:
        """Rows ``g`` of cut gradients clipped per sample and noised (as computed: no ``gradient_clip``)."""
        if self.cut is None or self.cut.gradient_clip is None:
            return g
        clip = self.cut.gradient_clip
        std = self.cut.gradient_noise_multiplier * clip
        keys = self._keys(t, clients, occurrence, step)
        return add_row_noise(clip_rows(g, clip, lead=2), counts, std, self.privacy, CUT_GRADIENT, keys)

    def record(self, t: int, clients: np.ndarray, smashed: np.ndarray, returned: np.ndarray) -> None:
        """Round ``t``'s releases: ``smashed`` (``[rows, ...]``, -1 padded) are the samples each row (of
        client ``clients[r]``) sent across the cut, ``returned`` those whose cut gradient came back."""
        cut, privacy = self.cut, self.privacy
        if cut is not None:
            z = self.noise_multiplier()
            for client, count in most_sends(clients, smashed).items():
                privacy.record(
                    Release(t, SMASHED, "sample", GAUSSIAN, z, cut.clip, count=count, clients=(client,))
                )
            if cut.gradient_clip is not None:
                g, clip = cut.gradient_noise_multiplier, cut.gradient_clip
                for client, count in most_sends(clients, returned).items():
                    release = Release(
                        t, CUT_GRADIENT, "sample", GAUSSIAN, g, clip, count=count, clients=(client,)
                    )
                    privacy.record(release)
        if self.labels is not None:
            for client in sorted(set(most_sends(clients, smashed)) - self.labelled):
                self.labelled.add(client)
                privacy.record(label_release(t, self.labels.epsilon, self.classes, client))

    def state_dict(self) -> dict[str, list[int]]:
        """The clients whose labels went out already (a resumed run records their release no more)."""
        return {"labelled": sorted(self.labelled)}

    def load_state_dict(self, state: dict[str, Sequence[int]]) -> None:
        self.labelled = {int(c) for c in state["labelled"]}


def sent_indices(index: torch.Tensor, weight: torch.Tensor, steps: Sequence[int]) -> np.ndarray:
    """The samples each row sends at ``steps`` of a plan (``index``/``weight`` ``[rows, steps, batch]``),
    ``-1`` where a position holds no real sample: ``[rows, len(steps) * batch]``."""
    rows = index.shape[0]
    if not steps:
        return np.full((rows, 0), -1, dtype=np.int64)
    chosen = list(steps)
    picked = torch.where(weight[:, chosen] > 0, index[:, chosen], -1)
    return picked.reshape(rows, -1).cpu().numpy()
