"""What the joiner keeps between steps: waiting impressions, early actions, deadlines, the watermark.

The joiner is stateless in memory: every step reads the state its records
touch, decides, and hands back one :class:`Changes`, which is applied only
after the step's outputs are acknowledged by Kafka (and before the input
offsets are committed). So a crash anywhere loses nothing: the inputs after
the last commit are read again and meet the state as it was before them, or
as it was after them, and either way emit the same sample ids.

Two backends share one contract (tests/join/test_state_contract.py):
:class:`RedisWaitingStore` for the process and :class:`MemoryWaitingStore` for
unit tests. In Redis every key carries one hash tag (``{kelp:<deployment>:join}``),
so a step's changes go in one ``MULTI``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import msgpack
import numpy as np
import redis

from kelp.join.records import Action

__all__ = [
    "NEGATIVE",
    "POSITIVE",
    "UNDECIDED",
    "Changes",
    "MemoryWaitingStore",
    "RedisWaitingStore",
    "Waiting",
    "WaitingStore",
]

UNDECIDED, POSITIVE, NEGATIVE = 0, 1, 2
"""A candidate's label for one task: no action yet, an action in the window, the window closed without one."""


@dataclass(slots=True)
class Waiting:
    """One impression being joined: its message, and per task and candidate what is decided.

    ``labels[task]`` is u8[n] of UNDECIDED/POSITIVE/NEGATIVE; ``emitted`` u8[n] is 1 for candidates
    whose event went out; ``closed`` the tasks whose window has closed. ``stored_bytes`` is the size
    it has in the store (0 for a new one), for the byte count.
    """

    request_id: str
    ts: float
    raw: bytes
    n: int
    labels: dict[str, np.ndarray]
    emitted: np.ndarray
    closed: set[str] = field(default_factory=set)
    stored_bytes: int = 0

    @classmethod
    def new(cls, request_id: str, ts: float, raw: bytes, n: int, tasks: list[str]) -> Waiting:
        return cls(
            request_id,
            ts,
            raw,
            n,
            {t: np.zeros(n, dtype=np.uint8) for t in tasks},
            np.zeros(n, dtype=np.uint8),
        )

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "ts": self.ts,
                "raw": self.raw,
                "n": self.n,
                "labels": {t: v.tobytes() for t, v in self.labels.items()},
                "emitted": self.emitted.tobytes(),
                "closed": sorted(self.closed),
            },
            use_bin_type=True,
        )

    @classmethod
    def unpack(cls, request_id: str, blob: bytes, tasks: list[str]) -> Waiting:
        """A stored impression; a task the config gained since it was stored starts undecided."""
        doc = msgpack.unpackb(blob, raw=False)
        n = doc["n"]
        stored = doc["labels"]
        labels = {
            t: np.frombuffer(stored[t], dtype=np.uint8).copy() if t in stored else np.zeros(n, dtype=np.uint8)
            for t in tasks
        }
        return cls(
            request_id,
            doc["ts"],
            doc["raw"],
            n,
            labels,
            np.frombuffer(doc["emitted"], dtype=np.uint8).copy(),
            set(doc["closed"]) & set(tasks),
            len(blob),
        )


def pack_actions(actions: list[Action]) -> bytes:
    fields = [[a.task, a.window_s, a.request_id, a.item, a.ts] for a in actions]
    return msgpack.packb(fields, use_bin_type=True)


def unpack_actions(blob: bytes) -> list[Action]:
    return [Action(*fields) for fields in msgpack.unpackb(blob, raw=False)]


@dataclass
class Changes:
    """A step's state changes, applied together once its outputs are acknowledged.

    ``put[rid] = (waiting, deadline, ttl_s)``: the impression and the event time at which it
    is next looked at (a window closes, or it expires). ``early_put[rid] = (actions, deadline)``.
    """

    put: dict[str, tuple[Waiting, float, float]] = field(default_factory=dict)
    delete: dict[str, Waiting] = field(default_factory=dict)
    early_put: dict[str, tuple[list[Action], float, float]] = field(default_factory=dict)
    early_delete: set[str] = field(default_factory=set)
    watermark: float | None = None

    def __bool__(self) -> bool:
        staged = self.put or self.delete or self.early_put or self.early_delete
        return bool(staged) or self.watermark is not None


class WaitingStore(Protocol):
    """Where the joiner's state lives between steps (one contract, two backends)."""

    def load(self, request_ids: list[str], tasks: list[str]) -> dict[str, Waiting]:
        """The waiting impressions among ``request_ids`` (absent ids are left out)."""
        ...

    def load_early(self, request_ids: list[str]) -> dict[str, list[Action]]:
        """The actions waiting for these requests' impressions (absent ids are left out)."""
        ...

    def due(self, watermark: float, limit: int) -> list[str]:
        """Up to ``limit`` impressions whose deadline is at or before ``watermark``, earliest first."""
        ...

    def early_due(self, watermark: float, limit: int) -> list[str]:
        """Up to ``limit`` requests whose early actions waited past ``watermark``."""
        ...

    def watermark(self) -> float | None:
        """The watermark of the last applied step (None before the first)."""
        ...

    def apply(self, changes: Changes) -> None:
        """Apply a step's changes all together."""
        ...

    def counts(self) -> tuple[int, int, int]:
        """``(waiting impressions, their stored bytes, requests with early actions)``."""
        ...

    def close(self) -> None: ...


class MemoryWaitingStore:
    """The contract in dicts: for unit tests of the join's semantics (no TTLs: nothing expires)."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._due: dict[str, float] = {}
        self._early: dict[str, bytes] = {}
        self._early_due: dict[str, float] = {}
        self._watermark: float | None = None

    def load(self, request_ids: list[str], tasks: list[str]) -> dict[str, Waiting]:
        return {r: Waiting.unpack(r, self._blobs[r], tasks) for r in request_ids if r in self._blobs}

    def load_early(self, request_ids: list[str]) -> dict[str, list[Action]]:
        return {r: unpack_actions(self._early[r]) for r in request_ids if r in self._early}

    def due(self, watermark: float, limit: int) -> list[str]:
        return _earliest(self._due, watermark, limit)

    def early_due(self, watermark: float, limit: int) -> list[str]:
        return _earliest(self._early_due, watermark, limit)

    def watermark(self) -> float | None:
        return self._watermark

    def apply(self, changes: Changes) -> None:
        for rid, (waiting, deadline, _ttl) in changes.put.items():
            self._blobs[rid] = waiting.pack()
            self._due[rid] = deadline
        for rid in changes.delete:
            self._blobs.pop(rid, None)
            self._due.pop(rid, None)
        for rid, (actions, deadline, _ttl) in changes.early_put.items():
            self._early[rid] = pack_actions(actions)
            self._early_due[rid] = deadline
        for rid in changes.early_delete:
            self._early.pop(rid, None)
            self._early_due.pop(rid, None)
        if changes.watermark is not None:
            self._watermark = changes.watermark

    def counts(self) -> tuple[int, int, int]:
        return len(self._blobs), sum(map(len, self._blobs.values())), len(self._early)

    def close(self) -> None:
        pass


def _earliest(deadlines: dict[str, float], watermark: float, limit: int) -> list[str]:
    ready = sorted((d, r) for r, d in deadlines.items() if d <= watermark)
    return [r for _, r in ready[:limit]]


class RedisWaitingStore:
    """The contract in one Redis (standalone), every key under ``{kelp:<deployment>:join}``.

    ``...:i:<rid>`` the packed impression (with a TTL as a backstop), ``...:a:<rid>``
    its early actions, sorted sets ``...:due`` and ``...:early`` of deadlines,
    ``...:wm`` the watermark and the hash ``...:stats`` the impressions' stored bytes.
    """

    def __init__(self, client: redis.Redis, deployment: str) -> None:
        self._r = client
        tag = "{kelp:" + deployment + ":join}"
        self._imp = tag + ":i:"
        self._act = tag + ":a:"
        self._due = tag + ":due"
        self._early = tag + ":early"
        self._wm = tag + ":wm"
        self._stats = tag + ":stats"

    def load(self, request_ids: list[str], tasks: list[str]) -> dict[str, Waiting]:
        if not request_ids:
            return {}
        blobs = self._r.mget([self._imp + r for r in request_ids])
        found = zip(request_ids, blobs, strict=True)
        return {r: Waiting.unpack(r, b, tasks) for r, b in found if b is not None}

    def load_early(self, request_ids: list[str]) -> dict[str, list[Action]]:
        if not request_ids:
            return {}
        blobs = self._r.mget([self._act + r for r in request_ids])
        return {r: unpack_actions(b) for r, b in zip(request_ids, blobs, strict=True) if b is not None}

    def due(self, watermark: float, limit: int) -> list[str]:
        return self._range(self._due, watermark, limit)

    def early_due(self, watermark: float, limit: int) -> list[str]:
        return self._range(self._early, watermark, limit)

    def _range(self, key: str, watermark: float, limit: int) -> list[str]:
        found = self._r.zrangebyscore(key, "-inf", watermark, start=0, num=limit)
        return [m.decode() if isinstance(m, bytes) else m for m in found]

    def watermark(self) -> float | None:
        value = self._r.get(self._wm)
        return None if value is None else float(value)

    def apply(self, changes: Changes) -> None:
        if not changes:
            return
        pipe = self._r.pipeline(transaction=True)
        byte_delta = 0
        due: dict[str, float] = {}
        for rid, (waiting, deadline, ttl_s) in changes.put.items():
            blob = waiting.pack()
            pipe.set(self._imp + rid, blob, px=max(1, int(ttl_s * 1000)))
            due[rid] = deadline
            byte_delta += len(blob) - waiting.stored_bytes
        if due:
            pipe.zadd(self._due, due)
        if changes.delete:
            pipe.delete(*(self._imp + r for r in changes.delete))
            pipe.zrem(self._due, *changes.delete)
            byte_delta -= sum(w.stored_bytes for w in changes.delete.values())
        early_due: dict[str, float] = {}
        for rid, (actions, deadline, ttl_s) in changes.early_put.items():
            pipe.set(self._act + rid, pack_actions(actions), px=max(1, int(ttl_s * 1000)))
            early_due[rid] = deadline
        if early_due:
            pipe.zadd(self._early, early_due)
        if changes.early_delete:
            pipe.delete(*(self._act + r for r in changes.early_delete))
            pipe.zrem(self._early, *changes.early_delete)
        if changes.watermark is not None:
            pipe.set(self._wm, repr(changes.watermark))
        if byte_delta:
            pipe.hincrby(self._stats, "bytes", byte_delta)
        pipe.execute()

    def counts(self) -> tuple[int, int, int]:
        pipe = self._r.pipeline(transaction=False)
        pipe.zcard(self._due)
        pipe.hget(self._stats, "bytes")
        pipe.zcard(self._early)
        waiting, stored, early = pipe.execute()
        return int(waiting), int(stored or 0), int(early)

    def close(self) -> None:
        self._r.close()
