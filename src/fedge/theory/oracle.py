"""P1, our oracle problem for the SplitFed bounds: every assumption holds exactly, every constant is known.

Each side (client, server) is a family of m functions on R^d,
``F_i(x) = 0.5 (x - c_i)^T H (x - c_i) + beta sum_d cos(x_d)``, with H = diag(h) (eigenvalues evenly in
``[h_min, h_max]``; our base is [0.1, 1], beta = 0.5, so L = h_max + beta = 1.5, non-convex since beta >
h_min). ``grad F_i - grad F = H (cbar - c_i)`` exactly, so the centres are drawn and scaled to give
``max_i ||H (c_i - cbar)||^2 = sigma_G^2`` exactly, and a stochastic gradient is the exact one plus
``N(0, sigma_L^2 / d I)``, whose variance is exactly sigma_L^2. H is diagonal (any basis would do) so the
objective is separable and its infimum is computed as a guaranteed lower bound (dense 1-D grids with the
smoothness correction), not by a local optimizer that could miss the global minimum.

:func:`simulate` runs the algorithm the theorems analyse (that paper's Algorithm 1 in its ``analysis_pure``
form: the first local step of a server round is an ordinary local step; no coupling between the sides) on P1,
for R independent replicates at once, and records the exact squared gradient norms G_c(t), G_s(t), the client
and server drifts of the proofs' lemmas, and the largest second moments seen (CSE-FSL's G1^2, G2^2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedge.errors import ConfigError
from fedge.rng import numpy_rng

GRID = 20001  # points per coordinate for the infimum (error <= 0.5 (h+beta) (width/GRID)^2 / 4)


@dataclass(frozen=True)
class P1Side:
    """One side of P1: ``F_i(x) = 0.5 (x - c_i)^T diag(h) (x - c_i) + beta sum cos(x)``, i < m."""

    h: np.ndarray
    beta: float
    centres: np.ndarray
    sigma_L2: float

    @property
    def d(self) -> int:
        return int(self.h.shape[0])

    @property
    def m(self) -> int:
        return int(self.centres.shape[0])

    @property
    def L(self) -> float:
        """Smoothness of every F_i: the Hessian ``H - beta diag(cos x)`` has spectral norm <= h_max + beta."""
        return float(self.h.max() + self.beta)

    @property
    def sigma_G2(self) -> float:
        """``max_i ||H (c_i - cbar)||^2`` (exact: gradient differences do not depend on x)."""
        spread = self.h * (self.centres - self.centres.mean(axis=0))
        return float((spread**2).sum(axis=1).max())

    def client_grad(self, x: np.ndarray, clients: np.ndarray) -> np.ndarray:
        """``grad F_i(x)`` per row: ``x`` is ``[..., d]``, ``clients`` (the i's) broadcasts to ``[...]``."""
        return self.h * (x - self.centres[clients]) - self.beta * np.sin(x)

    def grad(self, x: np.ndarray) -> np.ndarray:
        """``grad F(x)`` of the mean objective F = (1/m) sum_i F_i."""
        return self.h * (x - self.centres.mean(axis=0)) - self.beta * np.sin(x)

    def grad_sq(self, x: np.ndarray) -> np.ndarray:
        """``||grad F(x)||^2`` over the last axis."""
        return (self.grad(x) ** 2).sum(axis=-1)

    def _spread(self) -> float:
        diff = self.centres - self.centres.mean(axis=0)
        return float(0.5 * (self.h * diff**2).sum(axis=1).mean())

    def value(self, x: np.ndarray) -> np.ndarray:
        """``F(x)`` over the last axis."""
        cbar = self.centres.mean(axis=0)
        return (0.5 * self.h * (x - cbar) ** 2 + self.beta * np.cos(x)).sum(axis=-1) + self._spread()

    def infimum(self) -> float:
        """A guaranteed lower bound on ``inf F``, within ~1e-7 of it.

        F is a sum of 1-D functions ``g(x) = 0.5 h (x - c)^2 + beta cos x``; every stationary point of g
        lies in ``|x - c| <= beta / h``, and on a grid of spacing s the grid minimum exceeds the true one
        by at most ``0.5 (h + beta) (s/2)^2``, which is subtracted.
        """
        cbar = self.centres.mean(axis=0)
        total = self._spread()
        for h, c in zip(self.h, cbar, strict=True):
            radius = self.beta / h
            x = np.linspace(c - radius, c + radius, GRID)
            s = x[1] - x[0]
            total += (
                float((0.5 * h * (x - c) ** 2 + self.beta * np.cos(x)).min())
                - 0.5 * (h + self.beta) * (s / 2) ** 2
            )
        return total


def make_side(
    *,
    d: int,
    m: int,
    h_min: float,
    h_max: float,
    beta: float,
    sigma_L2: float,
    sigma_G2: float,
    rng: np.random.Generator,
) -> P1Side:
    """A P1 side with exactly the given sigma_L^2 and sigma_G^2 (centres around 0)."""
    if not 0 < h_min <= h_max:
        raise ConfigError("h_min", f"need 0 < h_min <= h_max (got {h_min}, {h_max})")
    if m < 1 or d < 1:
        raise ConfigError("m", f"need m >= 1 and d >= 1 (got m={m}, d={d})")
    h = np.linspace(h_min, h_max, d)
    u = rng.standard_normal((m, d))
    u -= u.mean(axis=0)
    largest = float((u**2).sum(axis=1).max())
    u = u * math.sqrt(sigma_G2 / largest) if sigma_G2 > 0 and largest > 0 else np.zeros_like(u)
    return P1Side(h=h, beta=float(beta), centres=u / h, sigma_L2=float(sigma_L2))


@dataclass(frozen=True)
class P1Problem:
    """Client and server sides of P1 with their common starting points."""

    client: P1Side
    server: P1Side
    x0_client: np.ndarray
    x0_server: np.ndarray

    @property
    def delta_F_client(self) -> float:
        return float(self.client.value(self.x0_client)) - self.client.infimum()

    @property
    def delta_F_server(self) -> float:
        return float(self.server.value(self.x0_server)) - self.server.infimum()


def make_p1(
    *,
    d: int = 10,
    m: int = 20,
    h_min: float = 0.1,
    h_max: float = 1.0,
    beta: float = 0.5,
    sigma_L2: float = 1.0,
    sigma_G2: float = 1.0,
    start: float = 3.0,
    seed: int = 0,
) -> P1Problem:
    """Our base P1 (d = 10 per side, H in [0.1, 1], beta = 0.5, sigma^2's = 1); both sides start
    from a point drawn uniformly in ``[-start, start]^d`` (stream ``(seed, "p1-start", side)``)."""
    sides, starts = [], []
    for side in ("client", "server"):
        rng = numpy_rng(seed, "p1-problem", side)
        sides.append(
            make_side(
                d=d, m=m, h_min=h_min, h_max=h_max, beta=beta, sigma_L2=sigma_L2, sigma_G2=sigma_G2, rng=rng
            )
        )
        starts.append(numpy_rng(seed, "p1-start", side).uniform(-start, start, d))
    return P1Problem(sides[0], sides[1], starts[0], starts[1])


@dataclass(frozen=True)
class P1Run:
    """Knobs of one simulated run: T rounds, K local steps, server interval l, n draws (``None``: full
    participation), with or without replacement, client step mu_L and per-step server step mu."""

    T: int
    K: int
    l: int  # noqa: E741  (the paper's symbol)
    mu_L: float
    mu: float
    n: int | None = None
    replacement: bool = True


@dataclass(frozen=True)
class P1Trace:
    """What a simulation measured, per replicate ``r`` and round ``t``.

    ``G_c[r, t]`` / ``G_s[r, t]``: ``||grad F^c(xbarC^t)||^2`` / ``||grad F^s(x_S^t)||^2`` at the start of
    round t (t = 0..T, t = T after the last round). ``client_drift[t, k]``: mean over replicates and draws
    of ``||x_{C,i}^{t,k} - xbarC^t||^2`` (k = 0..K-1, the iterate a local step is taken at);
    ``server_drift[p]``: mean over replicates of ``(1/n) sum_j ||x_{S,j} - x_S||^2`` over the intermediate
    iterates of server pass p, which ran in round ``server_rounds[p]``. ``G1_sq`` / ``G2_sq``: the largest
    mean-over-replicates ``E||stochastic gradient||^2`` met by a client / server step.
    """

    run: P1Run
    G_c: np.ndarray
    G_s: np.ndarray
    client_drift: np.ndarray
    server_drift: np.ndarray
    server_rounds: np.ndarray
    G1_sq: float
    G2_sq: float

    def _rounds(self, every: int) -> np.ndarray:
        return np.arange(0, self.run.T, every)

    def min_client(self, every: int = 1) -> float:
        """``min over t < T, t = 0 mod every`` of the replicate mean of G_c(t) (the theorems' quantity)."""
        return float(self.G_c[:, self._rounds(every)].mean(axis=0).min())

    def min_server(self, every: int = 1) -> float:
        """Same as :meth:`min_client` for G_s."""
        return float(self.G_s[:, self._rounds(every)].mean(axis=0).min())

    def mean_client(self) -> float:
        """Average over rounds t < T of the replicate mean of G_c (CSE-FSL's quantity)."""
        return float(self.G_c[:, : self.run.T].mean())

    def mean_server(self) -> float:
        return float(self.G_s[:, : self.run.T].mean())

    def final_client(self, window: float = 0.1) -> float:
        """Replicate mean of G_c over the last ``window`` fraction of rounds (the fixed-step plateau)."""
        start = int(self.run.T * (1 - window))
        return float(self.G_c[:, start : self.run.T + 1].mean())

    def final_server(self, window: float = 0.1) -> float:
        start = int(self.run.T * (1 - window))
        return float(self.G_s[:, start : self.run.T + 1].mean())


def _draws(rng: np.random.Generator, replicates: int, m: int, n: int | None, replacement: bool) -> np.ndarray:
    if n is None:
        return np.broadcast_to(np.arange(m), (replicates, m))
    if replacement:
        return rng.integers(0, m, size=(replicates, n))
    if n > m:
        raise ConfigError("n", f"cannot draw {n} of {m} clients without replacement")
    return np.argsort(rng.random((replicates, m)), axis=1)[:, :n]


def simulate(problem: P1Problem, run: P1Run, *, replicates: int = 20, seed: int = 0) -> P1Trace:
    """Run the SplitFed theory paper's box (analysis_pure) on P1 for ``replicates`` independent replicates.

    Per round t: draw the clients (n i.i.d. uniform with replacement by default, or all); if
    ``t = 0 mod l`` and ``t != 0`` the server takes one noisy SGD step per draw, sequentially in draw order
    (step ``mu``); every draw runs K noisy local steps (step ``mu_L``) from the broadcast client model; the
    new client model is the mean over draws. Streams: ``(seed, "p1-participants")``,
    ``(seed, "p1-client-noise")``, ``(seed, "p1-server-noise")``.
    """
    client, server = problem.client, problem.server
    m, T, K, l = client.m, run.T, run.K, run.l  # noqa: E741
    if server.m != m:
        raise ConfigError("m", "client and server sides need the same number of clients")
    for key, value in (("T", T), ("K", K), ("l", l), ("replicates", replicates)):
        if value < 1:
            raise ConfigError(key, f"must be >= 1 (got {value})")
    draws_rng = numpy_rng(seed, "p1-participants")
    c_noise, s_noise = numpy_rng(seed, "p1-client-noise"), numpy_rng(seed, "p1-server-noise")
    c_scale, s_scale = math.sqrt(client.sigma_L2 / client.d), math.sqrt(server.sigma_L2 / server.d)
    xc = np.repeat(problem.x0_client[None], replicates, axis=0)
    xs = np.repeat(problem.x0_server[None], replicates, axis=0)
    G_c, G_s = np.empty((replicates, T + 1)), np.empty((replicates, T + 1))
    client_drift = np.empty((T, K))
    server_drift, server_rounds = [], []
    G1_sq = G2_sq = 0.0
    for t in range(T):
        G_c[:, t], G_s[:, t] = client.grad_sq(xc), server.grad_sq(xs)
        draws = _draws(draws_rng, replicates, m, run.n, run.replacement)
        if t % l == 0 and t != 0:
            start, drift = xs.copy(), np.zeros(replicates)
            rows = np.arange(replicates)
            for j in range(draws.shape[1]):
                g = server.client_grad(xs, draws[rows, j])
                G2_sq = max(G2_sq, float((g**2).sum(axis=1).mean()) + server.sigma_L2)
                xs = xs - run.mu * (g + s_scale * s_noise.standard_normal(xs.shape))
                drift += ((xs - start) ** 2).sum(axis=1)
            server_drift.append(float(drift.mean()) / draws.shape[1])
            server_rounds.append(t)
        local = np.repeat(xc[:, None], draws.shape[1], axis=1)
        for k in range(K):
            client_drift[t, k] = float(((local - xc[:, None]) ** 2).sum(axis=2).mean())
            g = client.client_grad(local, draws)
            G1_sq = max(G1_sq, float((g**2).sum(axis=2).mean()) + client.sigma_L2)
            local = local - run.mu_L * (g + c_scale * c_noise.standard_normal(local.shape))
        xc = local.mean(axis=1)
    G_c[:, T], G_s[:, T] = client.grad_sq(xc), server.grad_sq(xs)
    return P1Trace(
        run=run,
        G_c=G_c,
        G_s=G_s,
        client_drift=client_drift,
        server_drift=np.array(server_drift),
        server_rounds=np.array(server_rounds, dtype=np.int64),
        G1_sq=G1_sq,
        G2_sq=G2_sq,
    )
