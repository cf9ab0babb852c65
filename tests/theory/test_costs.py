"""fedge.theory.costs: Table V's loads and storage exactly, and the ledger of real runs equal to the
formulas."""

from __future__ import annotations

import pytest
from tiers import parametrize_first_by_default

import fedge
from fedge.runner.loop import build_run
from fedge.theory import costs


def test_table_v_loads_and_storage_are_reproduced_exactly():
    rows = {(r["dataset"], r["method"], r["h"]): r for r in costs.table_v()}
    assert set(rows) == set(costs.PRINTED_TABLE_V)
    for key, (load, storage) in costs.PRINTED_TABLE_V.items():
        assert round(rows[key]["load_gib"], 2) == load, key
        assert round(rows[key]["storage_mparams"], 2) == storage, key


def test_storage_savings_and_cnn_aux_variants():
    cifar, femnist = costs.PAPER_SETUPS["cifar10"], costs.PAPER_SETUPS["femnist"]

    def total(setup, method, aux):
        return costs.server_storage(
            method,
            clients=5,
            server_params=setup["server_params"],
            client_params=setup["client_params"],
            aux_params=aux,
        ).total_params

    for setup, saving in ((cifar, 0.704), (femnist, 0.534)):
        an, cse = (total(setup, m, setup["aux_params"]) for m in ("fsl_an", "cse_fsl"))
        assert round(1 - cse / an, 3) == saving
    # F-EMNIST CSE storage with the CNN+MLP aux (Table IV) of k = 64/32/8/2 channels (8993k + 62 params)
    cnn = [round(total(femnist, "cse_fsl", 8993 * k + 62) / 1e6, 2) for k in (64, 32, 8, 2)]
    assert cnn == [4.16, 2.72, 1.64, 1.37]


def test_table2_literal_storage_leaves_out_the_client_copies():
    s = costs.server_storage("cse_fsl", clients=5, server_params=100, client_params=10, aux_params=3)
    assert (s.table2_params, s.total_params) == (113, 100 + 5 * 13)
    mc = costs.server_storage("splitfed_v1", clients=5, server_params=100, client_params=10, aux_params=3)
    assert mc.table2_params == 5 * 110 and mc.client_models_params == 5 * 10  # no aux head in FSL_MC


def test_added_clients_grow_storage_as_the_paper_says():
    """Each client adds |w| to MC, |w|+|a| to AN, but only P_client to OC and P_client+P_aux to CSE."""
    pc, ps, pa = 7, 100, 3

    def total(method, n):
        return costs.server_storage(
            method, clients=n, server_params=ps, client_params=pc, aux_params=pa
        ).total_params

    steps = {m: total(m, 11) - total(m, 10) for m in costs.METHODS}
    assert steps == {"splitfed_v1": pc + ps, "splitfed_v2": pc, "fsl_an": pc + ps + pa, "cse_fsl": pc + pa}
    assert {total("cse_fsl", n) - n * (pc + pa) for n in (5, 10, 50)} == {ps}  # one server model


def test_uploaded_samples_count_complete_blocks_only():
    assert costs.uploaded_samples("fsl_an", 45, 10) == 45
    assert costs.uploaded_samples("cse_fsl", 45, 10, h=2) == 20  # blocks (10,10), (10,10); 5 left over
    assert costs.uploaded_samples("cse_fsl", 50, 10, h=5) == 10
    assert costs.uploaded_samples("cse_fsl", 45, 10, h=5) == 5  # the block's last batch is the short one
    assert costs.uploaded_samples("cse_fsl", 45, 10, h=5, drop_last=True) == 0
    assert costs.uploaded_samples("cse_fsl", 40, 10, h=3, epochs=2) == 20  # blocks run across epochs


def test_uploaded_samples_of_the_first_batch_of_each_block():
    first = {"upload_phase": "first"}
    assert costs.uploaded_samples("cse_fsl", 45, 10, h=2, **first) == 25  # batches 1, 3, 5 (the short one)
    assert costs.uploaded_samples("cse_fsl", 45, 10, h=2, drop_incomplete_block=True, **first) == 20
    assert costs.uploaded_samples("cse_fsl", 45, 10, h=5, **first) == 10
    assert costs.uploaded_samples("fsl_an", 45, 10, **first) == 45
    with pytest.raises(ValueError, match="unknown split method"):
        costs.uploaded_samples("fedavg", 10, 10)


def _tiny_cifar(name: str, clients: int = 2, **algorithm) -> dict:
    """Byte counts: CIFAR-shaped synthetic data, the paper's CIFAR split model, 40 samples per client."""
    return {
        "seed": 0,
        "rounds": 1,
        "data": {"name": "synthetic", "num_train": 40 * clients, "num_test": 10, "shape": [3, 24, 24]},
        "partition": {"kind": "iid", "num_clients": clients},
        "model": {"name": "cse_cifar"},
        "algorithm": {"name": name, "batch_size": 10, **algorithm},
        "output": {"plots": False},
    }


@parametrize_first_by_default(
    ("method", "h", "phase"),
    [
        ("splitfed_v1", 1, "last"), ("splitfed_v2", 1, "last"), ("fsl_an", 1, "last"), ("cse_fsl", 1, "last"),
        ("cse_fsl", 2, "last"), ("cse_fsl", 4, "last"), ("cse_fsl", 3, "last"), ("cse_fsl", 3, "first"),
    ],
)  # fmt: skip
def test_ledger_of_a_real_run_equals_the_formula(method, h, phase):
    extra = {"h": h, "upload_phase": phase} if method == "cse_fsl" else {}
    built = build_run(fedge.resolve_config(_tiny_cifar(method, **extra)))
    built.algorithm.run_round(1)
    ledger = built.context.ledger
    totals = {kind: ledger.total_bits(kinds=[kind]) for kind, _ in ledger.totals()}
    load = costs.communication_load(
        method,
        rounds=1,
        clients=2,
        samples_per_client=40,
        batch_size=10,
        smashed_size=2304,
        client_params=107_328,
        aux_params=23_050,
        h=h,
        upload_phase=phase,
    )
    assert totals["smashed_up"] == load.smashed_bits
    assert totals.get("grad_down", 0) == load.gradient_bits
    assert totals["labels_up"] == load.label_bits
    model = sum(totals.get(k, 0) for k in ("model_up", "model_down", "aux_up", "aux_down"))
    assert model == load.model_bits
    assert ledger.total_bits() - totals["labels_up"] == load.total_bits
    storage = costs.server_storage(
        method, clients=2, server_params=960_970, client_params=107_328, aux_params=23_050
    )
    assert ledger.storage_bits()["server"] == 32 * storage.total_params


def test_r3_ratios_between_methods():
    """CSE_h smashed traffic = FSL_AN / h; FSL_MC = FSL_OC = 2 x FSL_AN (smashed + gradients)."""

    def smashed_and_gradients(method, h=1):
        load = costs.communication_load(
            method,
            rounds=3,
            clients=2,
            samples_per_client=40,
            batch_size=10,
            smashed_size=2304,
            client_params=1,
            h=h,
        )
        return load.smashed_bits + load.gradient_bits

    an = smashed_and_gradients("fsl_an")
    assert [smashed_and_gradients("cse_fsl", h) * h for h in (1, 2, 4)] == [an] * 3
    assert smashed_and_gradients("splitfed_v1") == smashed_and_gradients("splitfed_v2") == 2 * an


@pytest.mark.parametrize("clients", [2, 3])
def test_ledger_storage_matches_the_formula_for_every_method(clients):
    for method in costs.METHODS:
        ledger = build_run(fedge.resolve_config(_tiny_cifar(method, clients=clients))).context.ledger
        expected = costs.server_storage(
            method, clients=clients, server_params=960_970, client_params=107_328, aux_params=23_050
        )
        assert ledger.storage["server"]["server_model"] == 32 * expected.server_model_params
        assert ledger.storage["server"]["client_models"] == 32 * expected.client_models_params
