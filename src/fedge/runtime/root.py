"""The FLTrust server's root training (Cao et al., NDSS 2021): each round the server trains a copy of the
broadcast model on its root set, as a client trains, and hands the result to its ``fltrust`` reducer.

The paper's root set is collected by the server itself. Here it is ``root_samples`` samples drawn once,
without replacement, from the whole training pool by the stream ``(seed, "fltrust-root")``: fedge's
partitions deal that pool out to the clients, so the root samples are (in general) also some clients'
samples, with their clean labels (a ``label_flip`` adversary does not reach them). The root training
uses the clients' local step (its loss and optimizer, a fresh optimizer state; DP-SGD's clipping and
noise left out: the root set is the server's own), batch size and ``drop_last``, with the clients'
``local_epochs`` and learning rate unless the stage's ``root_epochs`` and ``lr`` say otherwise. Its
batches come from ``(seed, "fltrust-root-batches", round, 0, epoch)`` and it runs on the run's executor as
one more row keyed as client ``num_clients`` (no client's id), so its dropout keys are its own. Its
FLOPs are charged to the server with the aggregation's (:meth:`RobustReducer.charge`). A hierarchy's edge
servers hold a root set each (:func:`edge_root_data`), HFedAvg's cloud one (:func:`cloud_root_data`);
the hierarchy's algorithm trains them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.aggregation.fltrust import FLTrust, RootUpdate
from fedge.data.federated import FederatedData
from fedge.engine import ClientBank, make_step
from fedge.engine.private_step import PrivateStep
from fedge.engine.step import Step, StepFn
from fedge.errors import ConfigError
from fedge.rng import numpy_rng
from fedge.runtime.context import Context
from fedge.system import training_flops
from fedge.tensors import Tensors


@dataclass(frozen=True)
class LocalWork:
    """How a round's clients train: their step, learning rate, epochs, batch size and ``drop_last``."""

    step: StepFn
    lr: float
    epochs: int
    batch_size: int
    drop_last: bool


def root_indices(seed: int, pool: int, count: int, key: str) -> np.ndarray:
    """The root set: ``count`` sorted training-sample indices of ``pool``, from ``(seed, "fltrust-root")``."""
    if count > pool:
        raise ConfigError(f"{key}.options.root_samples", f"{count} is more than the {pool} training samples")
    return np.sort(numpy_rng(seed, "fltrust-root").choice(pool, size=count, replace=False))


def edge_root_data(data: FederatedData, seed: int, count: int, edges: int, key: str) -> FederatedData:
    """The root sets of ``edges`` edge servers as the clients of a view of ``data``: edge ``j``'s is
    ``count`` sorted samples drawn without replacement from the whole training pool by the stream
    ``(seed, "fltrust-root-edge", j)``, each edge its own (clean labels, as the star server's)."""
    return _root_sets(data, seed, count, key, [("fltrust-root-edge", (j,)) for j in range(edges)])


def cloud_root_data(data: FederatedData, seed: int, count: int, key: str) -> FederatedData:
    """The cloud's root set as the one client of a view of ``data``: ``count`` sorted samples drawn
    without replacement from the whole training pool by the stream ``(seed, "fltrust-root-cloud")``."""
    return _root_sets(data, seed, count, key, [("fltrust-root-cloud", ())])


def _root_sets(
    data: FederatedData, seed: int, count: int, key: str, streams: list[tuple[str, tuple[int, ...]]]
) -> FederatedData:
    """A view of ``data`` whose clients hold ``count`` samples each, one per stream ``(seed, purpose,
    *keys)`` of ``streams``."""
    pool = len(data.x_train)
    if count > pool:
        raise ConfigError(f"{key}.options.root_samples", f"{count} is more than the {pool} training samples")
    sets = [
        np.sort(numpy_rng(seed, purpose, *keys).choice(pool, size=count, replace=False))
        for purpose, keys in streams
    ]
    view = data.holding(sets[0])
    view.client_train = sets
    view.client_test = [np.arange(data.dataset.num_test, dtype=np.int64)] * len(sets)
    return view


def root_update(
    ctx: Context,
    round_: int,
    work: LocalWork,
    reducer: FLTrust,
    model: tuple[Tensors, Tensors],
    flops_per_sample: float,
) -> RootUpdate:
    """The server's model of round ``round_`` trained on its root set from the broadcast ``model``
    (parameters, buffers; see the module), and its training FLOPs."""
    data, key = ctx.data, reducer.run.key
    root = data.holding(root_indices(ctx.seed, len(data.x_train), reducer.root_samples, key))
    epochs = work.epochs if reducer.root_epochs is None else reducer.root_epochs
    plan = root.batch_plan([0], round_, epochs, work.batch_size, work.drop_last, "fltrust-root-batches")
    if not isinstance(work.step, Step | PrivateStep):
        raise ConfigError(
            f"{key}.name", "fltrust trains the root set with the clients' step; this one is not"
        )
    step = make_step(work.step.loss_fn, work.step.optimizer)
    params, buffers = model
    bank = ClientBank.broadcast([data.num_clients], params, buffers, step.optimizer.init(params))
    ctx.executor.train(step, bank, plan, root, work.lr if reducer.lr is None else reducer.lr)
    trained = {name: t[0] for name, t in {**bank.params, **bank.buffers}.items()}
    flops = training_flops(flops_per_sample, float(plan.weight.sum()))
    return RootUpdate(trained, float(flops))
