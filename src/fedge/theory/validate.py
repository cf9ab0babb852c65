"""Bounds against measurements on P1: every theorem evaluated at P1's exact constants next to the quantity it
bounds, measured by :func:`fedge.theory.oracle.simulate` (the validity grid E7 of ``examples/theory``).

A :class:`Check` pairs one :class:`~fedge.theory.bound.Bound` with its measurement; ``holds`` is ``None``
for a vacuous bound (it promises nothing). The measured quantities follow the theorems: SplitFed's
``min over t < T, t = 0 mod l`` of the replicate mean of G(t); CSE-FSL's average over rounds. The
drift-lemma checks compare the summed measured drift with the summed lemma bound (the lemmas bound a
conditional expectation that is linear in G(t), so sums over rounds and replicates preserve them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.theory import cse_fsl, sfl
from fedge.theory.bound import Bound
from fedge.theory.oracle import P1Problem, P1Run, P1Trace, simulate


@dataclass(frozen=True)
class Check:
    """One bound, what it bounds (``quantity``), the measured value and whether the bound holds."""

    bound: Bound
    quantity: str
    measured: float

    @property
    def holds(self) -> bool | None:
        return None if self.bound.vacuous else self.bound.holds_for(self.measured)

    @property
    def margin(self) -> float:
        """``bound / measured`` (>= 1 when the bound holds)."""
        return self.bound.margin(self.measured)


def sfl_bounds(problem: P1Problem, run: P1Run) -> list[Bound]:
    """Every SplitFed bound that applies to ``run`` on ``problem``, at the problem's exact constants:
    Theorems 1 and 3 for full participation, Theorem 2 (corrected, stated) and 4 (stated,
    n-substituted) for n draws. Draws without replacement are outside Theorems 2 and 4; they are
    evaluated anyway as the closest statements (the report says so)."""
    c, s = problem.client, problem.server
    client = {
        "L": c.L,
        "sigma_L2": c.sigma_L2,
        "sigma_G2": c.sigma_G2,
        "delta_F": problem.delta_F_client,
        "a": run.mu_L,
        "K": run.K,
        "l": run.l,
        "T": run.T,
    }
    server = {
        "L": s.L,
        "sigma_L2": s.sigma_L2,
        "sigma_G2": s.sigma_G2,
        "delta_F": problem.delta_F_server,
        "mu": run.mu,
        "m": s.m,
        "l": run.l,
        "T": run.T,
    }
    if run.n is None:
        return [sfl.thm1(**client), sfl.thm3(**server)]
    return [
        sfl.thm2(**client, n=run.n, variant="corrected"),
        sfl.thm2(**client, n=run.n, variant="stated"),
        sfl.thm4(**server, n=run.n, variant="stated"),
        sfl.thm4(**server, n=run.n, variant="n_substituted"),
    ]


def sfl_checks(problem: P1Problem, run: P1Run, trace: P1Trace) -> list[Check]:
    """The SplitFed bounds of ``run`` against the measured ``min_t`` of G_c / G_s over t = 0 mod l."""
    out = []
    for bound in sfl_bounds(problem, run):
        if bound.name.startswith(("sfl.thm1", "sfl.thm2")):
            out.append(Check(bound, "min_t G_c (t = 0 mod l)", trace.min_client(run.l)))
        else:
            out.append(Check(bound, "min_t G_s (t = 0 mod l)", trace.min_server(run.l)))
    return out


def drift_ratios(problem: P1Problem, run: P1Run, trace: P1Trace) -> dict[str, float]:
    """Measured / lemma-bound ratios of the client drift (worst local step) and of the server drift
    (<= 1 when the lemmas hold; ``nan`` when there was no server pass)."""
    c, s = problem.client, problem.server
    G_c = trace.G_c[:, : run.T].mean(axis=0)
    lemma_c = np.array(
        [
            sfl.client_drift_bound(a=run.mu_L, K=run.K, sigma_L2=c.sigma_L2, sigma_G2=c.sigma_G2, grad_sq=g)
            for g in G_c
        ]
    )
    client = float((trace.client_drift.sum(axis=0) / lemma_c.sum()).max())
    if len(trace.server_rounds) == 0:
        return {"client_drift": client, "server_drift": float("nan")}
    G_s = trace.G_s[:, trace.server_rounds].mean(axis=0)
    lemma_s = sum(
        sfl.server_drift_bound(mu=run.mu, m=s.m, sigma_L2=s.sigma_L2, sigma_G2=s.sigma_G2, grad_sq=g)
        for g in G_s
    )
    return {"client_drift": client, "server_drift": float(trace.server_drift.sum() / lemma_s)}


def cse_fsl_checks(problem: P1Problem, *, h: int, T: int, replicates: int, seed: int = 0) -> list[Check]:
    """CSE-FSL Propositions 1-2 on ``problem`` (meant with sigma_G^2 = 0: the propositions assume iid
    data): full participation, aggregation and a server pass every round (l = 1), h local steps, the
    prescribed steps; G1^2 / G2^2 are the largest second moments the run met, the feature drift is 0
    (P1's sides are uncoupled). The simulator's server starts learning at t = 1, one pass later than
    the analysis, which can only raise the measured average."""
    c, s = problem.client, problem.server
    run = P1Run(T=T, K=h, l=1, mu_L=cse_fsl.client_step(c.L, h, T), mu=cse_fsl.server_step(s.L, s.m, T))
    trace = simulate(problem, run, replicates=replicates, seed=seed)
    p1 = cse_fsl.prop1(L=c.L, G1_sq=trace.G1_sq, h=h, T=T, delta_F=problem.delta_F_client, eta=run.mu_L)
    p2 = cse_fsl.prop2(L=s.L, G2_sq=trace.G2_sq, n=s.m, T=T, delta_F=problem.delta_F_server, eta=run.mu)
    return [
        Check(p1, "mean_t G_c", trace.mean_client()),
        Check(p2, "mean_t G_s", trace.mean_server()),
    ]
