"""Codecs count exact bits; the ledger records every transfer and restores exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedge.comm import Ledger, direction, get_codec


def test_float_codecs_count_bits_and_round():
    tensors = {"w": torch.tensor([[1.0, 1.0 + 2**-12], [3.0, 4.0]]), "b": torch.zeros(3)}
    full = get_codec("fp32").transmit(tensors)
    assert full.bits.tolist() == [7 * 32]
    assert torch.equal(full.payload["w"], tensors["w"])
    half = get_codec("fp16").transmit(tensors)
    assert half.bits.tolist() == [7 * 16]
    assert half.payload["w"].dtype == torch.float32
    assert half.payload["w"][0, 1] == 1.0  # below half precision's resolution


def test_stacked_payload_gets_bits_per_sender():
    stacked = {"w": torch.randn(5, 3, 2), "b": torch.randn(5, 2)}
    encoded = get_codec("fp16").transmit(stacked, stacked=True)
    assert encoded.bits.tolist() == [8 * 16] * 5


def test_direction_follows_node_levels():
    assert direction("client:1", "server") == "up"
    assert direction("server", "client:0") == "down"
    assert direction("client:1", "client:2") == "peer"
    assert direction("edge:0", "cloud") == "up"


def test_ledger_totals_state_and_csv():
    ledger = Ledger()
    ledger.record(1, "server", ["client:0", "client:1"], "model_down", [100, 100])
    ledger.record(1, ["client:0", "client:1"], "server", "model_up", np.array([60, 40]))
    ledger.record(2, "client:0", "client:1", "model", 7)
    ledger.set_storage("server", "model", 320)
    ledger.set_storage("client:0", "model", 320)
    ledger.set_storage("client:0", "aux", 32)
    assert (
        ledger.total_bits("down") == 200 and ledger.total_bits("up") == 100 and ledger.total_bits("peer") == 7
    )
    assert ledger.total_bits(kinds=["model_up"]) == 100
    assert ledger.storage_bits() == {"server": 320, "client_max": 352}
    restored = Ledger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.to_csv() == ledger.to_csv()
    assert restored.totals() == ledger.totals()
    lines = ledger.to_csv().splitlines()
    assert lines[0] == "round,src,dst,kind,direction,bits" and len(lines) == 6
    assert lines[3] == "1,client:0,server,model_up,up,60"


def test_ledger_names_kinds_nodes_and_peak_storage():
    ledger = Ledger()
    ledger.record(1, "server", ["client:0", "client:1"], "model_down", 10)
    ledger.record(1, "client:1", "server", "model_up", 10)
    ledger.set_storage("client:0", "model", 100)
    ledger.set_storage("client:0", "aux", 50)
    ledger.set_storage("client:0", "model", 20)
    assert ledger.kinds() == ["model_down", "model_up"]
    assert ledger.nodes() == ["server", "client:0", "client:1"]
    assert ledger.peak_storage() == {"client:0": 150}
    restored = Ledger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.kinds() == ledger.kinds() and restored.peak_storage() == {"client:0": 150}


def test_a_link_counts_the_real_rows_and_records_one_entry_per_sender():
    from fedge.comm import Network, nodes

    network = Network(Ledger())
    link = network.link("fp16")
    z = torch.randn(3, 4, 5)
    lengths = torch.tensor([4, 0, 2])
    sent = link.send(
        1, nodes.clients(range(3)), nodes.SERVER, "smashed_up", {"z": z}, stacked=True, lengths=lengths
    )
    assert sent.bits.tolist() == [4 * 5 * 16, 0, 2 * 5 * 16]  # the idle row sends nothing
    assert torch.equal(sent.payload["z"], z.half().float())  # what the receiver decodes
    csv = network.ledger.to_csv().splitlines()[1:]
    assert csv == ["1,client:0,server,smashed_up,up,320", "1,client:2,server,smashed_up,up,160"]


def test_a_link_counts_kept_entries_broadcasts_and_fan_out():
    from fedge.comm import Network, nodes

    network = Network(Ledger())
    link = network.link("fp32")
    keep = torch.zeros(2, 3, 4)
    keep[0, :2] = 1
    keep[1, 0, :1] = 1
    kept = link.send(
        1,
        nodes.clients([5, 6]),
        nodes.SERVER,
        "smashed_up",
        {"z": torch.ones(2, 3, 4)},
        stacked=True,
        entry_mask=keep,
    )
    assert kept.bits.tolist() == [8 * 32, 1 * 32]
    model = {"w": torch.zeros(10), "b": torch.zeros(2)}
    down = link.send(2, nodes.SERVER, nodes.clients([1, 2, 3]), "model_down", model)
    assert down.bits.tolist() == [12 * 32] and network.ledger.total_bits("down") == 3 * 12 * 32
    rows = {"w": torch.ones(2, 10)}
    link.send(
        3,
        nodes.clients([0, 0, 1]),
        nodes.clients([1, 2, 0]),
        "peer_model",
        rows,
        stacked=True,
        row_of=[0, 0, 1],
    )
    assert network.ledger.totals()[("peer_model", "peer")] == 3 * 10 * 32


@pytest.mark.parametrize("codec", ["fp32", "fp16", "q4", "topk:0.5", "sparse", "bitmap"])
def test_an_accounted_transfer_records_what_the_same_send_records(codec):
    from fedge.comm import Network, nodes

    payload = {"w": torch.randn(4, 6), "b": torch.randn(6), "scale": torch.tensor(2.0)}
    payload["w"][0] = 0.0  # a row of exact zeros, which a sparse codec counts
    shapes = {name: tuple(t.shape) for name, t in payload.items()}
    kept = {name: int(torch.count_nonzero(t)) for name, t in payload.items()}
    ledgers = []
    for metered_only in (False, True):
        network = Network(Ledger(), seed=7)
        link = network.link(codec)
        for t in (1, 2):
            src, dst = nodes.clients([1, 2, 3]), nodes.clients([0, 0, 2])
            if metered_only:
                bits = link.account(t, src, dst, "proxy", shapes, kept)
            else:
                bits = link.send(t, src, dst, "proxy", payload).bits
            assert bits.shape == (1,)
            link.send(t, nodes.SERVER, nodes.clients([0]), "proxy", {"x": torch.randn(5)})  # draws after it
        ledgers.append((network.ledger.to_csv(), link.row_seeds(2, "proxy", 1)))
    assert ledgers[0] == ledgers[1]


def test_an_accounted_transfer_counts_unnamed_tensors_as_non_zero():
    from fedge.comm import Network

    link = Network(Ledger()).link("sparse")
    shapes = {"w": (3, 3), "b": (3,)}
    assert link.account(1, "client:0", "client:1", "peer_model", shapes, {"w": 1}).tolist() == [
        (32 + 4) + 3 * 32  # one coordinate of w, b dense
    ]
    assert link.account(1, "client:0", [], "peer_model", shapes).tolist() == [12 * 32]  # no transfer
    assert link.ledger.entry_count() == 1


def test_storage_is_metered_by_the_codec_and_plain_state_at_fp32():
    from fedge.comm import Network, nodes, state_bits

    network = Network(Ledger())
    sparse = network.link("sparse")
    pruned = {"w": torch.tensor([[0.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 4.0]])}
    held = sparse.store(nodes.clients([0, 1]), "model", pruned, stacked=True)
    assert held.tolist() == [1 * (32 + 2), 4 * 32]  # a coordinate list beats dense for one non-zero
    state = {"w": torch.zeros(3, 3), "steps": torch.zeros((), dtype=torch.int64)}
    network.hold(nodes.SERVER, "model", state)
    assert network.ledger.storage["server"]["model"] == state_bits(state) == 9 * 32
    assert network.ledger.peak_storage()["client:1"] == 128
