"""A partition whose first records are (nearly) all rejected stops the source before anything commits.

A topic of the wrong format (JSON or CSV lines where schema-v1 msgpack is
expected) is otherwise burned silently: every record is rejected, sent to the
dead-letter topic and committed, the model trains nothing, and the only sign
is the run's summary. :class:`InitialCheck` holds back the first records of
each partition this process reads, at least ``sample`` of them (or fewer when
the partition is caught up sooner), and decides:

* at least ``max_fraction`` of them rejected: raise
  :class:`~kelp.consumers.errors.SourceUserError` with one line naming the
  topic and partition, the reasons, and either what the records look like
  (:func:`looks_like`) against what the source expects, when they cannot be
  read at all, or that their fields do not fit, when they can. The counts are
  of the first ``sample`` records exactly, though a poll may bring many more
  at once. Nothing of that partition was dead-lettered or
  registered for a commit, so nothing is committed and a fixed config
  re-reads them all.
* otherwise: hand the held chunks on, in order, and every later one at once.

A partition caught up before ``sample`` records (a small or slow topic)
hands on what it holds, so good samples are never stuck, and keeps counting
until ``sample`` records: the check still fires, but what was handed on
before may be committed by then.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import msgpack
import numpy as np
import orjson

from kelp.consumers.decode import Chunk, Rejection
from kelp.consumers.errors import SourceUserError

__all__ = ["InitialCheck", "looks_like"]

_SNIFF_RECORDS = 20  # rejected values kept per partition to say what the records look like
_SNIFF_BYTES = 4096

# Reasons that say a record could not be read in the expected format at all, as opposed to a
# record read whose fields do not fit the config (missing_label, bad_type, unknown_feature...).
_UNREADABLE = frozenset({"bad_msgpack", "bad_version", "bad_json", "bad_payload", "unknown_schema"})


def _text(head: bytes, whole: int) -> str | None:
    """``head`` as printable UTF-8 text, or None (a character cut at the end of the head is allowed)."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if whole <= len(head) or exc.start < len(head) - 3:
            return None
        text = head[: exc.start].decode("utf-8", "strict")
    if all(c.isprintable() or c in "\t\r\n" for c in text):
        return text
    return None


def looks_like(value: bytes) -> str:
    """What a record seems to be, for an operator: ``looks like JSON``, ``looks like CSV/TSV text``,
    ``looks like msgpack``, ``looks like UTF-8 text``, ``is binary`` or ``is empty``.

    >>> looks_like(b'{"label": 1, "user": "u7"}')
    'looks like JSON'
    >>> looks_like(b"1\\t3\\t0\\t5a9ed9b0")
    'looks like CSV/TSV text'
    >>> looks_like(b"\\x82\\xa1v\\x02\\xa5label\\x01")
    'looks like msgpack'
    >>> looks_like(b"hello world")
    'looks like UTF-8 text'
    >>> looks_like(bytes([0xFF, 0xC1, 0x00]))
    'is binary'
    """
    if not value:
        return "is empty"
    text = _text(value[:_SNIFF_BYTES], len(value))
    if text is not None:
        stripped = text.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                orjson.loads(value)
                return "looks like JSON"
            except orjson.JSONDecodeError:
                if len(value) > _SNIFF_BYTES or "\n" in stripped.rstrip():
                    return "looks like JSON"  # too long to parse here, or JSON lines in one record
        first_line = stripped.split("\n", 1)[0]
        if "\t" in first_line or max(first_line.count(sep) for sep in (",", ";", "|")) >= 2:
            return "looks like CSV/TSV text"
        return "looks like UTF-8 text"
    try:
        msgpack.unpackb(value, raw=True, strict_map_key=False)
        return "looks like msgpack"
    except Exception:  # msgpack raises several unrelated types for garbage
        return "is binary"


@dataclass
class _Partition:
    records: int = 0
    rejected: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    first: Rejection | None = None
    values: list[bytes] = field(default_factory=list)
    held: list[Chunk] = field(default_factory=list)
    passed: bool = False


class InitialCheck:
    """Holds each partition's first records until they show the topic is of the expected format.

    ``max_fraction`` None disables the check (every chunk is handed on at once).
    ``expects`` names the format in the error line.
    """

    def __init__(
        self, sample: int, max_fraction: float | None, expects: str = "schema-v1 msgpack events"
    ) -> None:
        self.sample = sample
        self.max_fraction = max_fraction
        self.expects = expects
        self._parts: dict[tuple[str, int], _Partition] = {}

    def offer(self, key: tuple[str, int], chunk: Chunk, records: int, caught_up: bool) -> list[Chunk]:
        """Chunks to hand on now, in offset order (``chunk`` itself, held ones, or none yet).

        ``records`` is how many records ``chunk`` covers; ``caught_up``: the
        partition has nothing more to read now. Raises SourceUserError when the
        partition fails the check.
        """
        if self.max_fraction is None:
            return [chunk]
        part = self._parts.setdefault(key, _Partition())
        if part.passed:
            return [chunk]
        judged, rejected, rejections = _first_records(chunk, records, self.sample - part.records)
        part.records += judged
        part.rejected += rejected
        for rejection in rejections:
            part.reasons[rejection.reason] += 1
            if part.first is None:
                part.first = rejection
            if len(part.values) < _SNIFF_RECORDS:
                part.values.append(rejection.value[:_SNIFF_BYTES])
        part.held.append(chunk)
        if part.records >= self.sample:
            if part.rejected / part.records >= self.max_fraction:
                raise SourceUserError(self._explain(key, part))
            part.passed = True
        elif not caught_up:
            return []
        held, part.held = part.held, []
        return held

    def pending(self, key: tuple[str, int]) -> bool:
        """True while ``key``'s records still count towards the check (the caller says if it is caught up)."""
        if self.max_fraction is None:
            return False
        part = self._parts.get(key)
        return part is None or not part.passed

    def forget(self, key: tuple[str, int]) -> None:
        """The partition was revoked: held records were never handed on, so its new owner reads them."""
        part = self._parts.get(key)
        if part is not None and not part.passed:
            del self._parts[key]

    def _explain(self, key: tuple[str, int], part: _Partition) -> str:
        topic, partition = key
        reasons = ", ".join(f"{reason} {n}" for reason, n in part.reasons.most_common())
        detail = f"; first: {part.first.detail[:200]}" if part.first is not None else ""
        shapes = Counter(looks_like(v) for v in part.values)
        shape = shapes.most_common(1)[0][0] if shapes else "is unknown"
        head = f"topic {topic} partition {partition}: {part.rejected} of the first {part.records} records "
        tail = "(source.max_initial_reject_fraction: null dead-letters such records and goes on)"
        top = part.reasons.most_common(1)[0][0] if part.reasons else None
        if top is not None and top not in _UNREADABLE:
            return (
                f"{head}were rejected ({reasons}{detail}); they read as {self.expects} ({shape}) but their "
                f"fields do not fit the config. Stopped without committing or dead-lettering them: fix the "
                f"field mapping (source.json, features) or the producer {tail}"
            )
        return (
            f"{head}were rejected ({reasons}{detail}); the rejected records {_plural(shape)}, not "
            f"{self.expects}. Stopped without committing or dead-lettering them: point source.topics at a "
            f"topic of {self.expects}, set source.format, source.topic_formats or source.decoder to what "
            f"the topic holds, or fix its producer {tail}"
        )


def _first_records(chunk: Chunk, records: int, room: int) -> tuple[int, int, list[Rejection]]:
    """``(judged, rejected, rejections)`` of the first ``room`` records of ``chunk`` (all when fewer).

    A poll hands over up to ``max_poll_records`` at once, many more than the check needs: the
    check judges exactly its sample, so its message counts what was judged. The records are
    told apart by offset (the offsets of accepted rows and of rejections).
    """
    if records <= room:
        return records, records - _accepted_records(chunk), chunk.rejections
    accepted = np.unique(chunk.row_offsets)
    offsets = np.union1d(accepted, np.array([r.offset for r in chunk.rejections], dtype=np.int64))
    if offsets.size <= room:  # records that gave neither a row nor a rejection: judge the whole chunk
        return records, records - accepted.size, chunk.rejections
    last = int(offsets[room - 1])
    rejections = [r for r in chunk.rejections if r.offset <= last]
    return room, room - int(np.count_nonzero(accepted <= last)), rejections


def _accepted_records(chunk: Chunk) -> int:
    """Records of ``chunk`` that gave at least one sample (``row_offsets`` is sorted)."""
    offsets = chunk.row_offsets
    if offsets.size == 0:
        return 0
    return int(np.count_nonzero(np.diff(offsets))) + 1


def _plural(shape: str) -> str:
    """``looks like JSON`` -> ``look like JSON``; ``is binary`` -> ``are binary``."""
    if shape.startswith("looks "):
        return "look " + shape.removeprefix("looks ")
    return "are " + shape.removeprefix("is ")
