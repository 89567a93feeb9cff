"""Listing a deployment's rows and deleting them: the Redis pieces every topology and row layout shares.

A full listing (:meth:`~kelp.store.base.EmbeddingStore.scan_rows`) walks one
node's keyspace with ``SCAN ... MATCH <table's pattern> COUNT n``, one round trip
per page, and fetches the values of a page's keys in one pipelined round trip
(``MGET`` for the ``keys`` layout, ``HGETALL`` of each bucket hash for ``buckets``),
so the client holds about one batch of rows at a time, never a table. Values are
decoded by the row codec in one pass; what it marks faulty is left out and
counted (:class:`Skipped`), so a snapshot never carries a row the store could
not train through.

In a Redis Cluster a multi-key command must stay in one slot: keys are grouped by
slot (:func:`slot_groups`) before ``MGET`` or ``UNLINK``; on a standalone shard every
key is one group.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np

from kelp.retry import RetryPolicy
from kelp.store.base import Table
from kelp.store.redis.connection import translate_redis_errors
from kelp.store.rows.codec import FAULT_REASONS, DecodedRows
from kelp.store.rows.stored import StoredRows

__all__ = [
    "ID_BYTES",
    "SCAN_COUNT_AT_MOST",
    "KeyGroups",
    "Node",
    "Skipped",
    "batched",
    "ids_of",
    "live_rows",
    "pieces",
    "round_trip",
    "scan_pages",
    "unlink_matching",
]

log = logging.getLogger("kelp.store.row_scan")

ID_BYTES = 8
"""A row id's bytes at the end of a row key (or as a bucket hash's field): uint64 big-endian."""
SCAN_COUNT_AT_MOST = 10_000
"""``SCAN ... COUNT`` at most: one page's work on the server is bounded, whatever the batch."""

T = TypeVar("T")
Node = tuple[str, Any]
"""One part of a scan: the node's password-free name and its redis-py client (primary)."""
KeyGroups = Callable[[list[bytes]], list[list[bytes]]]
"""Keys split into groups a multi-key command may carry together (one cluster slot each)."""


class Skipped:
    """Stored values a listing left out, by reason (:data:`~kelp.store.rows.codec.FAULT_REASONS`, and
    ``bad_key`` for a key or field that holds no row id); logged once when the part is done."""

    def __init__(self, table: str, where: str) -> None:
        self.table = table
        self.where = where
        self.counts: Counter[str] = Counter()

    def add(self, reason: str, n: int) -> None:
        if n:
            self.counts[reason] += n

    def log(self) -> None:
        if self.counts:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.counts.items()))
            log.warning(
                "store table %r on %s: left out %d stored values that are no valid row (%s); "
                "kelp store inspect shows them, a push of the id overwrites them",
                self.table,
                self.where,
                sum(self.counts.values()),
                reasons,
            )


def round_trip(retry: RetryPolicy, where: str, call: Callable[[], T]) -> T:
    """``call`` with redis-py's errors made Kelp's, retried as the store retries a pipeline."""

    def attempt() -> T:
        with translate_redis_errors(where):
            return call()

    return retry.call(attempt)


def scan_pages(node: Node, pattern: str, count: int, retry: RetryPolicy) -> Iterator[list[bytes]]:
    """Keys matching ``pattern`` on one node, one ``SCAN`` page at a time (a page may be empty)."""
    where, client = node
    cursor = 0
    count = max(1, min(count, SCAN_COUNT_AT_MOST))
    while True:
        cursor, keys = round_trip(
            retry, where, lambda at=cursor: client.scan(cursor=at, match=pattern, count=count)
        )
        if keys:
            yield list(keys)
        if int(cursor) == 0:
            return


def batched(pages: Iterable[list[T]], size: int) -> Iterator[list[T]]:
    """Items of ``pages`` regrouped into lists of ``size`` (the last may be shorter)."""
    pending: list[T] = []
    for page in pages:
        pending.extend(page)
        while len(pending) >= size:
            yield pending[:size]
            pending = pending[size:]
    if pending:
        yield pending


def ids_of(raw: list[bytes], width: int, skipped: Skipped) -> tuple[list[bytes], np.ndarray]:
    """The keys (or fields) of ``width`` bytes and the uint64 id their last 8 bytes hold; any other
    width matched the pattern by chance and holds no row of the table (``bad_key``)."""
    kept = [k for k in raw if len(k) == width]
    skipped.add("bad_key", len(raw) - len(kept))
    if not kept:
        return kept, np.zeros(0, np.uint64)
    joined = b"".join(kept)
    if width == ID_BYTES:  # a bucket hash's fields: the id alone
        return kept, np.frombuffer(joined, dtype=">u8").astype(np.uint64)
    rec = np.frombuffer(joined, dtype=np.dtype([("p", f"V{width - ID_BYTES}"), ("id", ">u8")]))
    return kept, rec["id"].astype(np.uint64)


def live_rows(
    t: Table,
    ids: np.ndarray,
    decoded: DecodedRows,
    skipped: Skipped,
    *,
    cutoff: int = 0,
    updated_since_s: int | None = None,
) -> StoredRows:
    """The decoded values that are valid rows, stamped at or after ``cutoff`` (the layout's TTL rule,
    0: none) and ``updated_since_s``, as :class:`StoredRows` in the table's storage dtype."""
    faulty = decoded.present & (decoded.fault != 0)
    if faulty.any():
        for code, n in zip(*np.unique(decoded.fault[faulty], return_counts=True), strict=True):
            skipped.add(FAULT_REASONS[int(code)], int(n))
    keep = decoded.present & ~faulty
    stamps = decoded.updated_s.astype(np.int64)
    if cutoff:
        keep &= stamps >= cutoff
    if updated_since_s is not None:
        keep &= stamps >= updated_since_s
    return StoredRows(
        ids=ids[keep],
        rows=decoded.rows[keep].astype(t.spec.dtype),
        state=decoded.state[keep],
        access_count=decoded.count[keep],
        updated_s=decoded.updated_s[keep],
    )


def unlink_matching(
    node: Node, pattern: str, retry: RetryPolicy, groups: KeyGroups, *, count: int, chunk: int
) -> int:
    """``UNLINK`` every key matching ``pattern`` on one node, a ``SCAN`` page per round trip; returns
    how many were deleted. Deleting while scanning is safe: ``SCAN`` still meets every other key."""
    where, client = node
    deleted = 0
    for keys in scan_pages(node, pattern, count, retry):

        def unlink(keys: list[bytes] = keys) -> int:
            pipe = client.pipeline(transaction=False)
            for group in groups(keys):
                for i in range(0, len(group), chunk):
                    pipe.unlink(*group[i : i + chunk])
            return sum(int(n) for n in pipe.execute())

        deleted += round_trip(retry, where, unlink)
    return deleted


def pieces(block: StoredRows, size: int) -> Iterator[StoredRows]:
    """``block`` in pieces of at most ``size`` rows: one load call's pipelines stay a few MB."""
    for start in range(0, len(block), size):
        yield block.part(slice(start, start + size))
