"""What a peer-selection component sees of its host: a narrow view, not the algorithm itself.

AFIND+'s selector and the hosts' peer choice need the graph, what probing reads (model, data, private
names, the clients' current rows), probe losses, random peers, a way to count their probe work for the
simulated clock, three kinds of sends and a way to spread work over the run's processes.
:class:`PeerView` names exactly those; ``PeerAlgorithm.view()`` builds it. The callables read the
host's state when called (its bank and links may change between rounds), so a view built once stays
valid for the whole run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedge.algorithms.decentralized.probes import ProbeBatches
from fedge.data.federated import FederatedData
from fedge.models import SplitModel
from fedge.runtime.peer_adversary import PeerAdversary
from fedge.tensors import Tensors

Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (shared_from, private_from, data_from)


@dataclass(frozen=True)
class PeerView:
    """A host's graph, probing inputs, current state and senders, as a selector may use them.

    - ``neighbours``: boolean ``[n, n]`` graph; selections never leave a client's row of it.
    - ``seed``: the run seed, for the component's own named random streams.
    - ``current()``: the clients' params and buffers now (row i = client i).
    - ``shared(tensors)``: the tensors that travel (not private, not integer counters).
    - ``losses_on(params, buffers, pairs, batches)``: probe-batch losses of rows, counted as forward work
      of the clients whose batch they use (split over the run's processes, gathered in row order).
    - ``random_peers(t, k)``: ``k`` uniform random neighbours of every client in round ``t``.
    - ``count_probes(clients, batches, backward)``: each of ``clients`` ran one probe on its probe batch
      (a forward pass, and a backward pass for a gradient proxy).
    - ``request(pairs)``: requester i sends its shared model to j for every ``pairs[i, j]``.
    - ``reply(pairs)``: j sends its trained model back to i, encoded as the host sends models.
    - ``report(pairs, kind, shapes)``: j sends i a small dense message of tensors shaped ``shapes`` (a
      proxy, a loss), metered from its shapes: the selector scores with the exact values.
    - ``map_rows(total, work)``: ``work(rows)`` on this process's rows of a cohort of ``total`` rows, its
      tensors back in row order and its compute tally the whole cohort's (``PeerAlgorithm.map_rows``; in
      one process, all rows): how a selector spreads its probes over the run's processes.
    - ``adversary``: the run's malicious peers, whose probe answers a selector asks it for
      (:meth:`~fedge.runtime.peer_adversary.PeerAdversary.poisons_probes`); ``None`` without one.
    The senders return the number of transfers.
    """

    neighbours: torch.Tensor
    seed: int
    model: SplitModel
    data: FederatedData
    private: frozenset[str]
    current: Callable[[], tuple[Tensors, Tensors]]
    shared: Callable[[Tensors], Tensors]
    losses_on: Callable[[Tensors, Tensors, Pairs, ProbeBatches], torch.Tensor]
    random_peers: Callable[[int, int], np.ndarray]
    count_probes: Callable[[torch.Tensor, ProbeBatches, bool], None]
    request: Callable[[torch.Tensor], int]
    reply: Callable[[torch.Tensor], int]
    report: Callable[[torch.Tensor, str, Mapping[str, Sequence[int]]], int]
    map_rows: Callable[[int, Callable[[slice], Tensors]], Tensors]
    adversary: PeerAdversary | None = None

    @property
    def num_clients(self) -> int:
        """The number of clients n (rows of the graph)."""
        return len(self.neighbours)

    @property
    def device(self) -> torch.device:
        """Where the clients' state and the selector's matrices live."""
        return self.neighbours.device
