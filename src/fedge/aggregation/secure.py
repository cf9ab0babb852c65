"""``secagg``: secure aggregation as the reducer of a server's, an edge's or a buffer's pipeline
(Bonawitz et al. 2017, with SecAgg+'s sparse graph from Bell et al. 2020; the protocol is
:mod:`fedge.aggregation.secure_protocol`).

Why a reducer and not a masking transform and a summing reducer: the masked rows mean nothing one by
one (each is uniform noise), so no stage may come between the masking and the sum, and the unmasking
needs the protocol's state (who dropped, whose shares); one reducer keeps the three together. The
transforms listed before it act on each sender's own row before it is masked: a clip, or each sender's
share of distributed DP noise, composes with it that way.

Each sender's row (every floating tensor, flattened and joined in the rows' order) is clipped
coordinate-wise to ``[-range, range]``, multiplied by the sender's weight and encoded in fixed point:
``round(w x 2^f) mod 2^bits`` (to the nearest, or stochastically: ``rounding``), with ``f`` the most
fraction bits for which the sum of the ``n`` weighted rows, ``|sum w x| <= range * sum |w|`` plus
rounding, cannot wrap around the signed range of ``bits`` bits. The server learns only the survivors'
sum ``sum w x`` (each coordinate within ``n 2^-f`` of the float sum of the clipped rows), decodes it and
divides by the survivors' share of the weights, so that the site's mean (the sample-weighted mean at a
FedAvg server, each cell's mean at an edge) comes out of whoever survived. Rows that carry a
``gaussian_share`` stage's noise (distributed DP) are summed by DP-FedAvg's rule instead, as the
``gaussian`` reducer sums them: every row weighted ``1/n`` whatever the clip's ``weights`` say, the sum
over the expected cohort (``q N`` under Poisson participation), the aggregation's client-level releases
recorded; such a pipeline needs a ``clip`` stage and is refused with ``dropout`` (a dropped sender's
share would be lost, and the sum carry less noise than accounted). Integer tensors (counters)
are not secret and are not summed: they take the largest row's value, as the site's own mean does.

Dropouts (``dropout``: a fraction of each aggregation's senders, drawn from the run seed, or a list of
client ids) leave after masking; their pairwise masks are removed with the survivors' Shamir shares, and
a dropout the threshold cannot unmask is refused in one line. The protocol's messages are put on the
communication ledger at their real widths (:func:`~fedge.aggregation.secure_protocol.secagg_traffic`);
the masked vectors are the senders' upload, so the site's runtime does not record the plain upload of
the rows (:attr:`carries_upload`) and each upload counts once, at ``bits`` per coordinate. Its compute,
the mask expansion, key agreements and reconstructions, is charged to the simulated clock with the
system's compute model (at an asynchronous buffer, whose time is its event queue's, the joules only;
the seconds stay in the stage's reports). The communication's airtime is not charged by the stage: the
site's round rule charges it, a FedAvg server's from the round's ledger (it closes its round after
aggregating); a hierarchy's and an asynchronous server's rules time the upload from its plain bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedge.aggregation import sites
from fedge.aggregation.private import GaussianShare, expected_cohort_mean, record_client_level
from fedge.aggregation.secure_protocol import (
    CIPHER_BITS,
    ID_BITS,
    KEY_BITS,
    SHARE_BITS,
    Costs,
    SecAggRound,
)
from fedge.aggregation.stage import Reducer, Stage, StageRun
from fedge.aggregation.updates import Part, Updates
from fedge.comm import nodes
from fedge.errors import ConfigError
from fedge.rng import derive_seed, torch_rng
from fedge.system.clock import CLIENT_COMPUTE, SERVER_COMPUTE, RoundCost
from fedge.tensors import Tensors

SITES = (sites.SERVER, sites.EDGE, sites.BUFFER)
"""Where the stage runs: one receiver (or one per cell) of many senders' rows."""

PRG_FLOPS = 2
"""Operations per mask coordinate (draw it, add it mod 2^bits): our completion; no paper times it."""
AGREEMENT_FLOPS = 255 * 10 * 32
"""One key agreement: X25519's 255 ladder steps of about ten 256-bit field multiplications, each 16
64-bit multiply-adds (32 operations): our completion."""
FIELD_FLOPS = 32
"""One multiplication in Shamir's 255-bit field (16 64-bit multiply-adds): our completion."""


@dataclass
class SecAggReport:
    """One aggregation's protocol at one receiver: the senders (client ids) and the dropped ones, the
    fraction bits ``f``, each sender's neighbour count and the threshold, the bits by message kind,
    the compute (:class:`~fedge.aggregation.secure_protocol.Costs`), the clock seconds charged for it
    (``None`` without a system) and how many coordinates the range clipped."""

    senders: tuple[int, ...]
    dropped: tuple[int, ...]
    fraction_bits: int
    degree: int
    threshold: int
    traffic: dict[str, int]
    costs: Costs
    seconds: float | None = None
    clipped: int = 0


def fraction_bits(bits: int, bound: float, weight: float, n: int) -> int:
    """The most fraction bits ``f`` with ``weight * bound * 2^f + n < 2^(bits - 1)``: a sum of ``n`` rounded
    rows, each weighted row within ``|w| * bound``, then stays inside ``bits``' signed range."""
    room = (2 ** (bits - 1) - n) / (weight * bound)
    f = math.floor(math.log2(room)) if room > 0 else -1
    while f >= 0 and weight * bound * 2.0**f + n >= 2 ** (bits - 1):
        f -= 1
    return f


class SecureAggregation(Reducer):
    """The site's mean computed by secure aggregation (see the module): options ``bits`` (the modulus
    ``2^bits``, 4 to 62), ``range`` (the clip bound of every coordinate), ``neighbours`` (SecAgg+'s
    graph degree, even; unset: every other sender), ``threshold`` (shares that rebuild a secret; unset:
    a majority of a sender's holders), ``dropout`` (a fraction of the senders, or a list of client
    ids, that drop after masking) and ``rounding`` (``nearest``, or ``stochastic``: up with probability
    the remainder, unbiased, each sender's draws from the run seed)."""

    additive: ClassVar[bool] = False  # the protocol runs once over every sender's row
    records_shares: ClassVar[bool] = True  # rows with Gaussian shares: DP-FedAvg's sum and its releases
    carries_upload: ClassVar[bool] = True  # the masked vectors are the senders' upload

    def __init__(
        self,
        bits: int = 32,
        range: float = 8.0,  # noqa: A002 (the config's option name)
        neighbours: int | None = None,
        threshold: int | None = None,
        dropout: float | Sequence[int] = 0.0,
        rounding: str = "nearest",
    ):
        if isinstance(bits, bool) or not isinstance(bits, int) or not 4 <= bits <= 62:
            raise ValueError(f"bits {bits!r} must be an integer in 4..62")
        if isinstance(range, bool) or not isinstance(range, int | float) or not range > 0:
            raise ValueError(f"range {range!r} must be a positive number")
        if neighbours is not None and (not isinstance(neighbours, int) or neighbours < 2 or neighbours % 2):
            raise ValueError(f"neighbours {neighbours!r} must be an even integer of at least 2")
        if threshold is not None and (not isinstance(threshold, int) or threshold < 1):
            raise ValueError(f"threshold {threshold!r} must be a positive integer")
        if isinstance(dropout, int | float) and not isinstance(dropout, bool):
            if not 0.0 <= dropout < 1.0:
                raise ValueError(f"dropout {dropout!r} must be a fraction in [0, 1) or a list of client ids")
        elif not (isinstance(dropout, list | tuple) and all(isinstance(c, int) and c >= 0 for c in dropout)):
            raise ValueError(f"dropout {dropout!r} must be a fraction in [0, 1) or a list of client ids")
        self.bits, self.bound = bits, float(range)
        if fraction_bits(bits, float(range), 1.0, 2) < 1:  # the most any aggregation can have
            raise ValueError(f"bits {bits} leave no fraction bits for range {range:g}")
        if rounding not in ("nearest", "stochastic"):
            raise ValueError(f"rounding {rounding!r} must be nearest or stochastic")
        self.neighbours, self.threshold, self.dropout = neighbours, threshold, dropout
        self.rounding = rounding
        self.run = StageRun(sites.SERVER)
        self.reports: list[SecAggReport] = []  # the last aggregation's, one per receiver
        self._calls: dict[int, int] = {}  # aggregations so far in the round (a round may hold several)

    def bind(self, run: StageRun) -> None:
        self.run = run

    def check_pipeline(self, stages: Sequence[Stage]) -> None:
        drops = bool(self.dropout) if isinstance(self.dropout, list | tuple) else self.dropout > 0
        if drops and any(isinstance(stage, GaussianShare) for stage in stages):
            raise ValueError(
                "dropout with gaussian_share: the dropped senders' noise shares would be lost and the sum "
                "carry less noise than accounted; set dropout 0"
            )

    def reduce(self, updates: Updates) -> Tensors:
        """The site's secure mean; for rows carrying Gaussian shares (``updates.noise``), DP-FedAvg's
        aggregate instead: every row counted once over the expected cohort, as the ``gaussian`` reducer
        computes it (:func:`~fedge.aggregation.private.expected_cohort_mean`), and its client-level
        releases recorded (:func:`~fedge.aggregation.private.record_client_level`)."""
        if updates.site not in SITES:
            where = f"secagg runs at the {', '.join(SITES)}, not the {updates.site}"
            raise ConfigError("aggregation.stages", f"{where} (set the stage's at)")
        if any(part.masks for part in updates.parts):
            raise ConfigError("aggregation.stages", "secagg cannot sum masked (sparse) rows")
        if updates.noise is None:
            return self._secure_mean(updates)
        privacy, clip = self.run.privacy, updates.clip
        if privacy is None:
            raise ValueError("secagg sums Gaussian shares and records their releases: bind it to a run")
        if clip is None:
            raise ConfigError(self.run.key, "secagg sums Gaussian shares: it needs a clip stage before them")
        out = expected_cohort_mean(privacy, updates, self._secure_mean)
        record_client_level(privacy, updates, updates.noise, clip, self.run.key)
        return out

    def _secure_mean(self, updates: Updates) -> Tensors:
        """The weighted mean of the rows, over the survivors, by the protocol."""
        part = updates.joined()
        call = self._occurrence(updates.round)
        names = [name for name, t in part.rows.items() if t.is_floating_point()]
        rows = part.rows
        flat = torch.cat(
            [rows[name].detach().reshape(rows[name].shape[0], -1).cpu().double() for name in names], 1
        )
        clipped = flat.clamp(-self.bound, self.bound)
        ids = part.senders if part.senders is not None else tuple(range(flat.shape[0]))
        weights = part.weights.detach().cpu().double()
        outputs = weights if updates.per_receiver else weights[None]
        sums, self.reports = [], []
        for o, w in enumerate(outputs):
            senders = torch.nonzero(w).flatten().tolist()
            total, report = self._aggregate(
                updates, call, o, clipped[senders], w[senders], [ids[r] for r in senders]
            )
            report.clipped = int((clipped[senders] != flat[senders]).sum())
            sums.append(total)
            self.reports.append(report)
        self._charge(updates)
        return _unflattened(part, names, torch.stack(sums), updates.per_receiver, outputs)

    def _occurrence(self, round_: int) -> int:
        """Which aggregation of ``round_`` this is (each draws its own keys and dropouts)."""
        if self._calls and round_ not in self._calls:
            self._calls.clear()
        self._calls[round_] = self._calls.get(round_, 0) + 1
        return self._calls[round_] - 1

    def _dropped(self, ids: list[int], seed: int) -> list[int]:
        """The positions among ``ids`` that drop: the listed client ids, or ``floor(fraction * n)`` drawn
        from the aggregation's stream."""
        if isinstance(self.dropout, list | tuple):
            listed = set(self.dropout)
            return [i for i, c in enumerate(ids) if c in listed]
        count = int(self.dropout * len(ids))
        gen = torch_rng(seed, "privacy-secagg-dropout")
        return sorted(torch.randperm(len(ids), generator=gen)[:count].tolist())

    def _aggregate(
        self, updates: Updates, call: int, output: int, x: torch.Tensor, w: torch.Tensor, ids: list[int]
    ) -> tuple[torch.Tensor, SecAggReport]:
        """One receiver's mean over its senders' clipped rows ``x`` with weights ``w``."""
        n, d = x.shape
        seed = derive_seed(self.run.seed, "privacy-secagg", updates.site, updates.round, call, output)
        dropped = self._dropped(ids, seed)
        f = fraction_bits(self.bits, self.bound, float(w.abs().sum()), n)
        if f < 1:
            key = "aggregation.stages"
            raise ConfigError(
                key, f"secagg: bits {self.bits} leave no fraction bits for range {self.bound:g}"
            )
        try:
            protocol = SecAggRound(n, d, self.bits, seed, self.neighbours, self.threshold)
            protocol.check(dropped)
        except ValueError as error:
            where = f"at the {updates.site} in round {updates.round}"
            raise ConfigError("aggregation.stages", f"secagg {where}: {error} (dropout, threshold)") from None
        scale = 2.0**f
        encoded = self._rounded(w[:, None] * x * scale, seed, ids) & (2**self.bits - 1)
        total = protocol.unmask(protocol.masked(encoded), dropped)
        signed = torch.where(total >= 2 ** (self.bits - 1), total - 2**self.bits, total).double() / scale
        alive = [i for i in range(n) if i not in set(dropped)]
        kept = float(w[alive].sum())
        if kept == 0.0:
            raise ConfigError("aggregation.stages", "secagg: the surviving senders carry no weight")
        traffic = self._record(updates, output, ids, dropped, d, protocol.degree)
        report = SecAggReport(
            tuple(ids),
            tuple(ids[i] for i in dropped),
            f,
            protocol.degree,
            protocol.t,
            traffic,
            protocol.costs,
        )
        return signed * (float(w.sum()) / kept), report

    def _rounded(self, scaled: torch.Tensor, seed: int, ids: list[int]) -> torch.Tensor:
        """``scaled`` to integers: to the nearest, or up with probability the fractional part (each
        sender's uniform draws from its own stream)."""
        if self.rounding == "nearest":
            return torch.round(scaled).long()
        draws = [
            torch.rand(
                scaled.shape[1], generator=torch_rng(seed, "privacy-secagg-rounding", c), dtype=torch.float64
            )
            for c in ids
        ]
        return torch.floor(scaled + torch.stack(draws)).long()

    def _receiver(self, site: str, output: int) -> str:
        return nodes.edge(output) if site == sites.EDGE else nodes.SERVER

    def _record(
        self, updates: Updates, output: int, ids: list[int], dropped: list[int], d: int, k: int
    ) -> dict[str, int]:
        """Put the protocol's messages between the senders and their receiver on the ledger; the bits
        by kind (what :func:`~fedge.aggregation.secure_protocol.secagg_traffic` gives)."""
        clients = nodes.clients(ids)
        survivors = [c for i, c in enumerate(clients) if i not in set(dropped)]
        receiver, s = self._receiver(updates.site, output), len(survivors)
        messages = [
            ("secagg_keys", clients, True, 2 * KEY_BITS),
            ("secagg_keys", clients, False, k * 2 * KEY_BITS),
            ("secagg_shares", clients, True, k * CIPHER_BITS),
            ("secagg_shares", clients, False, k * CIPHER_BITS),
            ("secagg_masked", survivors, True, d * self.bits),
            ("secagg_unmask", survivors, False, s * ID_BITS),
            ("secagg_unmask", survivors, True, (k + 1) * (SHARE_BITS + ID_BITS)),
        ]
        traffic: dict[str, int] = {}
        network = self.run.network
        for kind, ends, up, bits in messages:
            traffic[kind] = traffic.get(kind, 0) + len(ends) * bits
            if network is not None and ends:
                src, dst = (ends, receiver) if up else (receiver, ends)
                network.ledger.record(updates.round, src, dst, kind, bits)
        return traffic

    def _charge(self, updates: Updates) -> None:
        """Charge the protocol's compute to the clock: each receiver's senders expand their masks and
        agree their keys in parallel, then the receiver rebuilds the secrets and removes the masks;
        receivers (an edge's cells) run side by side, the slowest setting the time. An asynchronous
        buffer's time is its event queue's, which a stage cannot move: there only the joules are
        charged, and the seconds stay in :attr:`reports`."""
        system = self.run.system
        if system is None:
            return
        seconds, phases = 0.0, {}
        joules: dict[str, dict[str, float]] = {}
        for o, report in enumerate(self.reports):
            costs = report.costs
            flops = PRG_FLOPS * np.asarray(costs.client_coordinates, dtype=np.float64)
            flops += AGREEMENT_FLOPS * np.asarray(costs.client_agreements, dtype=np.float64)
            clients = system.client_compute(flops, np.asarray(report.senders))
            shamir = costs.reconstructions * report.threshold**2 * FIELD_FLOPS
            server_flops = PRG_FLOPS * costs.server_coordinates + AGREEMENT_FLOPS * costs.server_agreements
            server = system.server_compute(server_flops + shamir)
            client_s, server_s = float(clients.seconds.max()), float(server.seconds.sum())
            report.seconds = client_s + server_s
            if report.seconds >= seconds:
                seconds, phases = report.seconds, {CLIENT_COMPUTE: client_s, SERVER_COMPUTE: server_s}
            for node, spent in zip(clients.payers or [], clients.joules.tolist(), strict=True):
                mine = joules.setdefault(node, {})
                mine[CLIENT_COMPUTE] = mine.get(CLIENT_COMPUTE, 0.0) + spent
            receiver = joules.setdefault(self._receiver(updates.site, o), {})
            receiver[SERVER_COMPUTE] = receiver.get(SERVER_COMPUTE, 0.0) + float(server.joules.sum())
        total = sum(sum(v.values()) for v in joules.values())
        if updates.site == sites.BUFFER:
            seconds, phases = 0.0, {}
        system.charge(RoundCost(seconds, total, phases, joules))


def _unflattened(
    part: Part, names: list[str], sums: torch.Tensor, per_receiver: bool, outputs: torch.Tensor
) -> Tensors:
    """The decoded sums (``[outputs, d]``) back into the rows' tensors (their dtype and device); integer
    tensors take the largest value among each output's senders."""
    out: Tensors = {}
    start = 0
    for name in names:
        t = part.rows[name]
        size = t[0].numel()
        value = (
            sums[:, start : start + size]
            .reshape(sums.shape[0], *t.shape[1:])
            .to(device=t.device, dtype=t.dtype)
        )
        out[name] = value if per_receiver else value[0]
        start += size
    for name, t in part.rows.items():
        if t.is_floating_point():
            continue
        held = [t[(w != 0).to(t.device)].max(dim=0).values for w in outputs]
        out[name] = torch.stack(held) if per_receiver else held[0]
    return out
