"""Malicious peers and malicious cell members on rows spread over processes (torchrun): what each
process poisons and what it gathers to get one process's numbers.

Peers (:mod:`fedge.runtime.peer_adversary`): the decentralized family all-gathers the trained rows
after every training call and mixes on every process, so every process poisons every sent row after
that gather, as one process does (:meth:`~fedge.runtime.peer_adversary.PeerAdversary.sent`, the models
a selector scores included). AFIND+'s poisoned proxies are formed in each process's share of the
requesters, and a requester's probed pairs are all in its share, so each requester's attack reads
only its own holders' proxies. Nothing is gathered for the poisoning: no value, no byte; every process
repeats the ``R x d`` poisoning of the round's sent rows. A backdoor's ``attack_success`` is measured on
each process's evaluation block of peers, so each evaluation gathers the honest peers' rates (one
float64 each; :meth:`~fedge.runtime.peer_adversary.PeerAdversary.success`).

Cells (:mod:`fedge.runtime.cell_adversary`): a cell's members may span processes, and each process
uploads only its rows of them. The rank-local attacks (the backdoor's boost included) replace this
process's attacking rows with the cell's counts (``scaling``'s ``n / m`` over the whole cell) and their
noise keys (by client), and no collective. The omniscient ones (``alie``, ``ipm``, ``min_max``,
``min_sum``) read the cell's honest uploads of the edge round: :func:`cell_poisoned` first all-gathers
them (every upload where nobody is honest), floating tensors only, in the cell's order. Cost, per edge
round and cell with an attacker: ``H x d`` values (``H`` honest members, ``d`` the cell's submodel's
real values and floating buffers; ``4 H d`` bytes at fp32) reach every process, plus one all-gather of
the row counts. The figures read every member's edge weight and the edge reducer's reports, which name
every row.
"""

from __future__ import annotations

import numpy as np
import torch

from fedge.distributed import Cohort
from fedge.runtime.adversary import Adversary, gathered_reads, poisoned
from fedge.runtime.cell_adversary import edge_noise
from fedge.tensors import Tensors


def cell_poisoned(
    adversary: Adversary,
    round_: int,
    edge_round: int,
    members: np.ndarray,
    rows: Tensors,
    reference: Tensors,
    cell: Cohort,
) -> Tensors:
    """A cell's uploads ``rows`` (this process's part ``cell`` of its ``members``' rows, the values its
    submodel holds) with the attacking members' replaced, ``reference`` the model the edge broadcast;
    with the cell's counts, and the cell's honest uploads gathered for an omniscient attack (a
    collective: every process calls it for every cell with an attacker)."""
    every = adversary.mask(round_, members)
    here = every[cell.rows]
    device = next(iter(reference.values())).device
    mask = torch.as_tensor(here, device=device)
    attack, options = adversary.config.attack, adversary.config.options
    honest = gathered_reads(attack, cell, every, mask, rows)
    noise = edge_noise(adversary, round_, edge_round, members[cell.rows][here], device)
    counts = (len(members), int(every.sum()))
    return poisoned(attack, options, rows, reference, mask, noise, counts=counts, honest=honest)
