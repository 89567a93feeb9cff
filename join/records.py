"""The joiner's two inputs and its output, as bytes on the wire.

An *impression* is one served request: an event-v1 message (columnar with
``batch: n``, or one sample) whose ``request`` map carries the request's
``id``. The serving request log writes exactly that. Its ``n`` rows are the
request's candidates; a labelled output is the same message cut down to the
rows being emitted, with a ``labels`` map, an optional ``weight`` and a
``join`` map (the stable sample ids, and whether the event corrects an
earlier negative). Readers of event-v1 ignore ``request`` and ``join``, so
``kelp train`` reads the output as it reads any columnar event.

An *action* is one JSON object or msgpack map (or what the stream's plug-in
``decoder`` reads a record into) naming a request id, optionally an item id
(matched against the candidates' ``join.item_feature`` ids by the one id rule,
so an action may send the item as the request did), and an event time: epoch
seconds, or what the stream's ``casts`` declares (``iso8601``,
``milliseconds``...), read as ``source.json.casts`` reads a sample's time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import orjson

from kelp.config import ActionStream
from kelp.consumers.codec import MAX_REQUEST_ID_BYTES, SCHEMA_VERSION, is_valid_request_id
from kelp.consumers.columns import RejectError
from kelp.consumers.ids import id_of
from kelp.consumers.json_events import cast_reader
from kelp.consumers.plugin_decoder import load_decoder, parse_with

__all__ = [
    "MAX_EVENT_TS_S",
    "Action",
    "Impression",
    "InputError",
    "event_time",
    "load_action_decoders",
    "read_action",
    "sample_id",
    "sample_ids",
]

MAX_EVENT_TS_S = 253_402_300_799.0
"""The latest event time read at all (9999-12-31T23:59:59Z): anything later (or negative, or not
finite) is no time. It keeps every derived value (milliseconds as int64, deadlines, TTLs) in range;
how far ahead of the wall clock a time may be is the joiner's own bound (``max_future_skew_s``)."""


class InputError(ValueError):
    """An input record the joiner cannot read: ``reason`` (a short label for metrics) and a detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def sample_id(request_id: str, row: int) -> str:
    """The stable id of candidate ``row`` of a request: the same in every replay of the same input."""
    return f"{request_id}/{row}"


def sample_ids(request_id: str, rows: np.ndarray) -> list[str]:
    """:func:`sample_id` of each of ``rows``: the rows' numbers as text come from a table, since a
    labelled event names every candidate it holds and ``str`` of each is most of the cost."""
    prefix = request_id + "/"
    picked = rows.tolist()
    names = _row_names((max(picked) if picked else 0).bit_length())
    return [prefix + names[r] for r in picked]


@functools.lru_cache(maxsize=8)
def _row_names(bits: int) -> list[str]:
    """``str(r)`` for rows ``0..2**bits - 1``: one table per power of two, so few are cached."""
    return [str(r) for r in range(1 << bits)]


@dataclass(frozen=True, slots=True)
class Action:
    """One action of ``task`` on request ``request_id`` (and item ``item``, None: every candidate)."""

    task: str
    window_s: float
    request_id: str
    item: int | None
    ts: float


def read_action(stream: ActionStream, value: bytes | None, record_ts_ms: int) -> Action:
    """The action one record of ``stream`` holds; :class:`InputError` for one that names no request."""
    if value is None:
        raise InputError("bad_payload", "the record has no value")
    doc = _action_doc(stream, value)
    rid = _path(doc, stream.request_id_field)
    if rid is None or rid == "":
        raise InputError("missing_field", f"no request id at {stream.request_id_field!r}")
    if type(rid) is not str and type(rid) is not int:
        hint = _inside(rid, "request_id_field")
        raise InputError(
            "bad_type", f"request id at {stream.request_id_field!r} is {type(rid).__name__}{hint}"
        )
    rid = _request_id(rid, stream.request_id_field)
    item: int | None = None
    if stream.item_field is not None:
        raw = _path(doc, stream.item_field)
        if raw is None:
            raise InputError("missing_field", f"no item at {stream.item_field!r}")
        try:
            item = id_of(raw)
        except ValueError as exc:
            raise InputError(
                "bad_id", f"item at {stream.item_field!r}: {exc}{_inside(raw, 'item_field')}"
            ) from None
    return Action(stream.task, stream.window_s, rid, item, _action_ts(stream, doc, record_ts_ms))


def _action_ts(stream: ActionStream, doc: dict[str, Any], record_ts_ms: int) -> float:
    """The action's event time: the record's timestamp, or its ``ts_field`` read by its declared cast."""
    if stream.ts_field is None:
        return event_time(record_ts_ms / 1000.0, "the record's timestamp")
    what = f"event time at {stream.ts_field!r}"
    t = _path(doc, stream.ts_field)
    cast = stream.casts.get(stream.ts_field)
    if cast is not None and t is not None:
        try:
            t = cast_reader(cast)(t)
        except ValueError as exc:
            raise InputError("bad_type", f"{what}: {exc}") from None
    return event_time(t, what)


def _inside(value: Any, field: str) -> str:
    """A hint when an id is an object: the path should go on to the id inside it."""
    if not isinstance(value, dict):
        return ""
    keys = ", ".join(sorted(map(str, value))[:5])
    return f" (an object with {keys}: point {field} at the id inside it, a dotted path)"


_plugins: dict[int, tuple[ActionStream, Callable[[bytes], Any]]] = {}
"""Each action stream's plug-in decoder, made once (the stream is kept so its id is not reused)."""


def load_action_decoders(streams: Iterable[ActionStream]) -> None:
    """Make the plug-in decoder of every stream that names one, now: a decoder that cannot be made
    stops ``kelp join`` at start with one line, before it reads anything."""
    for stream in streams:
        if stream.decoder is not None:
            _plugin(stream)


def _plugin(stream: ActionStream) -> Callable[[bytes], Any]:
    hit = _plugins.get(id(stream))
    if hit is None or hit[0] is not stream:
        assert stream.decoder is not None
        where = f"join.actions[topic={stream.topic}].decoder"
        parse = parse_with(load_decoder(stream.decoder, None, stream.decoder_args, where))
        hit = _plugins[id(stream)] = (stream, parse)
    return hit[1]


def _action_doc(stream: ActionStream, value: bytes) -> dict[str, Any]:
    """The record as a dict: by the stream's plug-in decoder, or as JSON or msgpack."""
    if stream.decoder is not None:
        try:
            return _plugin(stream)(value)
        except RejectError as exc:
            raise InputError(exc.reason, exc.detail) from None
    try:
        doc = orjson.loads(value) if stream.format == "json" else msgpack.unpackb(value, raw=False)
    except (orjson.JSONDecodeError, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        raise InputError("bad_payload", f"not {stream.format}") from None
    if not isinstance(doc, dict):
        raise InputError("bad_payload", f"a {type(doc).__name__}, expected an object")
    return doc


def event_time(t: Any, what: str) -> float:
    """``t`` as epoch seconds; :class:`InputError` ``bad_type`` unless a finite number in
    ``[0, MAX_EVENT_TS_S]``: a NaN or infinite time would poison every deadline and TTL derived from it."""
    if type(t) is not float and type(t) is not int and not isinstance(t, np.floating):
        raise InputError("bad_type", f"{what} is {_short(t)}, not epoch seconds")
    try:
        ts = float(t)
    except OverflowError:  # an int past a double's range
        raise InputError("bad_type", f"{what} is {_short(t)}, out of range") from None
    if not 0.0 <= ts <= MAX_EVENT_TS_S:  # False for NaN too
        raise InputError("bad_type", f"{what} is {_short(t)}, not in [0, {MAX_EVENT_TS_S:.0f}] epoch seconds")
    return ts


def _request_id(rid: str | int, where: str) -> str:
    """The request id as a string, by the request log's own rule (a bounded, printable id)."""
    text = str(rid)
    if not is_valid_request_id(text):
        raise InputError(
            "bad_request_id",
            f"request id at {where!r} ({_short(text)}, {len(text.encode('utf-8', 'replace'))} bytes) is not "
            f"1 to {MAX_REQUEST_ID_BYTES} printable ASCII characters",
        )
    return text


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: a hostile value must not make a huge error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path(doc: dict[str, Any], path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


class Impression:
    """One served request as the joiner keeps it: the message, its id, time and candidate count.

    The message is kept as read (``raw``), and decoded only when rows are cut
    out of it or matched against an item.
    """

    __slots__ = ("_msg", "_one_id", "n", "raw", "request_id", "ts")

    def __init__(self, raw: bytes, msg: dict[str, Any], request_id: str, ts: float, n: int) -> None:
        self.raw = raw
        self._msg = msg
        self.request_id = request_id
        self.ts = ts
        self.n = n
        self._one_id: list[str] | None = None

    @classmethod
    def from_raw(cls, raw: bytes, record_ts_ms: int | None = None) -> Impression:
        """Read an impression; :class:`InputError` when it is not one (the reason says why)."""
        try:
            msg = msgpack.unpackb(raw, raw=False)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            raise InputError("bad_msgpack", "not msgpack") from None
        if not isinstance(msg, dict):
            raise InputError("bad_msgpack", f"a {type(msg).__name__}, expected a map")
        if msg.get("v") != SCHEMA_VERSION:
            raise InputError("bad_version", f"v is {msg.get('v')!r}, expected {SCHEMA_VERSION}")
        request = msg.get("request")
        rid = request.get("id") if isinstance(request, dict) else None
        if (type(rid) is not str and type(rid) is not int) or rid == "":
            raise InputError("missing_field", "no request id (request.id)")
        rid = _request_id(rid, "request.id")
        n = msg.get("batch", None)
        if n is None:
            n = 1
        elif type(n) is not int or n < 1:
            raise InputError("bad_type", f"batch is {n!r}, expected a count >= 1")
        ts = _first_ts(msg.get("ts"), n)
        if ts is None:
            if record_ts_ms is None:
                raise InputError("missing_field", "no event time (ts)")
            ts = event_time(record_ts_ms / 1000.0, "the record's timestamp")
        return cls(raw, msg, rid, ts, n)

    @classmethod
    def stored(
        cls, raw: bytes, request_id: str, ts: float, n: int, msg: dict[str, Any] | None = None
    ) -> Impression:
        """An impression kept in the waiting state, read back with the id, time and size it was
        stored under: checked when it was first read, and not again under rules that may since
        have changed (state written before an upgrade must still close). ``msg`` is ``raw``
        already decoded; the store decodes it when it loads the entry, and quarantines an entry
        whose ``raw`` does not decode to a map, so this does not fail on stored state."""
        if msg is None:
            msg = msgpack.unpackb(raw, raw=False)
        return cls(raw, msg, request_id, ts, n)

    def check_columns(self, item_feature: str | None) -> None:
        """Cut one row out and match an item now: a malformed column is then a dead letter when the
        impression is read (``bad_shape``), not a failure each time its window closes after a restart."""
        try:
            self._cut(np.zeros(1, dtype=np.int64))
            if item_feature is not None:
                self.rows_of_item(item_feature, 0)
        except InputError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise InputError("bad_shape", f"a column does not fit the batch ({type(exc).__name__})") from None

    @property
    def msg(self) -> dict[str, Any]:
        """The message decoded (shared, never changed: a cut builds a message of its own)."""
        return self._msg

    def _one_id_columns(self) -> list[str]:
        """The sparse columns of one packed id per row, found once per impression."""
        if self._one_id is None:
            sparse = self._msg.get("sparse")
            items = sparse.items() if isinstance(sparse, dict) else ()
            self._one_id = [name for name, col in items if _one_id_per_row(col, self.n)]
        return self._one_id

    def rows_of_item(self, feature: str, item: int) -> np.ndarray:
        """The candidate rows whose ``feature`` ids include ``item`` (int64, ascending)."""
        col = (self._msg.get("sparse") or {}).get(feature)
        if col is None:
            return np.empty(0, dtype=np.int64)
        if feature in self._one_id_columns():  # the request log's shape: the hits are the rows
            return np.flatnonzero(np.frombuffer(col["values"], "<u8") == np.uint64(item))
        values, lengths = _jagged(col, self.n, feature)
        hits = values == np.uint64(item)
        if len(values) == self.n and bool((lengths == 1).all()):  # one id per candidate: hits are rows
            return np.flatnonzero(hits)
        rows = np.repeat(np.arange(self.n), lengths)[hits]  # ascending: keep each row once
        return rows[np.r_[True, rows[1:] != rows[:-1]]] if len(rows) else rows

    def labelled(
        self,
        rows: np.ndarray,
        labels: dict[str, np.ndarray],
        weight: np.ndarray | None,
        late: bool,
    ) -> bytes:
        """The event of candidates ``rows`` with their ``labels`` (task -> f32 per row), ready to train on."""
        out = self._cut(rows)
        single = "batch" not in self._msg
        out["labels"] = {
            task: float(col[0]) if single else np.ascontiguousarray(col, "<f4").tobytes()
            for task, col in labels.items()
        }
        if weight is not None:
            out["weight"] = float(weight[0]) if single else np.ascontiguousarray(weight, "<f4").tobytes()
        out["join"] = {"sample_ids": sample_ids(self.request_id, rows), "late": late}
        return msgpack.packb(out, use_bin_type=True)

    def _cut(self, rows: np.ndarray) -> dict[str, Any]:
        """The message's fields cut down to ``rows``, before the labels: what :meth:`check_columns`
        tries on one row (no event is packed for it)."""
        msg = self._msg
        out: dict[str, Any] = {"v": SCHEMA_VERSION}
        single = "batch" not in msg
        if not single:
            out["batch"] = len(rows)
        for key, value in msg.items():
            if key in ("v", "batch", "label", "labels", "weight", "join"):
                continue
            if single:
                out[key] = value
            elif key == "sparse":
                out[key] = _take_sparse(value or {}, self.n, rows, self._one_id_columns())
            else:
                out[key] = _take_field(key, value, self.n, rows)
        return out


def _first_ts(t: Any, n: int) -> float | None:
    """The impression's event time: its first row's ``ts`` (a request's rows share one time)."""
    if t is None:
        return None
    if type(t) is float or type(t) is int:
        return event_time(t, "ts")
    if type(t) is bytes and len(t) == 8 * n:
        return event_time(float(np.frombuffer(t, "<f8", count=1)[0]), "ts")
    if type(t) is list and len(t) == n and (type(t[0]) is float or type(t[0]) is int):
        return event_time(t[0], "ts")
    raise InputError("bad_type", "ts is neither a number nor a column of the batch's length")


def _take_field(key: str, value: Any, n: int, rows: np.ndarray) -> Any:
    """``value`` (a top-level field of a columnar message) cut down to ``rows``."""
    if key == "ts":
        return value if type(value) in (float, int) else _take_column(value, n, rows, "<f8")
    if key == "dense":
        if isinstance(value, dict):
            return {name: _take_column(col, n, rows, "<f4") for name, col in value.items()}
        return _take_column(value, n, rows, "<f4")
    if key == "request" and isinstance(value, dict):
        scores = value.get("scores")
        out = dict(value)
        if isinstance(scores, dict):
            out["scores"] = {task: _take_column(col, n, rows, "<f4") for task, col in scores.items()}
        return out
    return value


def _take_column(col: Any, n: int, rows: np.ndarray, dtype: str) -> Any:
    """Rows of a per-sample column: a packed bin (any row width) or a list."""
    if type(col) is bytes:
        width = len(col) // max(n, 1)
        if width * n != len(col):
            raise InputError("bad_shape", f"a column of {len(col)} bytes for a batch of {n}")
        if len(rows) == 1:  # a positive's event: one slice of bytes, no array
            r = int(rows[0])
            return col[r * width : (r + 1) * width]
        arr = np.frombuffer(col, dtype=np.uint8).reshape(n, width)
        return arr[rows].tobytes()
    if isinstance(col, list):
        if len(col) != n:
            raise InputError("bad_shape", f"a column of {len(col)} values for a batch of {n}")
        return [col[int(r)] for r in rows]
    raise InputError("bad_type", f"a column is {type(col).__name__}")


def _take_sparse(sparse: dict[str, Any], n: int, rows: np.ndarray, single: list[str]) -> dict[str, Any]:
    """Every sparse column cut down to ``rows``, in the order given.

    The ``single`` columns, of one packed id per row (the request log's shape), are cut together,
    by one index over their values side by side: cut one by one, each column's few array calls
    cost more than the bytes they move, and a request holds a few dozen such columns.
    """
    cut: dict[str, Any] = {}
    if len(rows) == 1:  # a positive's event: slices of each one-id column's bytes, no array
        r = int(rows[0])
        one = _ones_i4(1)
        for name in single:
            cut[name] = {"values": sparse[name]["values"][8 * r : 8 * r + 8], "lengths": one}
    elif len(single) > 1:
        k = len(rows)
        joined = b"".join(sparse[name]["values"] for name in single)
        taken = np.frombuffer(joined, "<u8").reshape(len(single), n)[:, rows].tobytes()
        ones = _ones_i4(k)
        for i, name in enumerate(single):
            cut[name] = {"values": taken[8 * k * i : 8 * k * (i + 1)], "lengths": ones}
    return {name: cut[name] if name in cut else _take_ids(col, n, rows, name) for name, col in sparse.items()}


def _one_id_per_row(col: Any, n: int) -> bool:
    """A packed sparse column of exactly one ``<u8`` id per row (``<i4`` lengths all 1)."""
    if not isinstance(col, dict) or len(col) != 2:
        return False
    values, lengths = col.get("values"), col.get("lengths")
    return (
        type(values) is bytes and len(values) == 8 * n and type(lengths) is bytes and lengths == _ones_i4(n)
    )


def _take_ids(col: Any, n: int, rows: np.ndarray, name: str) -> Any:
    if isinstance(col, dict):
        values, lengths = col.get("values"), col.get("lengths")
        one = _one_packed_row(values, lengths, n, rows)
        if one is not None:
            return one
        lens = _lengths(lengths, n, name)
        index = _id_index(lens, rows)
        if type(values) is bytes:
            vals: Any = np.frombuffer(values, "<u8")[index].tobytes()
        elif isinstance(values, list):
            vals = [values[int(i)] for i in index]
        else:
            raise InputError("bad_type", f"sparse {name!r}: values is {type(values).__name__}")
        kept = lens[rows].astype("<i4")
        return {"values": vals, "lengths": kept.tobytes() if type(lengths) is bytes else kept.tolist()}
    return _take_column(col, n, rows, "<u8")


def _one_packed_row(values: Any, lengths: Any, n: int, rows: np.ndarray) -> dict[str, bytes] | None:
    """One row of a packed column of one id per row (``<u8`` values, ``<i4`` lengths of 1, as the
    request log writes it) as slices of its bytes; None where the general path must cut it. A
    positive's event is cut out of its impression once per click, and there the arrays of the
    general path cost more than the slices they produce."""
    if len(rows) != 1 or type(values) is not bytes or type(lengths) is not bytes:
        return None
    if len(values) != 8 * n or lengths != _ones_i4(n):
        return None
    r = int(rows[0])
    return {"values": values[8 * r : 8 * r + 8], "lengths": lengths[4 * r : 4 * r + 4]}


@functools.lru_cache(maxsize=64)
def _ones_i4(n: int) -> bytes:
    """``n`` lengths of 1 as packed ``<i4``: one comparison tells a column of one id per row."""
    return np.ones(n, "<i4").tobytes()


def _id_index(lens: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions in a jagged ``values`` column of the ids of ``rows``, in row order."""
    if bool((lens == 1).all()):
        return rows
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))[rows]
    kept = lens[rows]
    before = np.concatenate(([0], np.cumsum(kept)[:-1]))
    return np.arange(int(kept.sum())) + np.repeat(starts - before, kept)


def _lengths(lengths: Any, n: int, name: str) -> np.ndarray:
    if type(lengths) is bytes and len(lengths) == 4 * n:
        return np.frombuffer(lengths, "<i4").astype(np.int64)
    if isinstance(lengths, list) and len(lengths) == n:
        return np.asarray(lengths, dtype=np.int64)
    raise InputError("bad_shape", f"sparse {name!r}: lengths do not match the batch of {n}")


def _jagged(col: Any, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(ids u64[N], lengths[n])`` of a sparse column in any event-v1 form, by the one id rule."""
    if isinstance(col, dict):
        lens = _lengths(col.get("lengths"), n, name)
        values = col.get("values")
    else:
        values = col
        lens = None
    if type(values) is bytes:
        ids = np.frombuffer(values, "<u8")
    elif isinstance(values, list):
        try:
            ids = np.array([id_of(v) for v in values], dtype=np.uint64)
        except ValueError as exc:
            raise InputError("bad_id", f"sparse {name!r}: {exc}") from None
    elif n == 1 and (type(values) is int or type(values) is str):
        ids = np.array([id_of(values)], dtype=np.uint64)
    else:
        raise InputError("bad_type", f"sparse {name!r} is {type(values).__name__}")
    if lens is None and n == 1 and isinstance(values, list):
        lens = np.array([len(ids)], dtype=np.int64)
    if lens is None:
        if len(ids) != n:
            raise InputError("bad_shape", f"sparse {name!r}: {len(ids)} ids for a batch of {n}")
        lens = np.ones(n, dtype=np.int64)
    return ids, lens
