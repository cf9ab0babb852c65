"""Client-level differential privacy as aggregation stages: DP-FedAvg (McMahan et al., "Learning
differentially private recurrent language models", 2018) with adaptive clipping (Andrew et al.,
"Differentially private learning with adaptive clipping", 2021).

DP-FedAvg bounds what one client can change and hides it in noise: each participant's update (its row's
change from the model it started from, every floating tensor together as one vector) is clipped to L2
norm ``C`` (:class:`Clip`), the server sums the clipped updates, adds Gaussian noise of std ``z C`` and
divides by the cohort size it expects (:class:`Gaussian`). Adding or removing one client moves the sum
by at most ``C``, so each aggregation is a Gaussian mechanism of multiplier ``z`` on the client's whole
data; under Poisson participation (each client independently with probability ``q``) the divisor is
the expected cohort ``q N``, the unbiased estimator whose sensitivity ``C / (q N)`` does not depend on
who was drawn. Every row counts once (uniform weights): a sample-weighted sum would let a client with
more data move it by more than ``C``, and DP-FedAvg's bounded weights serve only to cap that.

The noise can also come from the senders (``mode: distributed``, :class:`GaussianShare`): each of the
``n`` senders adds its own share of std ``z C / sqrt(n)``, keyed by round and sender, so the sum carries
std ``z C`` and a secure-aggregation stage between the shares and the sum reveals only the noisy total
(``secagg`` then closes the pipeline in :class:`Gaussian`'s place, with the same rule:
:func:`expected_cohort_mean` and :func:`record_client_level`).

Each aggregation releases its result once (a client-level Gaussian release per round at a server, one
per cell and edge round at the edge servers of a hierarchy, for that cell's members); an adaptive clip's
noisy count of unclipped updates is a Gaussian release of its own (each client adds at most one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from fedge.aggregation import sites
from fedge.aggregation.means import BlockMean, WeightedMean
from fedge.aggregation.stage import Reducer, Stage, StageRun, Transform
from fedge.aggregation.updates import Part, Updates
from fedge.errors import ConfigError
from fedge.privacy.client_level import COUNT, EDGE, UPDATE
from fedge.privacy.release import GAUSSIAN, Release
from fedge.privacy.run import RunPrivacy
from fedge.tensors import Tensors

NOISED_SITES = (sites.SERVER, sites.EDGE)
"""Where a client-level Gaussian release can be accounted: a star server (its runtime says how it draws
its clients) and an edge server (every member of its cell takes part)."""
SHARE = "update-share"
"""The noise purpose of a sender's distributed share."""
WEIGHTS = ("uniform", "samples")


@dataclass
class _Calls:
    """Counts a stage's aggregations within a round (an edge server aggregates once per edge round), so
    each one's noise has its own key; it starts again every round, so a resumed run counts alike."""

    round: int = -1
    index: int = 0

    def next(self, round_: int) -> int:
        if round_ != self.round:
            self.round, self.index = round_, 0
        else:
            self.index += 1
        return self.index


def _blocks(updates: Updates, part: Part) -> tuple[torch.Tensor, int]:
    """Each row's output (its cell at an edge; 0 at a one-output site) and the number of outputs."""
    rows = part.weights.shape[-1]
    if not updates.per_receiver:
        return torch.zeros(rows, dtype=torch.long, device=part.weights.device), 1
    return part.weights.argmax(dim=0), part.weights.shape[0]


def _floating(part: Part) -> list[str]:
    return [name for name, t in part.rows.items() if t.is_floating_point()]


def _reference_rows(updates: Updates, part: Part, block_of: torch.Tensor, names: list[str]) -> Tensors:
    """The reference each row is measured against: the site's one model, or its own cell's."""
    if updates.reference is None:
        raise ValueError(f"the {updates.site} has no reference model to measure the updates from")
    out = {}
    for name in names:
        ref = updates.reference[name]
        rows = part.rows[name]
        out[name] = ref[block_of.to(ref.device)] if updates.per_receiver else ref.unsqueeze(0).expand_as(rows)
    return out


def _flat(tensors: Tensors, names: list[str]) -> torch.Tensor:
    return torch.cat([tensors[k].reshape(len(tensors[k]), -1) for k in names], dim=1)


def _unflat(flat: torch.Tensor, like: Tensors, names: list[str]) -> Tensors:
    """``[R, D]`` back into tensors shaped like ``like``'s rows (``[R, ...]``)."""
    out, offset = {}, 0
    for k in names:
        size = like[k][0].numel()
        out[k] = flat[:, offset : offset + size].reshape(len(flat), *like[k].shape[1:])
        offset += size
    return out


def _bound(run: StageRun, name: str) -> RunPrivacy | None:
    """The run's privacy side, once the site is one where a client-level release can be accounted
    (refused in one line naming the key). Outside a run (a config check builds every site) there is
    nothing to bind: the stage is then refused only where a run aggregates with it."""
    if run.privacy is None:
        return None
    why = {
        sites.PEER: "peers release their own messages: use privacy.peer",
        sites.CLOUD: "the cloud's rows are cells' models, not clients': put the noise at the edge",
        sites.BUFFER: "an asynchronous buffer's clients arrive unsampled: no sampling analysis covers it",
    }
    if run.site not in NOISED_SITES:
        sites_named = ", ".join(NOISED_SITES)
        raise ConfigError(
            run.key,
            f"{name} cannot be accounted at the {run.site} ({why[run.site]}); set at: [{sites_named}]",
        )
    return run.privacy


def _needed(privacy: RunPrivacy | None, name: str) -> RunPrivacy:
    if privacy is None:
        raise ValueError(f"{name} draws seeded noise and records releases: bind it to a run")
    return privacy


def _sampling(privacy: RunPrivacy, updates: Updates, key: str) -> dict[str, Any]:
    """The sampling a release at ``updates``' site records: the star runtime's draw at a server, none at
    an edge (every member of a cell takes part)."""
    if updates.site == sites.EDGE:
        return {"sampling": "none"}
    drawn = privacy.participation
    if drawn is None:
        raise ConfigError(key, "this algorithm's server does not draw its clients by a star round's sampling")
    if drawn.sampling == "poisson":
        return {"sampling": "poisson", "probability": drawn.probability}
    if drawn.sampling == "without_replacement":
        return {
            "sampling": "without_replacement",
            "population": drawn.population,
            "sample_size": drawn.sample_size,
        }
    return {"sampling": "none"}


def _divisors(privacy: RunPrivacy, updates: Updates, counts: torch.Tensor) -> torch.Tensor:
    """Each output's expected cohort: ``q N`` at a server under Poisson participation, else its rows."""
    drawn = privacy.participation
    if updates.site == sites.SERVER and drawn is not None and drawn.sampling == "poisson":
        return torch.full_like(counts, drawn.probability * drawn.population, dtype=torch.float64)
    return counts.to(torch.float64)


def _members(part: Part, block_of: torch.Tensor, block: int, site: str) -> tuple[int, ...] | None:
    """The clients whose guarantee an output's release spends: all at a server (``None``), the cell's
    senders at an edge."""
    if site != sites.EDGE:
        return None
    if part.senders is None:
        raise ValueError("the edge does not say which clients sent its rows")
    return tuple(sorted(s for s, b in zip(part.senders, block_of.tolist(), strict=True) if b == block))


class Clip(Transform):
    """Each row's change from the reference, over all its floating tensors, clipped to L2 norm ``clip``
    (rows within it come back exactly; the others as reference + clipped change).

    ``weights``: ``samples`` (the default) keeps the site's weights (sample counts at a FedAvg server:
    clipping only to bound the updates, as robustness), ``uniform`` gives every row ``1/n`` of its
    output. With the :class:`Gaussian` reducer (or ``secagg`` summing :class:`GaussianShare`'s rows) the
    weights are uniform whatever this says: it counts every row once, DP-FedAvg's form whose
    sensitivity is ``C / n``. ``adaptive`` moves the bound toward the ``target_quantile`` of the update
    norms after each aggregation (Andrew et al. 2021): ``C <- C exp(-lr (b - target))``, ``b`` the noisy
    share of unclipped rows, counted with Gaussian noise of std ``count_noise_multiplier`` (unset: the
    calibrated multiplier) over the expected cohort.
    """

    def __init__(
        self,
        clip: float = 1.0,
        adaptive: bool = False,
        target_quantile: float = 0.5,
        learning_rate: float = 0.2,
        count_noise_multiplier: float | None = None,
        weights: str = "samples",
    ):
        if not clip > 0:
            raise ValueError("clip must be positive")
        if not 0.0 <= target_quantile <= 1.0:
            raise ValueError("target_quantile is in [0, 1]")
        if learning_rate < 0:
            raise ValueError("learning_rate must be non-negative")
        if count_noise_multiplier is not None and count_noise_multiplier < 0:
            raise ValueError("count_noise_multiplier must be non-negative")
        if weights not in WEIGHTS:
            raise ValueError(f"weights is one of {', '.join(WEIGHTS)} (got {weights!r})")
        self.bound, self.adaptive, self.weights = float(clip), bool(adaptive), weights
        self.target, self.learning_rate = float(target_quantile), float(learning_rate)
        self.count_noise_multiplier = count_noise_multiplier
        self.privacy: RunPrivacy | None = None
        self.key = "aggregation.stages"
        self.calls = _Calls()

    def bind(self, run: StageRun) -> None:
        self.key = run.key
        if self.adaptive:
            self.privacy = _bound(run, "adaptive clipping")

    def state_dict(self) -> dict[str, Any]:
        return {"clip": self.bound} if self.adaptive else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.adaptive:
            self.bound = float(state["clip"])

    def apply(self, updates: Updates) -> Updates:
        part = updates.joined()
        block_of, outputs = _blocks(updates, part)
        names = _floating(part)
        reference = _reference_rows(updates, part, block_of, names)
        delta = _flat(part.rows, names) - _flat(reference, names)
        norms = torch.linalg.vector_norm(delta.double(), dim=1)
        bound = self.bound
        scale = (bound / norms.clamp_min(bound)).to(delta.dtype)
        moved = _unflat(delta * scale[:, None], part.rows, names)
        inside = norms <= bound
        rows = dict(part.rows)
        for k in names:
            keep = inside.reshape(-1, *([1] * (rows[k].dim() - 1))).to(rows[k].device)
            rows[k] = torch.where(keep, rows[k], reference[k] + moved[k])
        weights = part.weights
        if self.weights == "uniform":
            counts = torch.bincount(block_of, minlength=outputs).to(weights.dtype)
            shares = (1.0 / counts.clamp_min(1))[block_of]
            weights = shares if not updates.per_receiver else _block_weights(block_of, outputs, shares)
        if self.adaptive:
            self._adapt(updates, part, block_of, outputs, inside)
        clipped = Part(rows, weights.to(part.weights.dtype), part.masks, part.senders)
        return replace(updates.with_parts(clipped), clip=bound)

    def _adapt(
        self, updates: Updates, part: Part, block_of: torch.Tensor, outputs: int, inside: torch.Tensor
    ) -> None:
        """Andrew et al.'s geometric update of the bound from the noisy count of unclipped rows (one
        release per output, sensitivity 1)."""
        privacy, call = _needed(self.privacy, "adaptive clipping"), self.calls.next(updates.round)
        sigma = privacy.multiplier(self.count_noise_multiplier, f"{self.key}.options.count_noise_multiplier")
        counts = torch.bincount(block_of.cpu(), weights=inside.cpu().double(), minlength=outputs)
        divisors = _divisors(privacy, updates, torch.bincount(block_of.cpu(), minlength=outputs))
        noise = privacy.gaussian(counts, sigma, COUNT, updates.round, updates.site, call).double()
        share = float((counts + noise).sum() / divisors.sum())
        sampling = _sampling(privacy, updates, self.key)
        for block in range(outputs):
            members = _members(part, block_of.cpu(), block, updates.site)
            privacy.record(
                Release(updates.round, COUNT, "client", GAUSSIAN, sigma, 1.0, clients=members, **sampling)
            )
        self.bound *= math.exp(-self.learning_rate * (share - self.target))


def _block_weights(block_of: torch.Tensor, outputs: int, shares: torch.Tensor) -> torch.Tensor:
    """``[outputs, R]``: each row's share on its own output, zero elsewhere."""
    weights = torch.zeros(outputs, len(block_of), dtype=shares.dtype, device=shares.device)
    weights[block_of, torch.arange(len(block_of), device=shares.device)] = shares
    return weights


def _shared(privacy: RunPrivacy, updates: Updates, multiplier: float, call: int) -> Updates:
    """``updates`` with every sender's share of std ``z C / sqrt(n)`` on its row (``n``: its output's
    rows), drawn from the stream keyed by (round, site, call, sender)."""
    if updates.clip is None:
        raise ValueError("the noise needs a clip stage before it (the sensitivity)")
    part = updates.joined()
    block_of, outputs = _blocks(updates, part)
    counts = torch.bincount(block_of, minlength=outputs)
    if part.senders is None:
        raise ValueError(
            f"the {updates.site} does not say which clients sent its rows (what shares are keyed by)"
        )
    names = _floating(part)
    flat = _flat(part.rows, names)
    stds = multiplier * updates.clip / counts.double().clamp_min(1).sqrt()
    noise = torch.stack(
        [
            privacy.gaussian(flat[r], float(stds[b]), SHARE, updates.round, updates.site, call, sender)
            for r, (sender, b) in enumerate(zip(part.senders, block_of.tolist(), strict=True))
        ]
    )
    rows = {**part.rows, **_unflat(flat + noise, part.rows, names)}
    shared = Part(rows, part.weights, part.masks, part.senders)
    return replace(updates.with_parts(shared), noise=multiplier)


def expected_cohort_mean(
    privacy: RunPrivacy, updates: Updates, mean: Callable[[Updates], Tensors]
) -> Tensors:
    """DP-FedAvg's aggregate before any central noise: every row weighted ``1/n`` on its own output
    (``n``: the output's rows, each row counted once), ``mean`` of those (the site's mean, or secure
    aggregation's sum of the rows so weighted), and under Poisson participation at a server each
    output's change from the reference scaled by ``|S| / (q N)``, the sum over the expected cohort.
    The rule of :class:`Gaussian` and of a ``secagg`` reducer summing :class:`GaussianShare`'s rows."""
    part = updates.joined()
    block_of, outputs = _blocks(updates, part)
    if updates.per_receiver:
        counts = torch.bincount(block_of.cpu(), minlength=outputs)
        shares = (1.0 / counts.double())[block_of.cpu()].to(block_of.device)
        uniform = _block_weights(block_of, outputs, shares)
    else:
        uniform = torch.full((len(block_of),), 1.0 / len(block_of), dtype=torch.float64)
    uniform = uniform.to(part.weights.device)
    out = mean(updates.with_parts(Part(part.rows, uniform, part.masks, part.senders)))
    drawn = privacy.participation
    if updates.site != sites.SERVER or drawn is None or drawn.sampling != "poisson":
        return out
    assert updates.reference is not None
    scale = len(block_of) / (drawn.probability * drawn.population)  # |S| / (q N)
    for name in _floating(part):
        ref = updates.reference[name]
        out[name] = ref + (out[name] - ref) * scale
    return out


def record_client_level(
    privacy: RunPrivacy, updates: Updates, multiplier: float, clip: float, key: str
) -> None:
    """One noised aggregation's client-level releases: one per output, of kind ``update`` at a server
    (every client's, at the round's sampling) or ``edge`` at an edge (its cell's senders'), Gaussian of
    ``multiplier`` and sensitivity ``clip``. What :class:`Gaussian` and a ``secagg`` reducer summing
    :class:`GaussianShare`'s rows record."""
    part = updates.joined()
    block_of, outputs = _blocks(updates, part)
    sampling = _sampling(privacy, updates, key)
    kind = EDGE if updates.site == sites.EDGE else UPDATE
    for block in range(outputs):
        members = _members(part, block_of.cpu(), block, updates.site)
        privacy.record(
            Release(updates.round, kind, "client", GAUSSIAN, multiplier, clip, clients=members, **sampling)
        )


class GaussianShare(Transform):
    """Each sender's share of the distributed Gaussian noise, added to its row before the rows are
    summed (so a secure-aggregation stage can sit between the shares and the sum): std ``z C /
    sqrt(n)`` for the ``n`` rows of its output, keyed by (round, sender), the shares' sum having std
    ``z C``. ``noise_multiplier`` unset: the calibrated one. The reducer records the release: a
    :class:`Gaussian` one or ``secagg`` (:attr:`~fedge.aggregation.stage.Reducer.records_shares`); any
    other is refused, since the noise would go unaccounted."""

    def __init__(self, noise_multiplier: float | None = None):
        if noise_multiplier is not None and noise_multiplier < 0:
            raise ValueError("noise_multiplier must be non-negative")
        self.noise_multiplier = noise_multiplier
        self.calls = _Calls()
        self.key = "aggregation.stages"
        self.privacy: RunPrivacy | None = None

    def bind(self, run: StageRun) -> None:
        self.privacy, self.key = _bound(run, "gaussian_share"), run.key

    def check_pipeline(self, stages: Sequence[Stage]) -> None:
        reducer = stages[-1]
        if not (isinstance(reducer, Reducer) and reducer.records_shares):
            raise ValueError(
                "its noise would go unaccounted; close the pipeline with gaussian (distributed) or secagg"
            )

    def apply(self, updates: Updates) -> Updates:
        privacy = _needed(self.privacy, "gaussian_share")
        z = privacy.multiplier(self.noise_multiplier, f"{self.key}.options.noise_multiplier")
        return _shared(privacy, updates, z, self.calls.next(updates.round))


class Gaussian(Reducer):
    """The DP-FedAvg aggregate: per output, reference + (sum of the rows' clipped changes + noise) over
    the expected cohort (its rows; ``q N`` at a server under Poisson participation), each row counted
    once.

    ``mode: central`` adds one draw of std ``z C`` per output, keyed by (round, site); ``distributed``
    sums rows that already carry :class:`GaussianShare`'s shares, or adds the same shares itself.
    ``noise_multiplier`` unset: the calibrated one (``privacy.target_epsilon``). Records one
    client-level release per output (see the module's note). Integer tensors take their rows' largest
    value, as the site's mean does. Not additive: the noise is drawn once over every row.
    """

    additive: ClassVar[bool] = False
    records_shares: ClassVar[bool] = True

    def __init__(self, noise_multiplier: float | None = None, mode: str = "central"):
        if noise_multiplier is not None and noise_multiplier < 0:
            raise ValueError("noise_multiplier must be non-negative")
        if mode not in ("central", "distributed"):
            raise ValueError(f"mode is central or distributed (got {mode!r})")
        self.noise_multiplier, self.mode = noise_multiplier, mode
        self.calls = _Calls()
        self.key = "aggregation.stages"
        self.privacy: RunPrivacy | None = None

    def bind(self, run: StageRun) -> None:
        self.privacy, self.key = _bound(run, "gaussian"), run.key

    def reduce(self, updates: Updates) -> Tensors:
        privacy, call = _needed(self.privacy, "gaussian"), self.calls.next(updates.round)
        clip = updates.clip
        if clip is None:
            raise ConfigError(self.key, "gaussian needs a clip stage before it (its sensitivity)")
        if self.mode == "distributed" and updates.noise is not None:  # the senders added their shares
            if self.noise_multiplier not in (None, updates.noise):
                raise ConfigError(self.key, "the noise_multiplier differs from the gaussian_share stage's")
            z = updates.noise
        else:
            z = privacy.multiplier(self.noise_multiplier, f"{self.key}.options.noise_multiplier")
            if self.mode == "distributed":
                updates = _shared(privacy, updates, z, call)
        out = expected_cohort_mean(privacy, updates, _site_mean)
        if self.mode == "central" and z > 0:
            part = updates.joined()
            block_of, outputs = _blocks(updates, part)
            counts = torch.bincount(block_of.cpu(), minlength=outputs)
            names = _floating(part)
            dims = sum(part.rows[k][0].numel() for k in names)
            like = torch.empty(dims, dtype=part.rows[names[0]].dtype)
            draws = [
                privacy.gaussian(like, z * clip, UPDATE, updates.round, updates.site, call, b)
                for b in range(outputs)
            ]
            divisors = _divisors(privacy, updates, counts)
            noise = torch.stack(draws) / divisors[:, None].to(like.dtype)
            shaped = {
                k: v if updates.per_receiver else v[0] for k, v in _unflat(noise, part.rows, names).items()
            }
            out = {**out, **{k: out[k] + shaped[k].to(out[k].device) for k in names}}
        record_client_level(privacy, updates, z, clip, self.key)
        return out


def _site_mean(updates: Updates) -> Tensors:
    """The site's own mean of ``updates`` at their weights (each cell's at an edge): with uniform weights
    the rows' unweighted mean, taken as the site takes its mean (so clip 1e9 and noise 0 give the plain
    mean's numbers)."""
    return (BlockMean() if updates.per_receiver else WeightedMean()).reduce(updates)
