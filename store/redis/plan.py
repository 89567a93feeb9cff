"""Plans of pipelined Redis commands, and the runner that executes them: one round trip per shard.

A Redis backend turns each call into a :class:`Plan`: commands per shard index,
each with an optional callback for its reply. :class:`PlanRunner` executes it::

    plan.cmds = {0: [MGET k1 k2 ..., MGET ...],  1: [MGET ...]}
                   │ one pipeline, one round trip     │ in parallel threads
                   ▼                                  ▼
    replies handed to each command's callback, only after *every* shard answered

Each shard's pipeline runs inside :func:`~kelp.store.redis.connection.translate_redis_errors`
and is retried as a whole by the store's :class:`~kelp.retry.RetryPolicy`, so a
failed call never leaves half-decoded results behind. The ids of a table are
first split into :class:`Group` s (one shard and, in a cluster, one hash-tag
bucket each) and then into chunks of ``max_rows_per_command`` rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from kelp.retry import RetryPolicy
from kelp.store.metrics import StoreMetrics
from kelp.store.redis._wire.row_replies import RowReplies
from kelp.store.redis.connection import translate_redis_errors
from kelp.store.redis.durability import WAITED_OPS, ReplicaWait

__all__ = [
    "Command",
    "Gathered",
    "Group",
    "PackedCommands",
    "Plan",
    "PlanRunner",
    "adder",
    "chunks",
    "count_none",
    "scatter",
    "setter",
    "split_replies",
]


@dataclass
class Command:
    """One pipelined command and where its reply goes."""

    args: tuple[Any, ...]
    on_reply: Callable[[Any], None] | None = None


@dataclass
class PackedCommands:
    """Commands on the wire form (:func:`~kelp.store.redis._wire.packing.pack_commands`, or the lazily
    packed parts of :func:`~kelp.store.redis._wire.packing.pack_grouped`): ``count`` of them, their
    replies handed to ``on_reply`` as one list."""

    payload: bytes | Iterable[bytes]
    count: int
    on_reply: Callable[[Any], None] | None = None
    width: int | None = None
    """Every reply is a value of this many bytes or nil: read by
    :func:`~kelp.store.redis._wire.row_replies.read_rows`, the reply is then a
    :class:`~kelp.store.redis._wire.row_replies.RowReplies` (or, when one is not, the list)."""
    integers: bool = False
    """Every reply is an integer (``HSET``): read by :func:`~kelp.store.redis._wire.int_replies.read_ints`,
    the reply is then an int64 array (or, when one is not, the list)."""


@dataclass
class Plan:
    """Commands per shard index, executed as one pipeline per shard."""

    cmds: dict[int, list[Command | PackedCommands]] = field(default_factory=dict)

    def add(self, shard: int, args: tuple[Any, ...], on_reply: Callable[[Any], None] | None = None) -> None:
        self.cmds.setdefault(shard, []).append(Command(args, on_reply))

    def add_packed(
        self,
        shard: int,
        payload: bytes | Iterable[bytes],
        count: int,
        on_reply: Callable[[Any], None] | None = None,
        width: int | None = None,
        *,
        integers: bool = False,
    ) -> None:
        """Needs a pipeline with ``add_packed``.

        :class:`~kelp.store.redis._wire.packed_pipeline.PackedPipeline` has one."""
        if count:
            self.cmds.setdefault(shard, []).append(PackedCommands(payload, count, on_reply, width, integers))


class Gathered:
    """One table's read replies, kept in the order its commands were *planned*.

    :meth:`PlanRunner.run` hands replies over shard by shard, in the order the
    shards first appear in the plan. That order is set by whichever table
    planned first: when a pull's first table has no id on shard 0 (a serving
    request's one-id user feature), shard 2 may come first, and a table whose
    groups were planned 0, 1, 2 would get its replies 2, 0, 1. So every command
    writes its reply into its own place here, and :meth:`values` joins them in
    the planned order (``order``: each command's positions into the table's ids).
    """

    def __init__(self) -> None:
        self.order: list[np.ndarray] = []
        self._parts: list[list[Any] | RowReplies] = []

    def add(self, pos: np.ndarray) -> Callable[[list[Any] | RowReplies], None]:
        """The reply callback of the next command, which reads the ids at ``pos``."""
        index = len(self._parts)
        self.order.append(pos)
        self._parts.append([])

        def put(reply: list[Any] | RowReplies) -> None:
            self._parts[index] = reply

        return put

    def values(self) -> list[Any] | RowReplies:
        """The replies in planned order: one :class:`RowReplies` when every command's came parsed as
        rows (:func:`~kelp.store.redis._wire.row_replies.read_rows`), else one list."""
        if self._parts and all(isinstance(p, RowReplies) for p in self._parts):
            parts: list[RowReplies] = self._parts  # type: ignore[assignment]
            return RowReplies(
                np.concatenate([p.present for p in parts]), np.concatenate([p.values for p in parts])
            )
        return list(chain.from_iterable(p.tolist() if isinstance(p, RowReplies) else p for p in self._parts))

    def __len__(self) -> int:
        return sum(len(p) for p in self.order)


class Group:
    """Ids of one table for one shard (and, in a cluster, one bucket): int64 positions into the batch."""

    __slots__ = ("bucket", "pos", "shard")

    def __init__(self, shard: int, bucket: int, pos: np.ndarray) -> None:
        self.shard, self.bucket, self.pos = shard, bucket, pos


def chunks(pos: np.ndarray, size: int) -> list[np.ndarray]:
    """``pos`` cut into runs of at most ``size`` (one MGET/MSET each)."""
    return [pos[i : i + size] for i in range(0, len(pos), size)] if len(pos) else []


class PlanRunner:
    """Executes plans; shard ``i`` is ``shard_names[i]``, its pipelines come from ``pipeline(i, ro)``.

    ``parallel``: shards run in a thread pool (else one after another, in the calling thread).
    ``wait``: end every shard's pipeline of a write op (:data:`~kelp.store.redis.durability.WAITED_OPS`)
    with ``WAIT``, on the same connection as its writes so the replicas' count covers them all, and
    fail that shard (retriable) when too few replicas confirmed."""

    def __init__(
        self,
        shard_names: Sequence[str],
        pipeline: Callable[[int, bool], Any],
        retry: RetryPolicy,
        metrics: StoreMetrics,
        *,
        parallel: bool = True,
        wait: ReplicaWait | None = None,
    ) -> None:
        self.shard_names = list(shard_names)
        self.wait = wait
        self._pipeline = pipeline
        self.retry = retry
        self.metrics = metrics
        self._pool: ThreadPoolExecutor | None = None
        if parallel and len(self.shard_names) > 1:
            self._pool = ThreadPoolExecutor(
                max_workers=len(self.shard_names), thread_name_prefix="kelp-store"
            )

    def _run_shard(
        self, shard: int, cmds: list[Command | PackedCommands], op: str, readonly: bool
    ) -> list[Any]:
        name = self.shard_names[shard]
        wait = self.wait if op in WAITED_OPS else None

        def attempt() -> list[Any]:
            with translate_redis_errors(name):
                pipe = self._pipeline(shard, readonly)
                for c in cmds:
                    if isinstance(c, PackedCommands):
                        pipe.add_packed(c.payload, c.count, c.width, integers=c.integers)
                    else:
                        pipe.execute_command(*c.args)
                if wait is not None:
                    pipe.execute_command(*wait.command())
                replies = pipe.execute(raise_on_error=True)
            if wait is not None:
                wait.check(name, replies.pop())
            return replies

        def on_retry(_n: int, _exc: BaseException) -> None:
            self.metrics.retries.labels(op=op).inc()

        replies = self.retry.call(attempt, on_retry)
        self.metrics.trips.inc(1, name, op)
        return replies

    def run(self, plan: Plan, op: str, readonly: bool = False) -> None:
        """Run every shard's pipeline (in parallel), then hand replies to their callbacks."""
        items = list(plan.cmds.items())
        if not items:
            return
        try:
            if len(items) == 1 or self._pool is None:
                results = [self._run_shard(s, cmds, op, readonly) for s, cmds in items]
            else:
                futures = [self._pool.submit(self._run_shard, s, cmds, op, readonly) for s, cmds in items]
                results = [f.result() for f in futures]
        except Exception as exc:
            self.metrics.errors.labels(op=op, kind=type(exc).__name__).inc()
            raise
        for (_s, cmds), replies in zip(items, results, strict=True):
            for c, r in zip(cmds, replies, strict=True):
                if c.on_reply is not None:
                    c.on_reply(r)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


# -- reply callbacks ------------------------------------------------------------------------------


def split_replies(
    parts: Sequence[tuple[int, Callable[[Any], None]]],
) -> Callable[[list[Any] | RowReplies], None]:
    """One run's replies cut into consecutive pieces of ``count`` replies, each to its callback."""

    def put(reply: list[Any] | RowReplies) -> None:
        start = 0
        for count, on_reply in parts:
            end = start + count
            on_reply(reply.slice(start, end) if isinstance(reply, RowReplies) else reply[start:end])
            start += count

    return put


def scatter(values: list[bytes | None], pos: np.ndarray) -> Callable[[list[bytes | None]], None]:
    """An MGET reply's values go to ``values[pos]``."""

    def put(reply: list[bytes | None]) -> None:
        for p, v in zip(pos.tolist(), reply, strict=True):
            values[p] = v

    return put


def setter(arr: np.ndarray, p: int) -> Callable[[Any], None]:
    """An integer reply goes to ``arr[p]``."""

    def put(reply: Any) -> None:
        arr[p] = int(reply)

    return put


def adder(acc: list[int]) -> Callable[[Any], None]:
    """An integer reply is added to ``acc[0]``."""

    def put(reply: Any) -> None:
        acc[0] += int(reply)

    return put


def count_none(acc: list[int]) -> Callable[[Any], None]:
    """A nil reply (``SET ... XX`` found no key) adds one to ``acc[0]``."""

    def put(reply: Any) -> None:
        if reply is None:
            acc[0] += 1

    return put
