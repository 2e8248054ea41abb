"""No synchronization actor for a worker group of one rank.

Ray Train starts a ``SynchronizationActor`` for every worker group: the ranks' barrier and
broadcast (``ray.train.report`` agrees on the checkpoint's directory name through it). It is a
process of its own, about 2 CPU-seconds of a 2-core machine to start (Ray Train's package
imports pandas, pyarrow and Ray Data), paid by every attempt although a group of one rank has
nobody to wait for: most attempts of a CPU worker, and every attempt of the test suite but the
multi-rank ones.

For a group of one rank the controller gets ``OneRankSynchronization`` instead: the same three
calls (``broadcast_from_rank_zero``, ``reset``, ``set_required_ranks``) answered at once, each
as an object reference, as an actor's would be. A group of more ranks keeps Ray's actor.

Ray's worker group names the actor class at one point only (a module global of
``worker_group``), and kills the actor at shutdown (``state._shutdown_sync_actor``): the
callback sets both in the controller's process as each group starts, before the group makes
its actor. ``tests/trainer/test_one_rank_sync.py`` fails if a Ray upgrade moves them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.train.v2._internal.execution.callback import WorkerGroupCallback
from ray.train.v2._internal.execution.checkpoint.sync_actor import SynchronizationActor
from ray.train.v2._internal.execution.worker_group import state as group_state
from ray.train.v2._internal.execution.worker_group import worker_group

_kill_sync_actor = group_state._shutdown_sync_actor


class _Call:
    """One method of the stand-in: ``.remote(...)`` answers at once, as a reference."""

    def __init__(self, answer: Callable[..., Any]) -> None:
        self.answer = answer

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        return ray.put(self.answer(*args, **kwargs))


def _broadcast(*, world_rank: int, world_size: int, data: Any, **_: Any) -> Any:
    if world_rank != 0 or world_size != 1:
        raise RuntimeError(f"one-rank synchronization used by rank {world_rank} of {world_size}")
    return data


class OneRankSynchronization:
    """What a ``SynchronizationActor``'s handle answers, for a group of one rank."""

    broadcast_from_rank_zero = _Call(_broadcast)
    reset = _Call(lambda: None)
    set_required_ranks = _Call(lambda ranks: True)


class _OneRankFactory:
    """Stands where the worker group calls ``SynchronizationActor.options(...).remote(...)``."""

    def options(self, **_: Any) -> _OneRankFactory:
        return self

    def remote(self, **_: Any) -> OneRankSynchronization:
        return OneRankSynchronization()


def _shutdown_sync_actor(sync_actor: Any) -> None:
    if isinstance(sync_actor, ActorHandle):
        _kill_sync_actor(sync_actor)


class OneRankGroups(WorkerGroupCallback):
    """Gives a starting group of one rank the stand-in; a larger group Ray's actor."""

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        one_rank = worker_group_context.num_workers == 1
        worker_group.SynchronizationActor = _OneRankFactory() if one_rank else SynchronizationActor
        group_state._shutdown_sync_actor = _shutdown_sync_actor
