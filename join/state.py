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

``MULTI`` does not roll back a command that Redis refuses while it runs (a NaN
score, an expiry out of range, a key of the wrong type): the step's other
commands stay applied. So every value is checked before anything is sent
(:class:`StateValueError`), and the shared keys' types just before the
``MULTI``, so that no command is refused; one that still is (a key changing type
in between) stops the process before the step is committed, and the step read
again rewrites its state (:meth:`RedisWaitingStore.apply`). A stored value that
does not read back (corrupt, or written by an incompatible version) is
*quarantined*: logged once, counted
(:meth:`WaitingStore.take_corrupt`), and deleted with its deadline, so the join
goes on without it instead of failing on it at every restart.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
import numpy as np
import redis

from kelp.join.records import MAX_EVENT_TS_S, Action

__all__ = [
    "NEGATIVE",
    "POSITIVE",
    "UNDECIDED",
    "Changes",
    "CorruptStateError",
    "MemoryWaitingStore",
    "RedisWaitingStore",
    "StateValueError",
    "Waiting",
    "WaitingStore",
]

log = logging.getLogger("kelp.join")

_SHARED_KEYS_CHECK_S = 1.0
"""How often :meth:`RedisWaitingStore.apply` checks the shared keys' types (only an operator changes them)."""

_MAX_TTL_MS = 10 * 365 * 86_400_000
"""The longest expiry set (ten years): far inside what Redis accepts, far past any configured window."""


class CorruptStateError(ValueError):
    """A stored value that does not read back as what the joiner wrote."""


class StateValueError(ValueError):
    """A step's change holding a value Redis would refuse (a non-finite time, deadline or TTL)."""


def _is_map(first_byte: int) -> bool:
    """Whether msgpack starting with this byte is a map (fixmap, map 16, map 32)."""
    return 0x80 <= first_byte <= 0x8F or first_byte in (0xDE, 0xDF)


def _time_ok(t: Any) -> bool:
    return (type(t) is float or type(t) is int) and 0.0 <= t <= MAX_EVENT_TS_S


UNDECIDED, POSITIVE, NEGATIVE = 0, 1, 2
"""A candidate's label for one task: no action yet, an action in the window, the window closed without one."""


@dataclass(slots=True)
class Waiting:
    """One impression being joined: its message, and per task and candidate what is decided.

    ``labels[task]`` is u8[n] of UNDECIDED/POSITIVE/NEGATIVE; ``emitted`` u8[n] is 1 for candidates
    whose event went out; ``closed`` the tasks whose window has closed. ``stored_bytes`` is the size
    it has in the store (0 for a new one), for the byte count. ``msg`` is ``raw`` decoded, when
    :meth:`unpack` had to decode it to check it (None: not decoded yet); it is not stored.
    """

    request_id: str
    ts: float
    raw: bytes
    n: int
    labels: dict[str, np.ndarray]
    emitted: np.ndarray
    closed: set[str] = field(default_factory=set)
    stored_bytes: int = 0
    msg: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def new(
        cls,
        request_id: str,
        ts: float,
        raw: bytes,
        n: int,
        tasks: list[str],
        *,
        msg: dict[str, Any] | None = None,
    ) -> Waiting:
        return cls(
            request_id,
            ts,
            raw,
            n,
            {t: np.zeros(n, dtype=np.uint8) for t in tasks},
            np.zeros(n, dtype=np.uint8),
            msg=msg,
        )

    def copy(self) -> Waiting:
        """A copy as the store will read it back once this one is written: what a step decides
        (labels, rows emitted, tasks closed) is its own, so the staged step this came from still
        writes what it decided. The decoded message is shared, not decoded again: nothing changes it."""
        return Waiting(
            self.request_id,
            self.ts,
            self.raw,
            self.n,
            {t: v.copy() for t, v in self.labels.items()},
            self.emitted.copy(),
            set(self.closed),
            len(self.pack()),
            self.msg,
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
        """A stored impression; a task the config gained since it was stored starts undecided.

        :class:`CorruptStateError` when ``blob`` is not one, field by field, so nothing later in
        the step fails on it: the raw impression included, decoded whole (a value that only starts
        like a map would fail the step that closes its window, at every restart).
        """
        doc = _unpack(blob)
        if not isinstance(doc, dict):
            raise CorruptStateError(f"a {type(doc).__name__}, expected a map")
        n, stored, emitted, closed = doc.get("n"), doc.get("labels"), doc.get("emitted"), doc.get("closed")
        if type(n) is not int or n < 1:
            raise CorruptStateError(f"n is {n!r}")
        if not _time_ok(doc.get("ts")):
            raise CorruptStateError(f"ts is {doc.get('ts')!r}")
        if type(doc.get("raw")) is not bytes or not doc["raw"] or not _is_map(doc["raw"][0]):
            raise CorruptStateError("no raw impression (a msgpack map)")
        msg = _unpack(doc["raw"], "raw impression")
        if not isinstance(msg, dict):
            raise CorruptStateError(f"the raw impression is a {type(msg).__name__}, expected a map")
        if not isinstance(stored, dict) or any(type(v) is not bytes or len(v) != n for v in stored.values()):
            raise CorruptStateError("labels are not one byte per candidate")
        if type(emitted) is not bytes or len(emitted) != n:
            raise CorruptStateError("emitted is not one byte per candidate")
        if not isinstance(closed, list) or any(type(t) is not str for t in closed):
            raise CorruptStateError("closed is not a list of tasks")
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
            msg,
        )


def pack_actions(actions: list[Action]) -> bytes:
    fields = [[a.task, a.window_s, a.request_id, a.item, a.ts] for a in actions]
    return msgpack.packb(fields, use_bin_type=True)


def unpack_actions(blob: bytes) -> list[Action]:
    """Stored early actions; :class:`CorruptStateError` when ``blob`` is not a list of them."""
    doc = _unpack(blob)
    if not isinstance(doc, list):
        raise CorruptStateError(f"a {type(doc).__name__}, expected a list of actions")
    actions = []
    for fields in doc:
        if not isinstance(fields, list) or len(fields) != 5:
            raise CorruptStateError("an action is not [task, window_s, request_id, item, ts]")
        task, window_s, rid, item, ts = fields
        if type(task) is not str or type(rid) is not str or not _time_ok(ts):
            raise CorruptStateError(f"an action of {task!r} at {ts!r}")
        if (type(window_s) is not float and type(window_s) is not int) or not 0 < window_s < math.inf:
            raise CorruptStateError(f"an action's window is {window_s!r}")
        if item is not None and (type(item) is not int or not 0 <= item < 2**64):
            raise CorruptStateError(f"an action's item is {item!r}")
        actions.append(Action(task, float(window_s), rid, item, float(ts)))
    return actions


def _unpack(blob: bytes, what: str = "value") -> Any:
    try:
        return msgpack.unpackb(blob, raw=False)
    except (ValueError, TypeError) as exc:  # msgpack's own errors are ValueErrors
        raise CorruptStateError(f"the {what} is not msgpack ({type(exc).__name__})") from None


def _check(changes: Changes) -> None:
    """:class:`StateValueError` for any value of ``changes`` that Redis would refuse, or that would
    make a deadline that never comes: checked before anything is sent, so a step is applied whole."""
    for rid, (w, deadline, ttl_s) in changes.put.items():
        _check_entry("impression", rid, deadline, ttl_s)
        if not _time_ok(w.ts):
            raise StateValueError(f"impression {rid[:200]!r}: ts {w.ts!r}")
    for rid, (actions, deadline, ttl_s) in changes.early_put.items():
        _check_entry("early actions", rid, deadline, ttl_s)
        if not all(_time_ok(a.ts) for a in actions):
            raise StateValueError(f"early actions {rid[:200]!r}: an event time is out of range")
    if changes.watermark is not None and not math.isfinite(changes.watermark):
        raise StateValueError(f"watermark {changes.watermark!r}")


def _check_entry(what: str, rid: str, deadline: float, ttl_s: float) -> None:
    if not math.isfinite(deadline):
        raise StateValueError(f"{what} {rid[:200]!r}: deadline {deadline!r}")
    if not math.isfinite(ttl_s) or ttl_s <= 0:
        raise StateValueError(f"{what} {rid[:200]!r}: ttl {ttl_s!r}")


def _px(ttl_s: float) -> int:
    """An expiry Redis accepts: at least a millisecond, at most :data:`_MAX_TTL_MS`."""
    return min(_MAX_TTL_MS, max(1, int(ttl_s * 1000)))


def _quarantined(key: str, kind: str, exc: CorruptStateError, counts: Counter[str]) -> None:
    """Count a corrupt stored value and say so once, in one line (the caller drops it)."""
    counts[kind] += 1
    shown = key if len(key) <= 240 else key[:240] + "..."
    log.warning("join: corrupt %s state at %s (%s): dropped", kind, shown, exc)


@dataclass
class Changes:
    """A step's state changes, applied together once its outputs are acknowledged.

    ``put[rid] = (waiting, deadline, ttl_s)``: the impression and the event time at which it
    is next looked at (a window closes, or it expires). ``early_put[rid] = (actions, deadline)``.
    """

    put: dict[str, tuple[Waiting, float, float]] = field(default_factory=dict)
    delete: dict[str, Waiting] = field(default_factory=dict)
    forget: set[str] = field(default_factory=set)
    """Deadlines whose impression is gone (its TTL ran out while the watermark stood still): dropped,
    or they would stay the earliest forever and, once a step's worth pile up, hide every other."""
    early_put: dict[str, tuple[list[Action], float, float]] = field(default_factory=dict)
    early_delete: set[str] = field(default_factory=set)
    watermark: float | None = None

    def __bool__(self) -> bool:
        staged = self.put or self.delete or self.forget or self.early_put or self.early_delete
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

    def due_scored(self, watermark: float, limit: int, *, early: bool = False) -> list[tuple[float, str]]:
        """:meth:`due` (``early``: :meth:`early_due`) with each deadline, earliest first: what
        :class:`~kelp.join.pending.PendingState` merges its own unapplied deadlines into."""
        ...

    def watermark(self) -> float | None:
        """The watermark of the last applied step (None before the first)."""
        ...

    def apply(self, changes: Changes) -> None:
        """Apply a step's changes in one transaction (what a refused command leaves:
        :meth:`RedisWaitingStore.apply`)."""
        ...

    def counts(self) -> tuple[int, int, int]:
        """``(waiting impressions, their stored bytes, requests with early actions)``."""
        ...

    def take_corrupt(self) -> Counter[str]:
        """Stored values dropped as corrupt since the last call, by kind (``impression``,
        ``early_actions``, ``watermark``)."""
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
        self._corrupt: Counter[str] = Counter()

    def load(self, request_ids: list[str], tasks: list[str]) -> dict[str, Waiting]:
        found = {}
        for r in request_ids:
            if r in self._blobs:
                try:
                    found[r] = Waiting.unpack(r, self._blobs[r], tasks)
                except CorruptStateError as exc:
                    _quarantined(r, "impression", exc, self._corrupt)
                    self._blobs.pop(r)
                    self._due.pop(r, None)
        return found

    def load_early(self, request_ids: list[str]) -> dict[str, list[Action]]:
        found = {}
        for r in request_ids:
            if r in self._early:
                try:
                    found[r] = unpack_actions(self._early[r])
                except CorruptStateError as exc:
                    _quarantined(r, "early_actions", exc, self._corrupt)
                    self._early.pop(r)
                    self._early_due.pop(r, None)
        return found

    def put_raw(self, request_id: str, blob: bytes, deadline: float, *, early: bool = False) -> None:
        """Store ``blob`` as it is (tests: a value as a corrupt or older store would hold it)."""
        (self._early if early else self._blobs)[request_id] = blob
        (self._early_due if early else self._due)[request_id] = deadline

    def due(self, watermark: float, limit: int) -> list[str]:
        return [r for _, r in _earliest(self._due, watermark, limit)]

    def early_due(self, watermark: float, limit: int) -> list[str]:
        return [r for _, r in _earliest(self._early_due, watermark, limit)]

    def due_scored(self, watermark: float, limit: int, *, early: bool = False) -> list[tuple[float, str]]:
        return _earliest(self._early_due if early else self._due, watermark, limit)

    def watermark(self) -> float | None:
        return self._watermark

    def apply(self, changes: Changes) -> None:
        _check(changes)
        for rid, (waiting, deadline, _ttl) in changes.put.items():
            self._blobs[rid] = waiting.pack()
            self._due[rid] = deadline
        for rid in changes.delete:
            self._blobs.pop(rid, None)
            self._due.pop(rid, None)
        for rid in changes.forget:
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

    def take_corrupt(self) -> Counter[str]:
        taken, self._corrupt = self._corrupt, Counter()
        return taken

    def close(self) -> None:
        pass


def _earliest(deadlines: dict[str, float], watermark: float, limit: int) -> list[tuple[float, str]]:
    return sorted((d, r) for r, d in deadlines.items() if d <= watermark)[:limit]


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
        self._corrupt: Counter[str] = Counter()
        self._keys_checked_at = -math.inf

    def load(self, request_ids: list[str], tasks: list[str]) -> dict[str, Waiting]:
        if not request_ids:
            return {}
        blobs = self._r.mget([self._imp + r for r in request_ids])
        found = {}
        for r, b in zip(request_ids, blobs, strict=True):
            if b is None:
                continue
            try:
                found[r] = Waiting.unpack(r, b, tasks)
            except CorruptStateError as exc:
                _quarantined(self._imp + r, "impression", exc, self._corrupt)
                self._drop(self._imp + r, self._due, r, len(b))
        return found

    def load_early(self, request_ids: list[str]) -> dict[str, list[Action]]:
        if not request_ids:
            return {}
        blobs = self._r.mget([self._act + r for r in request_ids])
        found = {}
        for r, b in zip(request_ids, blobs, strict=True):
            if b is None:
                continue
            try:
                found[r] = unpack_actions(b)
            except CorruptStateError as exc:
                _quarantined(self._act + r, "early_actions", exc, self._corrupt)
                self._drop(self._act + r, self._early, r, 0)
        return found

    def put_raw(self, request_id: str, blob: bytes, deadline: float, *, early: bool = False) -> None:
        """Store ``blob`` as it is (tests: a value as a corrupt or older store would hold it)."""
        pipe = self._r.pipeline(transaction=True)
        pipe.set((self._act if early else self._imp) + request_id, blob)
        pipe.zadd(self._early if early else self._due, {request_id: deadline})
        pipe.execute()

    def _drop(self, key: str, deadlines: str, request_id: str, counted_bytes: int) -> None:
        """Delete a quarantined value and its deadline together: it can never be read, and a deadline
        left behind would list it again at every step."""
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(key)
        pipe.zrem(deadlines, request_id)
        if counted_bytes:
            pipe.hincrby(self._stats, "bytes", -counted_bytes)
        pipe.execute(raise_on_error=False)  # a refused byte count only skews a gauge

    def due(self, watermark: float, limit: int) -> list[str]:
        return self._range(self._due, watermark, limit)

    def early_due(self, watermark: float, limit: int) -> list[str]:
        return self._range(self._early, watermark, limit)

    def due_scored(self, watermark: float, limit: int, *, early: bool = False) -> list[tuple[float, str]]:
        key = self._early if early else self._due
        found = self._r.zrangebyscore(key, "-inf", watermark, start=0, num=limit, withscores=True)
        return [(float(d), m.decode() if isinstance(m, bytes) else m) for m, d in found]

    def _range(self, key: str, watermark: float, limit: int) -> list[str]:
        found = self._r.zrangebyscore(key, "-inf", watermark, start=0, num=limit)
        return [m.decode() if isinstance(m, bytes) else m for m in found]

    def watermark(self) -> float | None:
        """The stored watermark; a value that is not an event time, or a key of another type (GET
        answers WRONGTYPE), is quarantined: read at start, it would otherwise stop every start."""
        try:
            value = self._r.get(self._wm)
        except redis.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            self._drop_watermark(CorruptStateError("a key of another type, not a string"))
            return None
        if value is None:
            return None
        try:
            wm = float(value)
        except ValueError:
            wm = math.nan
        if not _time_ok(wm):
            self._drop_watermark(CorruptStateError(f"{value[:40]!r} is not an event time"))
            return None
        return wm

    def _drop_watermark(self, exc: CorruptStateError) -> None:
        _quarantined(self._wm, "watermark", exc, self._corrupt)
        self._r.delete(self._wm)  # the inputs' own times set it again

    def take_corrupt(self) -> Counter[str]:
        taken, self._corrupt = self._corrupt, Counter()
        return taken

    def apply(self, changes: Changes) -> None:
        """Apply ``changes`` in one ``MULTI``.

        ``MULTI`` has no rollback: a command Redis refuses leaves the others applied. So every value
        is checked first (:class:`StateValueError`, nothing sent) and, at most every
        ``_SHARED_KEYS_CHECK_S``, the types of the keys whose commands could be refused (the
        deadline sets, the byte count), so that none is: a round trip of its own, too dear for every
        step. If one still is (a key changed type since the check), the rest of the step
        stays applied and this raises :class:`redis.ResponseError` naming the refusal: the process
        stops before committing the step's offsets, its records are read again, and the replayed
        step stages their impressions again, rewriting their state and deadlines.
        """
        if not changes:
            return
        _check(changes)
        reset_stats = False
        if time.monotonic() - self._keys_checked_at >= _SHARED_KEYS_CHECK_S:
            reset_stats = self._check_shared_keys()
            self._keys_checked_at = time.monotonic()
        pipe = self._r.pipeline(transaction=True)
        if reset_stats:
            pipe.delete(self._stats)
        byte_delta = 0
        due: dict[str, float] = {}
        for rid, (waiting, deadline, ttl_s) in changes.put.items():
            blob = waiting.pack()
            pipe.set(self._imp + rid, blob, px=_px(ttl_s))
            due[rid] = deadline
            byte_delta += len(blob) - waiting.stored_bytes
        if due:
            pipe.zadd(self._due, due)
        if changes.delete:
            pipe.delete(*(self._imp + r for r in changes.delete))
            pipe.zrem(self._due, *changes.delete)
            byte_delta -= sum(w.stored_bytes for w in changes.delete.values())
        if changes.forget:
            pipe.zrem(self._due, *changes.forget)
        early_due: dict[str, float] = {}
        for rid, (actions, deadline, ttl_s) in changes.early_put.items():
            pipe.set(self._act + rid, pack_actions(actions), px=_px(ttl_s))
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
        refused = [r for r in pipe.execute(raise_on_error=False) if isinstance(r, Exception)]
        if refused:
            raise redis.ResponseError(
                f"join state: {len(refused)} command(s) of the step's MULTI refused ({refused[0]}); "
                "the step is not committed and is read again"
            )

    def _check_shared_keys(self) -> bool:
        """Refuse (before the ``MULTI``) deadline sets that are not sorted sets; True when the byte
        count is not a number and is to be reset (it only feeds a gauge)."""
        pipe = self._r.pipeline(transaction=False)
        pipe.zcard(self._due)
        pipe.zcard(self._early)
        pipe.hget(self._stats, "bytes")
        due, early, stored = pipe.execute(raise_on_error=False)
        for key, reply in ((self._due, due), (self._early, early)):
            if isinstance(reply, Exception):
                raise redis.ResponseError(
                    f"join state: {key} is not a sorted set of deadlines ({reply}); see docs/join.md (State)"
                )
        if stored is None:
            return False
        if not isinstance(stored, Exception):
            try:
                int(stored)
                return False
            except ValueError:
                pass
        log.warning("join: the byte count at %s is not a number: reset", self._stats)
        return True

    def counts(self) -> tuple[int, int, int]:
        pipe = self._r.pipeline(transaction=False)
        pipe.zcard(self._due)
        pipe.hget(self._stats, "bytes")
        pipe.zcard(self._early)
        waiting, stored, early = pipe.execute()
        return int(waiting), int(stored or 0), int(early)

    def close(self) -> None:
        self._r.close()
