"""Data-parallel training with ``torch.distributed`` (``torchrun --nproc_per_node N mlip-unc ...``).

Without torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) nothing here does anything: every helper answers for one process (rank 0 of
1) and no collective runs. With it, :func:`session` (entered by the ``train`` commands)
initialises the default process group from those variables: ``gloo`` on CPU, and
``cpu:gloo,cuda:nccl`` when CUDA is available (each tensor's collective runs on the backend
of its device; the process's GPU is ``cuda:LOCAL_RANK``).

How the training core (:mod:`mlip_unc.train.core`) uses it, per epoch:

* every rank draws the same permutation of the whole training set from the shared shuffling
  generator (so that generator's state is the same on every rank and in the checkpoint);
  :func:`shard_indices` pads it to a multiple of the world size by repeating its first
  entries (as ``DistributedSampler`` does; nothing is dropped) and gives rank r the entries
  r, r + W, r + 2W, ...: every rank has the same number of batches, and batch i of the W
  ranks together is batch i of one process with a W times larger batch;
* after ``loss.backward()`` :func:`average_gradients` all-reduces the gradients (mean over
  ranks), so every rank takes the same optimiser step; the task's loss stays a per-example
  mean plus ``KL / N_train`` with N_train the GLOBAL training-set size (the task holds the
  whole set; only the core's batches are sharded);
* validation runs on rank 0 over the whole validation set and its metrics are broadcast
  (:func:`broadcast_object`); checkpoints, history, logs at INFO and progress bars are rank 0's.

Explicit all-reduce instead of ``DistributedDataParallel``: the tasks call the model's
``kl()``, ``noise_variances()`` and ``posterior()`` outside ``forward``, forces need a double
backward, and a MAP head or an element absent from a batch leaves gradients undefined; one
flat all-reduce after ``backward`` handles all of these with no wrapper (so no ``module.``
prefix in any state dict) at the cost of not overlapping communication with the backward pass
(``python -m benchmarks.scale.train --ddp``, benchmarks/scale/train.py, measures both).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import RandomSampler, Sampler

__all__ = [
    "ENV_VARS",
    "ShardSampler",
    "active",
    "all_equal",
    "all_reduce_sum",
    "average_gradients",
    "broadcast_float",
    "broadcast_module",
    "broadcast_object",
    "init_from_env",
    "is_main",
    "launched",
    "rank",
    "session",
    "shard_indices",
    "teardown",
    "worker_seed",
    "world_size",
]

log = logging.getLogger(__name__)

#: torchrun's variables; RANK and WORLD_SIZE decide whether this process is one of several.
ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_TIMEOUT = datetime.timedelta(minutes=30)


def launched() -> bool:
    """True when torchrun (or an equivalent launcher) set ``RANK`` and ``WORLD_SIZE``."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _dist() -> Any:
    import torch.distributed as dist  # only under torchrun (kept out of `mlip-unc --help`)

    return dist


def active() -> bool:
    """True when a process group of more than one process is initialised."""
    if not launched():
        return False
    dist = _dist()
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return _dist().get_rank() if active() else 0


def world_size() -> int:
    """Number of processes (1 without a process group)."""
    return _dist().get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0: the process that writes files, logs at INFO and shows progress bars."""
    return rank() == 0


def init_from_env() -> bool:
    """Initialise the default process group from torchrun's variables; False when they are
    absent (one process, nothing done) or the group already exists."""
    if not launched():
        return False
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"RANK and WORLD_SIZE are set but {', '.join(missing)} not: start with torchrun "
            "or set MASTER_ADDR and MASTER_PORT"
        )
    dist = _dist()
    if dist.is_initialized():
        return False
    backend = "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend=backend, init_method="env://", timeout=_TIMEOUT)
    log.debug("rank %d of %d (%s)", dist.get_rank(), dist.get_world_size(), backend)
    return True


def teardown() -> None:
    """Destroy the default process group (if any)."""
    if launched() and _dist().is_initialized():
        _dist().destroy_process_group()


@contextlib.contextmanager
def session(*, quiet_workers: bool = True) -> Iterator[bool]:
    """``with session() as distributed:`` around a training command. Under torchrun: the
    process group for the block, and (``quiet_workers``) the ``mlip_unc`` logger of ranks other
    than 0 at WARNING. Without torchrun: nothing; yields False."""
    started = init_from_env()
    if started and quiet_workers and not is_main():
        logging.getLogger("mlip_unc").setLevel(
            max(logging.WARNING, logging.getLogger("mlip_unc").level)
        )
    try:
        yield active()
    finally:
        if started:
            teardown()


# ------------------------------------------------------------------ sharding and seeds
def shard_indices(order: Sequence[int], rank_: int, world: int) -> list[int]:
    """Rank ``rank_``'s entries of ``order`` (n,): padded to a multiple of ``world`` with its
    first entries, then every ``world``-th from ``rank_`` -> (ceil(n / world),)."""
    if world < 1 or not 0 <= rank_ < world:
        raise ValueError(f"rank {rank_} of world size {world}")
    order = list(order)
    if not order:
        return []
    pad = -len(order) % world
    padded = order + (order * (pad // len(order) + 1))[:pad]
    return padded[rank_::world]


class ShardSampler(Sampler[int]):
    """Rank ``rank_``'s shard (:func:`shard_indices`) of the permutation that
    ``RandomSampler(range(n), generator=generator)`` draws, drawn as lazily as that sampler
    does: with ``world = 1`` a ``DataLoader(sampler=ShardSampler(n, 0, 1, g), generator=g)``
    gives the batches of ``DataLoader(shuffle=True, generator=g)`` and leaves ``g`` in the same
    state, also after a loop broken off mid-epoch."""

    def __init__(self, n: int, rank_: int, world: int, generator: torch.Generator) -> None:
        self.n, self.rank, self.world, self.generator = n, rank_, world, generator

    def __len__(self) -> int:
        return (self.n + self.world - 1) // self.world  # ceil(n / world)

    def __iter__(self) -> Iterator[int]:
        if self.n == 0:
            return
        draws = iter(RandomSampler(range(self.n), generator=self.generator))
        order = list(itertools.islice(draws, self.n))  # (n,)
        yield from shard_indices(order, self.rank, self.world)
        for _ in draws:  # RandomSampler's trailing (empty) draw, when the epoch is finished
            pass


def worker_seed(seed: int, epoch: int, rank_: int) -> int:
    """Seed of rank ``rank_``'s own random draws in ``epoch`` (rank 0 keeps the run's streams)."""
    return (int(seed) * 1_000_003 + int(epoch) * 7919 + int(rank_)) % (2**63 - 1)


# ------------------------------------------------------------------ collectives
def average_gradients(parameters: Iterable[nn.Parameter]) -> None:
    """Mean of every gradient over the ranks, in place (one flat all-reduce per dtype/device).

    A parameter without a gradient on some ranks gets zeros there when any rank has one, and
    stays ``None`` when no rank has one (as in one process with the union of the batches)."""
    if not active():
        return
    dist = _dist()
    params = [p for p in parameters if p.requires_grad]  # (P,)
    if not params:
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float64)  # (P,)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    used = [p for p, h in zip(params, has.tolist(), strict=False) if h > 0]
    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}  # the gradients
    for p in used:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    world = dist.get_world_size()
    for group in groups.values():
        flat = torch.cat([g.reshape(-1) for g in group])  # (sum of numel,)
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for g in group:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """Sum over the ranks of ``values`` (k,) (float64); the values themselves in one process."""
    if not active():
        return [float(v) for v in values]
    dist = _dist()
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)  # (k,)
    dist.all_reduce(t)
    return t.tolist()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (a picklable object; in-memory only, never a file)."""
    if not active():
        return obj
    box = [obj]
    _dist().broadcast_object_list(box, src=src)
    return box[0]


def broadcast_float(value: float, src: int = 0) -> float:
    """Rank ``src``'s ``value`` on every rank (e.g. its clock, so budget decisions agree)."""
    if not active():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)  # (1,)
    _dist().broadcast(t, src=src)
    return float(t[0])


def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Rank ``src``'s parameters and buffers on every rank, in place."""
    if not active():
        return
    dist = _dist()
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            data: Tensor = t.data
            dist.broadcast(data, src=src)


def all_equal(value: Any) -> bool:
    """True on every rank when every rank passed an equal ``value``."""
    if not active():
        return True
    values: list[Any] = [None] * world_size()
    _dist().all_gather_object(values, value)
    return all(v == values[0] for v in values)
