"""Typed inputs of each paper's bounds, as read from a ``theory:`` block (YAML or dotted overrides).

One pydantic model per paper, chosen by ``paper`` (default ``sfl``); each validates its constants and
knobs and evaluates every bound that applies with :meth:`evaluate`. Step sizes may be numbers or rules
(``max``: the theorem's cap; ``corollary``: the corollary's step rule), so a sweep over K, l, m or T
moves the step with the knob as the theorems prescribe. Bad values raise
:class:`~fedge.errors.ConfigError` naming the ``theory.*`` key.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from fedge.errors import ConfigError
from fedge.theory import cse_fsl, hist, light_fedsl, sfl
from fedge.theory.bound import Bound

NonNeg = Annotated[float, Field(ge=0.0)]
Pos = Annotated[float, Field(gt=0.0)]
StepRule = Pos | Literal["max", "corollary"]
SERVER_ONLY = ("delta_F_server", "mu", "thm3_cap", "thm4_cap")
CLIENT_ONLY = ("delta_F", "mu_L", "K")


class _Inputs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @abstractmethod
    def _bounds(self) -> list[Bound]:
        """Every bound of the paper that applies to these inputs."""

    def evaluate(self) -> list[Bound]:
        """Every bound of the paper that applies; an evaluator's ConfigError is re-keyed ``theory.*``."""
        try:
            return self._bounds()
        except ConfigError as error:
            message = str(error).removeprefix(f"{error.key}: ")
            raise ConfigError(f"theory.{error.key}", message) from None

    def describe(self) -> dict[str, Any]:
        """The inputs with step rules resolved to numbers (what the bounds were evaluated at)."""
        return self.model_dump()


class SflInputs(_Inputs):
    """The SplitFed theory paper's Theorems 1-4. ``n = None`` is full participation (Theorems 1 and 3), an
    integer n is n draws per round with replacement (Theorem 2 corrected + stated, Theorem 4 stated +
    n-substituted). ``delta_F_server`` defaults to ``delta_F``; ``sides`` limits the output to one side
    (FedAvg has no server side)."""

    paper: Literal["sfl"] = "sfl"
    L: Pos
    sigma_L2: NonNeg
    sigma_G2: NonNeg
    delta_F: float
    delta_F_server: float | None = None
    T: PositiveInt
    K: PositiveInt
    l: PositiveInt = 1  # noqa: E741  (the paper's symbol)
    m: PositiveInt
    n: PositiveInt | None = None
    mu_L: StepRule = "max"
    mu: StepRule = "max"
    thm3_cap: sfl.Thm3Cap = "appendix"
    thm4_cap: sfl.Thm4Cap = "stated"
    sides: Literal["both", "client", "server"] = "both"

    def client_step(self) -> float:
        if self.mu_L == "max":
            return sfl.a_max(self.L, self.K, self.l)
        if self.mu_L == "corollary":
            return sfl.corollary_client_step(self.L, self.K, self.l, self.T)
        return float(self.mu_L)

    def server_step(self) -> float:
        full = self.n is None
        if self.mu == "max":
            return (
                sfl.thm3_step_cap(self.L, self.m, self.thm3_cap)
                if full
                else sfl.thm4_step_cap(self.L, self.m, self.thm4_cap)
            )
        if self.mu == "corollary":
            return sfl.corollary_server_step(self.L, self.m, self.T, 3 if full else 4)
        return float(self.mu)

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "mu_L": self.client_step(), "mu": self.server_step()}
        drop = {"client": SERVER_ONLY, "server": CLIENT_ONLY}.get(self.sides, ())
        return {k: v for k, v in out.items() if k not in drop}

    def _bounds(self) -> list[Bound]:
        shared = {"L": self.L, "sigma_L2": self.sigma_L2, "sigma_G2": self.sigma_G2, "l": self.l, "T": self.T}
        client = {**shared, "delta_F": self.delta_F, "a": self.client_step(), "K": self.K}
        dF_s = self.delta_F if self.delta_F_server is None else self.delta_F_server
        server = {**shared, "delta_F": dF_s, "mu": self.server_step(), "m": self.m}
        out = []
        if self.sides in ("both", "client"):
            if self.n is None:
                out.append(sfl.thm1(**client))
            else:
                out += [sfl.thm2(**client, n=self.n, variant=v) for v in ("corrected", "stated")]
        if self.sides in ("both", "server"):
            if self.n is None:
                out.append(sfl.thm3(**server, cap=self.thm3_cap))
            else:
                out += [
                    sfl.thm4(**server, n=self.n, variant=v, cap=self.thm4_cap)
                    for v in ("stated", "n_substituted")
                ]
        return out


class CseFslInputs(_Inputs):
    """CSE-FSL Propositions 1 (h local steps) and 2 (n clients, feature-drift sum), at their prescribed
    steps unless ``eta_client`` / ``eta_server`` say otherwise (then vacuous)."""

    paper: Literal["cse_fsl"]
    L: Pos
    G1_sq: NonNeg
    G2_sq: NonNeg
    h: PositiveInt
    n: PositiveInt
    T: PositiveInt
    delta_F: float
    delta_F_server: float | None = None
    drift_sum: NonNeg = 0.0
    eta_client: Pos | None = None
    eta_server: Pos | None = None

    def _bounds(self) -> list[Bound]:
        dF_s = self.delta_F if self.delta_F_server is None else self.delta_F_server
        return [
            cse_fsl.prop1(
                L=self.L, G1_sq=self.G1_sq, h=self.h, T=self.T, delta_F=self.delta_F, eta=self.eta_client
            ),
            cse_fsl.prop2(
                L=self.L,
                G2_sq=self.G2_sq,
                n=self.n,
                T=self.T,
                delta_F=dF_s,
                drift_sum=self.drift_sum,
                eta=self.eta_server,
            ),
        ]


class LightFedslInputs(_Inputs):
    """Lightweight FedSL Theorem 1 with per-layer constants. The client layers' quantization error is
    ``J2`` as given, or from ``bits`` (q-bit quantizer over ``layer_sizes`` values spanning
    ``grad_range``), or 0."""

    paper: Literal["light_fedsl"]
    beta: Pos
    eta: Pos | Literal["max"] = "max"
    T: PositiveInt
    K: PositiveInt
    I: PositiveInt = 1  # noqa: E741  (the paper's symbol)
    Lc: PositiveInt
    rho_f: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    sigma2: list[NonNeg]
    G2: list[NonNeg]
    W2: list[NonNeg]
    J2: list[NonNeg] | None = None
    bits: PositiveInt | None = None
    grad_range: NonNeg = 1.0
    layer_sizes: list[PositiveInt] | None = None
    theta: float

    def step(self) -> float:
        return light_fedsl.step_cap(self.beta) if self.eta == "max" else float(self.eta)

    def quantization(self) -> list[float]:
        if self.J2 is not None:
            return list(self.J2)
        if self.bits is None:
            return [0.0] * self.Lc
        if self.layer_sizes is None or len(self.layer_sizes) < self.Lc:
            raise ConfigError("theory.layer_sizes", "needs a size for each client layer when bits is set")
        sizes = self.layer_sizes[: self.Lc]
        return [light_fedsl.quantization_error(s, self.grad_range, 0.0, self.bits) for s in sizes]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "eta": self.step(), "J2": self.quantization()}

    def _bounds(self) -> list[Bound]:
        return [
            light_fedsl.thm1(
                beta=self.beta,
                eta=self.step(),
                T=self.T,
                K=self.K,
                I=self.I,
                Lc=self.Lc,
                rho_f=self.rho_f,
                sigma2=self.sigma2,
                G2=self.G2,
                W2=self.W2,
                J2=self.quantization(),
                theta=self.theta,
            )
        ]


class HistInputs(_Inputs):
    """HIST Theorems 1 (and 2 when ``aircomp_mse`` is set) for N cells of ``clients_per_cell`` clients
    (one number for all cells, or one per cell). ``d_max_avg`` defaults to d / N (equal uniform masks)."""

    paper: Literal["hist"]
    L: Pos
    gamma: Pos | Literal["max", "corollary"] = "max"
    T: PositiveInt
    E: PositiveInt
    H: PositiveInt
    N: PositiveInt = 2
    clients_per_cell: PositiveInt | list[PositiveInt] = 10
    sigma2: NonNeg
    delta1_sq: NonNeg
    delta2_sq: NonNeg
    d: PositiveInt
    d_max_avg: NonNeg | None = None
    model_sq_avg: NonNeg = 0.0
    delta_f: float
    aircomp_mse: NonNeg | None = None

    @field_validator("clients_per_cell")
    @classmethod
    def _cells(cls, value: int | list[int], info: ValidationInfo) -> int | list[int]:
        N = info.data.get("N")
        if isinstance(value, list) and N is not None and len(value) != N:
            raise ValueError(f"lists {len(value)} cells but N = {N}")
        return value

    def cells(self) -> list[int]:
        per = self.clients_per_cell
        return list(per) if isinstance(per, list) else [per] * self.N

    def step(self) -> float:
        nt = hist.n_tilde(self.cells())
        if self.gamma == "max":
            return hist.gamma_max(self.N, self.E, self.H, self.L, nt)
        if self.gamma == "corollary":
            return hist.corollary_gamma(self.T, self.E, self.H, nt)
        return float(self.gamma)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "gamma": self.step()}

    def _bounds(self) -> list[Bound]:
        return [
            hist.thm1(
                L=self.L,
                gamma=self.step(),
                T=self.T,
                E=self.E,
                H=self.H,
                clients_per_cell=self.cells(),
                sigma2=self.sigma2,
                delta1_sq=self.delta1_sq,
                delta2_sq=self.delta2_sq,
                d=self.d,
                d_max_avg=self.d / self.N if self.d_max_avg is None else self.d_max_avg,
                model_sq_avg=self.model_sq_avg,
                delta_f=self.delta_f,
                aircomp_mse=self.aircomp_mse,
            )
        ]


PAPERS: dict[str, type[_Inputs]] = {
    "sfl": SflInputs,
    "cse_fsl": CseFslInputs,
    "light_fedsl": LightFedslInputs,
    "hist": HistInputs,
}


def parse_inputs(raw: dict[str, Any]) -> _Inputs:
    """Validate a ``theory:`` block into its paper's inputs, raising ConfigError naming ``theory.<key>``."""
    paper = raw.get("paper", "sfl")
    if paper not in PAPERS:
        raise ConfigError("theory.paper", f"unknown paper {paper!r}; known: {', '.join(PAPERS)}")
    try:
        return PAPERS[paper].model_validate({**raw, "paper": paper})
    except ValidationError as error:
        first = error.errors()[0]
        loc = first["loc"]  # the field, then list indices or the union member tried (dropped)
        key = ".".join(
            ["theory", *(str(p) for p in loc[:1]), *(str(p) for p in loc[1:] if isinstance(p, int))]
        )
        message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        raise ConfigError(key, message) from None
