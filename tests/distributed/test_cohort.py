"""The cohort seam in one process: which rows each of K processes runs, and that every collective puts
them back as one process has them.

A process of a K-process run is played here by a :class:`Group` with that rank and size whose collectives
return this process's own part (no peers to talk to): what each rank computes before the exchange is
checked against the one-process result, and the exchange is the concatenation (or sum) of the parts.
The real exchange over gloo ranks is tests/distributed/test_distributed.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedge.comm import Ledger, Link, get_codec, nodes
from fedge.distributed import SINGLE_PROCESS, Cohorts, Group


class Rank(Group):
    """Rank ``rank`` of ``size`` processes, without peers: every collective returns this rank's part."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


def ranks(size: int) -> list[Cohorts]:
    return [Cohorts(Rank(r, size)) for r in range(size)]


@pytest.mark.parametrize("total,size", [(7, 2), (6, 3), (2, 3)])
def test_rows_are_contiguous_blocks_in_rank_order(total, size):
    items = np.arange(total) * 10
    for make in ("of", "clients"):
        cohorts = [getattr(c, make)(total) for c in ranks(size)]
        assert [c.total for c in cohorts] == [total] * size
        assert np.concatenate([c.take(items) for c in cohorts]).tolist() == items.tolist()
        assert sum((c.take(list(items)) for c in cohorts), []) == items.tolist()
        assert max(map(len, cohorts)) - min(map(len, cohorts)) <= 1
        stacked = {"w": torch.arange(total * 2.0).reshape(total, 2)}
        assert torch.equal(torch.cat([c.take_rows(stacked)["w"] for c in cohorts]), stacked["w"])


def test_one_process_runs_every_row_and_every_collective_is_the_identity():
    cohort = SINGLE_PROCESS.of(5)
    assert (cohort.start, cohort.stop, cohort.total, cohort.spread) == (0, 5, 5, False)
    assert SINGLE_PROCESS.processes == 1
    x = {"w": torch.randn(5, 3)}
    assert cohort.sum(x) is x and cohort.gather(x) is x and cohort.sum_float(2.5) == 2.5
    assert torch.equal(cohort.mean(x["w"][:, 0]), x["w"][:, 0].mean())


def test_part_numbers_a_sub_cohort_from_its_first_row():
    """Three cells of 3 rows over 2 processes (rows 0-4 and 5-8): cell 1 (rows 3-5) is rows 0-1 on
    process 0 and row 2 on process 1; cell 2 is not on process 0 at all, cell 0 not on process 1."""
    first, second = (c.of(9) for c in ranks(2))
    assert (first.start, first.stop, second.start, second.stop) == (0, 5, 5, 9)
    cell = slice(3, 6)
    assert [(p.start, p.stop, p.total) for p in (first.part(cell), second.part(cell))] == [
        (0, 2, 3),
        (2, 3, 3),
    ]
    assert len(first.part(slice(6, 9))) == 0 and len(second.part(slice(0, 3))) == 0
    whole = SINGLE_PROCESS.of(9).part(cell)
    assert (whole.start, whole.stop, whole.total) == (0, 3, 3)


def test_map_runs_work_on_this_process_rows_and_sums_the_tally():
    """Each process works on its rows and counts its clients' samples; the counters come back holding
    only this process's additions here (its peers' arrive through the sum), so the processes' counters
    add up to one process's."""
    samples = np.array([3.0, 1.0, 4.0, 1.0, 5.0])

    def run(cohorts: Cohorts) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        tally = np.zeros(5)

        def work(rows: slice) -> dict[str, torch.Tensor]:
            np.add.at(tally, np.arange(5)[rows], samples[rows])
            return {"twice": torch.as_tensor(samples[rows] * 2)}

        return cohorts.of(5).map(work, tally=(tally,)), tally

    one, one_tally = run(SINGLE_PROCESS)
    assert one["twice"].tolist() == (samples * 2).tolist() and one_tally.tolist() == samples.tolist()
    parts = [run(c) for c in ranks(2)]
    assert torch.equal(torch.cat([p[0]["twice"] for p in parts]), one["twice"])
    assert (parts[0][1] + parts[1][1]).tolist() == one_tally.tolist()


@pytest.mark.parametrize("codec", ["q4", "randk:0.5"])
def test_a_stochastic_send_over_processes_draws_the_noise_of_one_process(codec):
    """Rows 0-2 and 3-4 of a cohort of 5 senders sent by two processes (each with its copy of the link, as
    every rank builds it from the seed): the rows received are those one process receives, noise
    included, in two sends of one kind in a round (the second draws new noise)."""
    payload = {"w": torch.randn(5, 3, 4), "b": torch.randn(5, 4)}
    src = nodes.clients(range(5))

    def sends(cohorts: Cohorts, rows: dict[str, torch.Tensor]):
        link = Link(Ledger(), get_codec(codec), seed=11)
        cohort = cohorts.of(5)
        return [cohort.send(link, 2, src, nodes.SERVER, "model_up", rows) for _ in range(2)]

    one = sends(SINGLE_PROCESS, payload)
    parts = [sends(c, c.of(5).take_rows(payload)) for c in ranks(2)]
    for k in range(2):
        for name in payload:
            rows = torch.cat([part[k].payload[name] for part in parts])
            assert torch.equal(rows, one[k].payload[name]), (k, name)
        assert np.concatenate([part[k].bits for part in parts]).tolist() == one[k].bits.tolist()
    assert not torch.equal(one[0].payload["w"], one[1].payload["w"])
