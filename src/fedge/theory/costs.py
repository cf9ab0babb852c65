"""Analytic communication loads and storage of the split-learning family (CSE-FSL Tables II and V).

The formulas count what the protocol sends, per event, in bits: every smashed-data upload carries its
batch's ``B * q`` values, a returned gradient (SplitFed) the same, and each aggregation one download and
one upload of the client model plus aux head per participant. Over R rounds of E local epochs with
``Nb`` batches each, that is (Table II in the form that reproduces Table V; docs/decisions.md,
"Communication load as Table V counts it")::

    load = R * ( k_s * n * S * q * b  +  2 * n * (P_client + P_aux) * b )

with ``b`` bits per value, ``k_s`` = 2 for FSL_MC / FSL_OC (activations up, gradients down) and 1 for
FSL_AN / CSE-FSL, and ``S`` the samples whose smashed data one client uploads per round: all of them,
except for CSE-FSL, which uploads only the last batch of each complete block of h batches. Labels travel
with every upload but Table V does not count them: they are reported apart. The ledger of a run with the
same settings records exactly these bits (a test checks it), and :func:`table_v` reproduces every load
and storage value of the paper's Table V. Loads in "GB" are GiB (2^30 bytes), storage in millions of
parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

GIB_BITS = 8 * 2**30
METHODS = ("splitfed_v1", "splitfed_v2", "fsl_an", "cse_fsl")
_RETURNS_GRADIENT = {"splitfed_v1": True, "splitfed_v2": True, "fsl_an": False, "cse_fsl": False}
_SERVER_COPIES = {"splitfed_v1": True, "splitfed_v2": False, "fsl_an": True, "cse_fsl": False}


def _check(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown split method {method!r}; known: {', '.join(METHODS)}")


def has_aux(method: str) -> bool:
    """Whether ``method``'s clients carry an auxiliary head (FSL_AN, CSE-FSL)."""
    _check(method)
    return not _RETURNS_GRADIENT[method]


@dataclass(frozen=True)
class SplitLoad:
    """Bits sent over a run, by kind. ``total_bits`` leaves labels out, as Table V does."""

    smashed_bits: int
    gradient_bits: int
    model_bits: int
    label_bits: int

    @property
    def total_bits(self) -> int:
        return self.smashed_bits + self.gradient_bits + self.model_bits

    @property
    def gib(self) -> float:
        """The Table V figure: label-free load in GiB."""
        return self.total_bits / GIB_BITS


def uploaded_samples(
    method: str,
    samples_per_client: int,
    batch_size: int,
    h: int = 1,
    epochs: int = 1,
    drop_last: bool = False,
    upload_phase: Literal["last", "first"] = "last",
    drop_incomplete_block: bool = False,
) -> int:
    """Samples whose smashed data one client uploads in one round of ``epochs`` local epochs.

    Every batch for FSL_MC, FSL_OC and FSL_AN; for CSE-FSL the last batch of each complete block of ``h``
    batches, or with ``upload_phase="first"`` the first batch of every block, an incomplete final one
    included unless ``drop_incomplete_block`` (docs/decisions.md, "The last batch of each block of h is
    uploaded"), blocks counted over the round's consecutive local steps.
    """
    _check(method)
    full, rest = divmod(samples_per_client, batch_size)
    sizes = [batch_size] * full + ([] if drop_last or rest == 0 else [rest])
    sizes = sizes * epochs
    step = h if method == "cse_fsl" else 1
    if drop_incomplete_block:
        sizes = sizes[: len(sizes) // step * step]
    return sum(sizes[(0 if upload_phase == "first" else step - 1) :: step])


def communication_load(
    method: str,
    *,
    rounds: int,
    clients: int,
    samples_per_client: int,
    batch_size: int,
    smashed_size: int,
    client_params: int,
    aux_params: int = 0,
    h: int = 1,
    epochs: int = 1,
    drop_last: bool = False,
    upload_phase: Literal["last", "first"] = "last",
    drop_incomplete_block: bool = False,
    value_bits: int = 32,
    label_bits: int = 32,
) -> SplitLoad:
    """Bits sent by ``method`` over ``rounds`` rounds with ``clients`` participants each (CSE-FSL Table II).

    Counted as Table V counts it (docs/decisions.md, "Communication load as Table V counts it").

    ``aux_params`` is ignored by the methods without an aux head; ``h``, ``upload_phase`` and
    ``drop_incomplete_block`` only by CSE-FSL.
    """
    samples = uploaded_samples(
        method, samples_per_client, batch_size, h, epochs, drop_last, upload_phase, drop_incomplete_block
    )
    smashed = rounds * clients * samples * smashed_size * value_bits
    model = rounds * 2 * clients * (client_params + (aux_params if has_aux(method) else 0)) * value_bits
    return SplitLoad(
        smashed_bits=smashed,
        gradient_bits=smashed if _RETURNS_GRADIENT[method] else 0,
        model_bits=model,
        label_bits=rounds * clients * samples * label_bits,
    )


@dataclass(frozen=True)
class SplitStorage:
    """Parameters the server holds: its model copies and the client models (+ aux) it averages."""

    server_model_params: int
    client_models_params: int
    table2_params: int

    @property
    def total_params(self) -> int:
        """Table V's storage: everything on the server."""
        return self.server_model_params + self.client_models_params


def server_storage(
    method: str, *, clients: int, server_params: int, client_params: int, aux_params: int = 0
) -> SplitStorage:
    """Server-side storage of ``method`` with ``clients`` participants (CSE-FSL Tables II and V).

    Table V: ``S * P_server + n * (P_client + P_aux)`` with S = n copies (FSL_MC, FSL_AN) or 1 (FSL_OC,
    CSE-FSL). ``table2_params`` is Table II's literal "server storage" (n|w|, n(|w|+|a|), |w|+|a|; |w| for
    FSL_OC, which Table II omits), which leaves out the client copies held for averaging.
    """
    aux = aux_params if has_aux(method) else 0
    copies = clients if _SERVER_COPIES[method] else 1
    whole = client_params + server_params + aux
    return SplitStorage(
        server_model_params=copies * server_params,
        client_models_params=clients * (client_params + aux),
        table2_params=copies * whole,
    )


# The paper's set-ups (CSE-FSL Sec. VI-A, Tables III-V). F-EMNIST's FSL_MC/FSL_OC runs processed 209 samples
# per client, the FSL_AN/CSE-FSL runs 200 (the partial 21st batch dropped): only so do Table V's loads come
# out (docs/decisions.md, "F-EMNIST baselines processed 209 samples per client").
PAPER_SETUPS: dict[str, dict[str, Any]] = {
    "cifar10": {
        "rounds": 200,
        "clients": 5,
        "samples_per_client": {"default": 10_000},
        "batch_size": 50,
        "smashed_size": 64 * 6 * 6,
        "client_params": 107_328,
        "server_params": 960_970,
        "aux_params": 23_050,
        "h": (5, 10, 25, 50),
    },
    "femnist": {
        "rounds": 500,
        "clients": 5,
        "samples_per_client": {"default": 200, "splitfed_v1": 209, "splitfed_v2": 209},
        "batch_size": 10,
        "smashed_size": 64 * 12 * 12,
        "client_params": 18_816,
        "server_params": 1_187_774,
        "aux_params": 571_454,
        "h": (2, 4, 5),
    },
}


PRINTED_TABLE_V: dict[tuple[str, str, int], tuple[float, float]] = {
    # (dataset, method, h): (load GiB, server storage M params) as printed in CSE-FSL Table V
    ("cifar10", "splitfed_v1", 1): (172.46, 5.34),
    ("cifar10", "splitfed_v2", 1): (172.46, 1.50),
    ("cifar10", "fsl_an", 1): (86.80, 5.46),
    ("cifar10", "cse_fsl", 5): (18.14, 1.61),
    ("cifar10", "cse_fsl", 10): (9.55, 1.61),
    ("cifar10", "cse_fsl", 25): (4.40, 1.61),
    ("cifar10", "cse_fsl", 50): (2.69, 1.61),
    ("femnist", "splitfed_v1", 1): (36.23, 6.03),
    ("femnist", "splitfed_v2", 1): (36.23, 1.28),
    ("femnist", "fsl_an", 1): (28.16, 8.89),
    ("femnist", "cse_fsl", 2): (19.58, 4.14),
    ("femnist", "cse_fsl", 4): (15.29, 4.14),
    ("femnist", "cse_fsl", 5): (14.43, 4.14),
}


def table_v() -> list[dict[str, Any]]:
    """Load (GiB) and server storage (M params) of every Table V row, computed from :data:`PAPER_SETUPS`."""
    rows = []
    for dataset, setup in PAPER_SETUPS.items():
        variants = [(m, 1) for m in METHODS[:3]] + [("cse_fsl", h) for h in setup["h"]]
        for method, h in variants:
            samples = setup["samples_per_client"]
            load = communication_load(
                method,
                rounds=setup["rounds"],
                clients=setup["clients"],
                samples_per_client=samples.get(method, samples["default"]),
                batch_size=setup["batch_size"],
                smashed_size=setup["smashed_size"],
                client_params=setup["client_params"],
                aux_params=setup["aux_params"],
                h=h,
            )
            storage = server_storage(
                method,
                clients=setup["clients"],
                server_params=setup["server_params"],
                client_params=setup["client_params"],
                aux_params=setup["aux_params"],
            )
            rows.append(
                {
                    "dataset": dataset,
                    "method": method,
                    "h": h,
                    "load_gib": load.gib,
                    "storage_mparams": storage.total_params / 1e6,
                    "table2_storage_mparams": storage.table2_params / 1e6,
                }
            )
    return rows
