"""Clients that lie in split learning (the ``adversary`` block of CSE-FSL, SplitFed v1 and v2, FSL_AN
and FSL-SAGE): what a malicious client sends across the cut, and the client model it uploads.

A split client sends the server three things, and a malicious one poisons one of them (the attack
surfaces that Xie and Lyu, "HealSplit", 2025, list for split federated learning: smashed data, labels
and model weights; Khan et al., "Security analysis of SplitFed learning", 2022, measure model poisoning
there):

- its smashed data, at every upload (``smashed_noise``, ``smashed_flip``): the server part (one shared
  model in CSE-FSL, SplitFed v2 and FSL-SAGE, the client's own server copy in SplitFed v1 and FSL_AN)
  trains on what it receives;
- the labels sent with them (``label_flip``, ``y -> C - 1 - y`` as at a star server, Tolpegin et al.
  2020): the client trains on the same flipped labels, so its aux head (CSE-FSL, FSL_AN) or aux model
  (FSL-SAGE) learns the flipped task too, and CSE-FSL's server pass sends them as well;
- its training data (``backdoor``, :mod:`fedge.runtime.backdoor`): it trains on its stamped view, so its
  stamped smashed data and target labels reach the server part (and CSE-FSL's server pass draws over
  that view); ``scale`` boosts its uploaded client model, and each evaluation adds the composed model's
  ``attack_success``;
- its client-side model, uploaded to the server's client-model average: the star family's model
  poisoning (:func:`~fedge.runtime.adversary.poisoned`) on the uploaded rows, after the server decoded
  them and before its aggregation pipeline, the round's broadcast client model as the reference.

The cut attacks replace row ``r``'s real entries ``z_r`` (its first ``counts[r]`` samples) after the
client computed them (and ``privacy.cut`` noised them), before the link encodes them:

- ``smashed_noise``: ``z_r + sigma s_r N(0, 1)`` per value, ``s_r`` the standard deviation of the row's
  smashed values, so the noise is at the activations' own scale (Blanchard et al. 2017's Gaussian
  Byzantine worker moved to the cut; ``sigma``, 1), drawn from ``(seed, "adversary-smashed", round,
  client, occurrence, step)`` (occurrence: the client's earlier rows in the round; step -1: CSE-FSL's
  server pass), so both executors and any order of serving draw alike;
- ``smashed_flip``: ``-scale z_r`` (the reversed-sign worker at the cut; ``scale``, 1).

Under torchrun (the round's rows spread over processes) each process poisons its own rows and gets the
one-process numbers: the cut attacks read only the row's own smashed data (``s_r`` included) and draw by
client, ``label_flip`` is a data view every process builds, and the model-poisoning attacks use the
round's counts (:meth:`~fedge.runtime.adversary.Adversary.poison` with the round's cohort). Only the
omniscient ones (``alie``, ``ipm``, ``min_max``, ``min_sum``) gather: per round that attacks, one
all-gather of the honest rows' uploaded client-model parts (the trunk, and the aux head where it is
averaged), ``H x d`` values (``H`` honest rows, ``d`` those parts' floating entries; ``4 H d`` bytes at
fp32) held by every process, plus one all-gather of the row counts. Nothing else is gathered for the
adversary; a robust reducer gathers every row itself.

Deployed (:mod:`fedge.deploy.split_rounds`) each attack happens where it does here: a malicious node
trains on and sends its flipped labels and poisons its smashed data before sending it (here: before the
up link encodes it), with the same draws (:meth:`fedge.deploy.node.Node.sent_smashed`); the server app
poisons the uploaded client models at receipt, before its pipeline.
"""

from __future__ import annotations

import numpy as np
import torch

from fedge.config import CUT_ATTACKS
from fedge.distributed import Cohort
from fedge.errors import ConfigError
from fedge.rng import torch_rng
from fedge.runtime.adversary import DEFAULTS, Adversary
from fedge.runtime.context import Context
from fedge.tensors import Tensors

MODEL_ATTACKS: tuple[str, ...] = ("sign_flip", "scaling", "gaussian", "free_rider", "alie", "ipm")
MODEL_ATTACKS += ("min_max", "min_sum", "backdoor")  # a backdoor's scale boosts the uploaded client model
"""The attacks on the uploaded client model (the others act at the cut or on the labels)."""


def smashed(
    attack: str,
    options: dict[str, float],
    z: torch.Tensor,
    counts: torch.Tensor,
    bad: np.ndarray,
    noise: list[torch.Generator] | None = None,
) -> torch.Tensor:
    """``z`` (``[R, B, ...]``, row r's first ``counts[r]`` entries real) with the real entries of the rows
    where ``bad`` is set replaced by ``attack``'s (see the module); ``noise``: one generator per such
    row, for ``smashed_noise``."""
    rows = np.flatnonzero(bad)
    if not len(rows):
        return z
    out = z.detach().clone()  # what is sent: the server never back-propagates into the client's graph
    for i, r in enumerate(rows.tolist()):
        real = out[r, : int(counts[r])]
        if not real.numel():
            continue
        if attack == "smashed_flip":
            out[r, : len(real)] = -float(options.get("scale", DEFAULTS["scale"])) * real
            continue
        if noise is None or len(noise) != len(rows):
            raise ValueError("smashed_noise needs one generator per malicious row")
        sigma = float(options.get("sigma", DEFAULTS["sigma"]))
        spread = real.std(correction=0)
        draw = torch.randn(real.shape, generator=noise[i], device=real.device, dtype=real.dtype)
        out[r, : len(real)] = real + sigma * spread * draw
    return out


class SplitAdversary(Adversary):
    """The run's malicious split clients (:class:`~fedge.runtime.adversary.Adversary`): their smashed
    data at the cut, their flipped labels and their uploaded client models."""

    @classmethod
    def of_run(cls, ctx: Context) -> SplitAdversary | None:
        """The run's adversary (``None`` without an ``adversary`` block); ``label_flip`` is refused with
        ``privacy.labels`` (the server would see a randomized response of the clean labels, not the
        flipped ones a malicious client trains on)."""
        config = ctx.config
        if config.adversary is not None and config.adversary.attack == "label_flip" and config.privacy.labels:
            raise ConfigError("adversary.attack", "label_flip sends its own labels; drop privacy.labels")
        adversary = cls.of(config.adversary, ctx.data, ctx.seed, ctx.cohorts.processes, spread=True)
        assert adversary is None or isinstance(adversary, SplitAdversary)
        return adversary

    def smashed(
        self,
        round_: int,
        clients: np.ndarray,
        occurrence: np.ndarray,
        step: int,
        z: torch.Tensor,
        counts: torch.Tensor,
    ) -> torch.Tensor:
        """Rows ``z`` (of ``clients``, their ``occurrence`` in the round) at local step ``step`` as the
        attacking ones send them (unchanged under the other attacks)."""
        attack = self.config.attack
        if attack not in CUT_ATTACKS:
            return z
        bad = self.mask(round_, clients)
        noise = None
        if attack == "smashed_noise":
            noise = [
                torch_rng(self.seed, "adversary-smashed", round_, int(c), int(k), step, device=z.device)
                for c, k in zip(clients[bad], occurrence[bad], strict=True)
            ]
        return smashed(attack, self.config.options, z, counts, bad, noise)

    def poison(
        self,
        round_: int,
        clients: np.ndarray,
        rows: Tensors,
        reference: Tensors,
        cohort: Cohort | None = None,
    ) -> Tensors:
        """The uploaded client-model ``rows`` (of ``clients``) with the attacking rows replaced, under a
        model-poisoning attack (unchanged under the others)."""
        if self.config.attack not in MODEL_ATTACKS:
            return rows
        return super().poison(round_, clients, rows, reference, cohort)
