"""Decode and validate schema-v1 records into columnar chunks, rejecting bad records with a reason.

:class:`Decoder` turns a run of records from one partition (or file) into a
:class:`Chunk` of valid samples plus a list of :class:`Rejection`. Cheap
structural checks happen while walking each message; value checks (finite
labels and dense values, binary labels, id ranges, ``max_ids``) are numpy
masks over the whole run, so a bad row is found without per-id Python loops.

Columnar messages are validated per row: bad rows are rejected, the message's
good rows are kept. A structural problem (bad msgpack, wrong version, arrays
of the wrong length, unknown feature) rejects the whole message. One bad
record never affects another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
import numpy as np
from kelp.config import FeatureSpec
from kelp.consumers.codec import SCHEMA_VERSION, hash_str_id
from kelp.consumers.transforms import apply_transforms, defaults_of

__all__ = ["Chunk", "Decoder", "RawRecord", "Rejection"]

_U64_LIMIT = 1 << 64


class RawRecord(Protocol):
    """What the decoder reads: kafka-python's ConsumerRecord satisfies it; file sources build their own."""

    topic: str
    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True)
class Rec:
    """A plain :class:`RawRecord` (file sources, tests)."""

    topic: str
    partition: int
    offset: int
    value: bytes


@dataclass
class Rejection:
    """A rejected record (or rows of a columnar record) and why.

    ``rows`` is how many samples were rejected (1 for a single-sample message,
    the bad rows or the whole batch for a columnar one); ``value`` is the
    original record bytes, sent unchanged to the dead-letter topic.
    """

    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    value: bytes
    rows: int = 1


class _RejectError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass
class Chunk:
    """Valid, transformed samples from a run of records of one partition.

    * ``labels`` float32[b], ``dense`` float32[b, n_dense], ``ts`` float64[b];
    * ``values[f]`` uint64[N_f] and ``lengths[f]`` int32[b] per sparse feature;
    * ``row_offsets`` int64[b]: the record offset each row came from (sorted);
    * ``topic``, ``partition``, ``first_offset``..``last_offset``: every record
      of the run, rejected ones included.
    """

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    labels: np.ndarray
    dense: np.ndarray
    ts: np.ndarray
    values: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    row_offsets: np.ndarray
    nbytes: int = 0
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class _Cols:
    """Columns of one columnar message or of all single-sample messages of a run, before value checks."""

    labels: np.ndarray  # float64/32 [b]
    dense: np.ndarray  # float32 [b, d]
    ts: np.ndarray  # float64 [b]
    values: list[np.ndarray]  # per sparse feature uint64 [N_f]
    lengths: list[np.ndarray]  # per sparse feature int32 [b]
    bad_id_rows: list[np.ndarray]  # row indexes with a bad id (from conversion)
    row_record: np.ndarray  # int64 [b]: index of the record in the run


def _bin_array(raw: bytes, dtype: str, count: int, what: str) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    if len(raw) != count * itemsize:
        raise _RejectError("bad_shape", f"{what}: {len(raw)} bytes, expected {count} x {itemsize}")
    return np.frombuffer(raw, dtype=dtype)


def _float_column(value: Any, n: int, what: str, dtype: str = "<f4") -> np.ndarray:
    if isinstance(value, bytes):
        return _bin_array(value, dtype, n, what)
    if not isinstance(value, list):
        raise _RejectError("bad_type", f"{what}: expected a list or packed bytes, got {type(value).__name__}")
    if len(value) != n:
        raise _RejectError("bad_shape", f"{what}: {len(value)} values for a batch of {n}")
    try:
        return np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise _RejectError("bad_type", f"{what}: non-numeric value") from None


def _ids_from_list(items: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 ids, bad mask) for a list of int/str ids; bad = negative, too large, float, bool, other."""
    arr = np.array(items) if items else np.empty(0, dtype=np.uint64)
    kind = arr.dtype.kind
    if kind == "u":
        return arr.astype(np.uint64, copy=False), np.zeros(arr.size, dtype=bool)
    if kind == "i":
        bad = arr < 0
        return arr.astype(np.uint64), bad
    # Slow path: strings, floats, bools or ints beyond int64 mixed in.
    out = np.zeros(len(items), dtype=np.uint64)
    bad = np.zeros(len(items), dtype=bool)
    for i, x in enumerate(items):
        t = type(x)
        if t is int and 0 <= x < _U64_LIMIT:
            out[i] = x
        elif t is str:
            out[i] = hash_str_id(x)
        else:
            bad[i] = True
    return out, bad


class Decoder:
    """Validates and decodes schema-v1 records for one :class:`FeatureSpec`.

    ``max_message_bytes`` rejects larger records as ``oversize`` before parsing.
    """

    def __init__(self, spec: FeatureSpec, max_message_bytes: int | None = None) -> None:
        self.spec = spec
        self.max_message_bytes = max_message_bytes
        self.dense_names = [f.name for f in spec.dense]
        self.sparse_names = [f.name for f in spec.sparse]
        self.dense_index = {n: i for i, n in enumerate(self.dense_names)}
        self.sparse_index = {n: i for i, n in enumerate(self.sparse_names)}
        self.max_ids = np.array([f.max_ids for f in spec.sparse], dtype=np.int32)
        self.defaults = defaults_of(spec.dense)
        self._default_row = self.defaults.astype(np.float64).tolist()
        self.label_name = spec.label.name
        self.binary = spec.label.kind == "binary"
        self._unpacker_kw = {"raw": False, "strict_map_key": False}

    # ------------------------------------------------------------------ public

    def decode(self, records: Sequence[RawRecord]) -> Chunk:
        """Decode a non-empty run of records from one topic partition, in offset order."""
        rejections: list[Rejection] = []
        parts: list[_Cols] = []
        single_idx: list[int] = []
        single_msgs: list[dict[str, Any]] = []
        nbytes = 0
        for i, rec in enumerate(records):
            raw = rec.value if rec.value is not None else b""
            nbytes += len(raw)
            msg: Any = None
            try:
                msg = self._parse(raw)
                if "batch" in msg:
                    parts.append(self._columnar(msg, i))
                else:
                    single_msgs.append(msg)
                    single_idx.append(i)
            except _RejectError as rej:
                rejections.append(
                    Rejection(
                        rej.reason, rej.detail, rec.topic, rec.partition, rec.offset, raw, _rows_of(msg)
                    )
                )
        if single_msgs:
            parts.append(self._singles(single_msgs, single_idx, records, rejections))
        chunk = self._finish(parts, records, rejections)
        chunk.nbytes = nbytes
        return chunk

    # ------------------------------------------------------------------ parsing

    def _parse(self, raw: bytes) -> dict[str, Any]:
        if self.max_message_bytes is not None and len(raw) > self.max_message_bytes:
            raise _RejectError("oversize", f"{len(raw)} bytes > max_message_bytes {self.max_message_bytes}")
        try:
            msg = msgpack.unpackb(raw, **self._unpacker_kw)
        except Exception as exc:  # msgpack raises several unrelated types for garbage
            raise _RejectError("bad_msgpack", f"{type(exc).__name__}: {exc}"[:200]) from None
        if not isinstance(msg, dict):
            raise _RejectError("bad_msgpack", f"top level is {type(msg).__name__}, expected a map")
        v = msg.get("v")
        if v != SCHEMA_VERSION or type(v) is not int:
            raise _RejectError("bad_version", f"v={v!r}, expected {SCHEMA_VERSION}")
        if self.label_name not in msg:
            raise _RejectError("missing_label", f"no {self.label_name!r} field")
        return msg

    # ------------------------------------------------------------------ single-sample messages

    def _singles(
        self,
        msgs: list[dict[str, Any]],
        idx: list[int],
        records: Sequence[RawRecord],
        rejections: list[Rejection],
    ) -> _Cols:
        labels: list[float] = []
        ts: list[float] = []
        dense_rows: list[list[float]] = []
        n_sparse = len(self.sparse_names)
        values: list[list[int]] = [[] for _ in range(n_sparse)]
        len_rows: list[list[int]] = []
        row_record: list[int] = []
        nan = math.nan
        label_name = self.label_name
        sparse_index = self.sparse_index
        no_ids = [0] * n_sparse
        for msg, i in zip(msgs, idx, strict=True):
            row_lens = no_ids
            try:
                label = msg[label_name]
                if type(label) is not float and type(label) is not int:
                    raise _RejectError("bad_type", f"label is {type(label).__name__}")
                t = msg.get("ts")
                if t is None:
                    t = nan
                elif type(t) is not float and type(t) is not int:
                    raise _RejectError("bad_type", f"ts is {type(t).__name__}")
                row = self._dense_row(msg.get("dense"))
                sparse = msg.get("sparse")
                if sparse is not None:
                    if type(sparse) is not dict:
                        raise _RejectError("bad_type", f"sparse is {type(sparse).__name__}, expected a map")
                    row_lens = [0] * n_sparse
                    for name, ids in sparse.items():
                        fi = sparse_index.get(name)
                        if fi is None:
                            raise _RejectError("unknown_feature", f"sparse feature {name!r} is unknown")
                        if type(ids) is int and 0 <= ids < _U64_LIMIT:  # the common one-hot case
                            values[fi].append(ids)
                            row_lens[fi] = 1
                        else:
                            checked = self._ids_of(name, fi, ids)
                            values[fi].extend(checked)
                            row_lens[fi] = len(checked)
            except _RejectError as rej:
                for fi, n in enumerate(row_lens):  # roll back ids appended before the bad field
                    if n:
                        del values[fi][-n:]
                rec = records[i]
                rejections.append(
                    Rejection(rej.reason, rej.detail, rec.topic, rec.partition, rec.offset, rec.value)
                )
                continue
            labels.append(label)
            ts.append(t)
            dense_rows.append(row)
            row_record.append(i)
            len_rows.append(row_lens)
        b = len(labels)
        lengths = (
            np.array(len_rows, dtype=np.int32).reshape(b, n_sparse).T
            if b
            else np.zeros((n_sparse, 0), np.int32)
        )
        dense = (
            np.array(dense_rows, dtype=np.float32).reshape(b, len(self.dense_names))
            if b
            else np.empty((0, len(self.dense_names)), dtype=np.float32)
        )
        return _Cols(
            labels=np.array(labels, dtype=np.float64),
            dense=dense,
            ts=np.array(ts, dtype=np.float64),
            values=[np.array(v, dtype=np.uint64) for v in values],
            lengths=[np.ascontiguousarray(ln) for ln in lengths],
            bad_id_rows=[],
            row_record=np.array(row_record, dtype=np.int64),
        )

    def _dense_row(self, dense: Any) -> list[float]:
        if dense is None:
            return self._default_row
        if isinstance(dense, dict):
            row = list(self._default_row)
            for name, x in dense.items():
                j = self.dense_index.get(name)
                if j is None:
                    raise _RejectError("unknown_feature", f"dense feature {name!r} is not configured")
                if x is None:
                    continue
                if type(x) is not float and type(x) is not int:
                    raise _RejectError("bad_type", f"dense {name!r} is {type(x).__name__}")
                row[j] = x
            return row
        if isinstance(dense, list):
            if len(dense) != len(self._default_row):
                raise _RejectError(
                    "bad_shape", f"dense has {len(dense)} values, config has {len(self._default_row)}"
                )
            row = list(dense)
            for j, x in enumerate(row):
                if x is None:
                    row[j] = self._default_row[j]
                elif type(x) is not float and type(x) is not int:
                    raise _RejectError("bad_type", f"dense[{j}] is {type(x).__name__}")
            return row
        raise _RejectError("bad_type", f"dense is {type(dense).__name__}, expected a map or a list")

    def _ids_of(self, name: str, fi: int, ids: Any) -> list[int]:
        if type(ids) is not list:
            ids = [ids]
        elif len(ids) > self.max_ids[fi]:
            raise _RejectError("too_many_ids", f"{name}: {len(ids)} ids > max_ids {self.max_ids[fi]}")
        out = []
        for x in ids:
            t = type(x)
            if t is int:
                if not 0 <= x < _U64_LIMIT:
                    raise _RejectError("bad_id", f"{name}: id {x} outside [0, 2**64)")
                out.append(x)
            elif t is str:
                out.append(hash_str_id(x))
            elif t is float or t is bool:
                raise _RejectError("bad_id", f"{name}: id {x!r} is a {t.__name__}")
            else:
                raise _RejectError("bad_type", f"{name}: id of type {t.__name__}")
        return out

    # ------------------------------------------------------------------ columnar messages

    def _columnar(self, msg: dict[str, Any], rec_index: int) -> _Cols:
        n = msg["batch"]
        if type(n) is not int or n < 0:
            raise _RejectError("bad_type", f"batch is {n!r}, expected a count >= 0")
        labels = _float_column(msg[self.label_name], n, "label")
        t = msg.get("ts")
        if t is None:
            ts = np.full(n, np.nan)
        elif type(t) is float or type(t) is int:
            ts = np.full(n, float(t))
        else:
            ts = _float_column(t, n, "ts", "<f8")
        dense = self._columnar_dense(msg.get("dense"), n)
        values: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        bad_rows: list[np.ndarray] = []
        sparse = msg.get("sparse") or {}
        if not isinstance(sparse, dict):
            raise _RejectError("bad_type", f"sparse is {type(sparse).__name__}, expected a map")
        unknown = [k for k in sparse if k not in self.sparse_index]
        if unknown:
            raise _RejectError("unknown_feature", f"sparse feature {unknown[0]!r} is not configured")
        empty_ids = np.empty(0, dtype=np.uint64)
        for name in self.sparse_names:
            col = sparse.get(name)
            if col is None:
                values.append(empty_ids)
                lengths.append(np.zeros(n, dtype=np.int32))
                continue
            v, ln, bad = self._columnar_ids(name, col, n)
            values.append(v)
            lengths.append(ln)
            if bad is not None and bad.any():
                rows = np.repeat(np.arange(n), ln)[bad]
                bad_rows.append(np.unique(rows))
        return _Cols(labels, dense, ts, values, lengths, bad_rows, np.full(n, rec_index, dtype=np.int64))

    def _columnar_dense(self, dense: Any, n: int) -> np.ndarray:
        d = len(self.dense_names)
        if dense is None:
            return np.tile(self.defaults, (n, 1))
        if isinstance(dense, bytes):
            return _bin_array(dense, "<f4", n * d, "dense").reshape(n, d).copy()
        if isinstance(dense, list):
            if len(dense) != n:
                raise _RejectError("bad_shape", f"dense: {len(dense)} rows for a batch of {n}")
            try:
                arr = np.array(dense, dtype=np.float32)
            except (TypeError, ValueError):
                raise _RejectError("bad_type", "dense: rows of non-numbers or of different widths") from None
            if arr.shape != (n, d):
                raise _RejectError("bad_shape", f"dense: shape {arr.shape}, expected ({n}, {d})")
            return arr
        if isinstance(dense, dict):
            out = np.tile(self.defaults, (n, 1))
            for name, col in dense.items():
                j = self.dense_index.get(name)
                if j is None:
                    raise _RejectError("unknown_feature", f"dense feature {name!r} is not configured")
                out[:, j] = _float_column(col, n, f"dense {name!r}")
            return out
        raise _RejectError("bad_type", f"dense is {type(dense).__name__}")

    def _columnar_ids(self, name: str, col: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if isinstance(col, bytes):
            return _bin_array(col, "<u8", n, f"sparse {name!r}"), np.ones(n, dtype=np.int32), None
        if isinstance(col, dict):
            raw_v, raw_l = col.get("values"), col.get("lengths")
            if raw_v is None or raw_l is None:
                raise _RejectError("bad_type", f"sparse {name!r}: needs values and lengths")
            if isinstance(raw_l, bytes):
                ln = _bin_array(raw_l, "<i4", n, f"sparse {name!r} lengths").astype(np.int32)
            elif isinstance(raw_l, list) and len(raw_l) == n:
                try:
                    ln = np.array(raw_l, dtype=np.int64)
                except (TypeError, ValueError, OverflowError):
                    raise _RejectError("bad_type", f"sparse {name!r}: lengths must be ints") from None
            else:
                raise _RejectError("bad_shape", f"sparse {name!r}: lengths must have {n} entries")
            if (ln < 0).any():
                raise _RejectError("bad_shape", f"sparse {name!r}: negative length")
            total = int(ln.sum())
            if isinstance(raw_v, bytes):
                v, bad = _bin_array(raw_v, "<u8", total, f"sparse {name!r} values"), None
            elif isinstance(raw_v, list):
                if len(raw_v) != total:
                    raise _RejectError(
                        "bad_shape", f"sparse {name!r}: {len(raw_v)} values, lengths sum to {total}"
                    )
                v, bad = _ids_from_list(raw_v)
            else:
                raise _RejectError("bad_type", f"sparse {name!r}: values must be a list or packed bytes")
            return v, ln.astype(np.int32), bad
        if isinstance(col, list):
            if len(col) != n:
                raise _RejectError("bad_shape", f"sparse {name!r}: {len(col)} entries for a batch of {n}")
            if any(type(x) is list for x in col):
                ln = np.array([len(x) if type(x) is list else 1 for x in col], dtype=np.int32)
                flat = [y for x in col for y in (x if type(x) is list else (x,))]
                v, bad = _ids_from_list(flat)
                return v, ln, bad
            v, bad = _ids_from_list(col)
            return v, np.ones(n, dtype=np.int32), bad
        raise _RejectError("bad_type", f"sparse {name!r} is {type(col).__name__}")

    # ------------------------------------------------------------------ value checks and assembly

    def _finish(self, parts: list[_Cols], records: Sequence[RawRecord], rejections: list[Rejection]) -> Chunk:
        first, last = records[0], records[-1]
        d = len(self.dense_names)
        if not parts:
            return self._empty_chunk(first, last, rejections)
        p = parts[0] if len(parts) == 1 else _concat_cols(parts)
        b = p.labels.shape[0]
        ids_bad = np.zeros(b, dtype=bool)
        for rows in p.bad_id_rows:
            ids_bad[rows] = True
        if b and (np.diff(p.row_record) < 0).any():
            # Singles were gathered after the columnar messages; restore record order.
            order = np.argsort(p.row_record, kind="stable")
            p, ids_bad = _reorder_rows(p, order), ids_bad[order]
        bad = {}
        labels = p.labels
        with np.errstate(invalid="ignore"):
            bad_label = ~np.isfinite(labels)
            if self.binary:
                bad_label |= (labels != 0) & (labels != 1)
        bad["bad_label"] = bad_label
        bad["bad_id"] = ids_bad
        many = np.zeros(b, dtype=bool)
        for fi, ln in enumerate(p.lengths):
            many |= ln > self.max_ids[fi]
        bad["too_many_ids"] = many
        dense = (
            p.dense if p.dense.dtype == np.float32 and p.dense.flags.writeable else p.dense.astype(np.float32)
        )
        dense_bad_raw = ~np.isfinite(dense).all(axis=1) if d else np.zeros(b, dtype=bool)
        apply_transforms(dense, self.spec.dense)
        bad["bad_dense"] = ~np.isfinite(dense).all(axis=1) if d else np.zeros(b, dtype=bool)
        bad["bad_dense"] |= dense_bad_raw
        reject = np.zeros(b, dtype=bool)
        for reason, mask in bad.items():
            fresh = mask & ~reject  # each row gets its first reason only
            if fresh.any():
                self._row_rejections(reason, fresh, p.row_record, records, rejections)
                reject |= fresh
        row_offsets = np.array([r.offset for r in records], dtype=np.int64)[p.row_record]
        if reject.any():
            keep = ~reject
            values, lengths = [], []
            for v, ln in zip(p.values, p.lengths, strict=True):
                keep_ids = np.repeat(keep, ln)
                values.append(v[keep_ids])
                lengths.append(ln[keep])
            labels, dense, ts, row_offsets = labels[keep], dense[keep], p.ts[keep], row_offsets[keep]
        else:
            values, lengths, ts = p.values, p.lengths, p.ts
        rejections.sort(key=lambda r: r.offset)
        return Chunk(
            topic=first.topic,
            partition=first.partition,
            first_offset=first.offset,
            last_offset=last.offset,
            labels=labels.astype(np.float32, copy=False),
            dense=dense,
            ts=ts.astype(np.float64, copy=False),
            values=dict(zip(self.sparse_names, values, strict=True)),
            lengths={
                n: ln.astype(np.int32, copy=False) for n, ln in zip(self.sparse_names, lengths, strict=True)
            },
            row_offsets=row_offsets,
            rejections=rejections,
        )

    def _row_rejections(
        self,
        reason: str,
        mask: np.ndarray,
        row_record: np.ndarray,
        records: Sequence[RawRecord],
        rejections: list[Rejection],
    ) -> None:
        rec_idx, counts = np.unique(row_record[mask], return_counts=True)
        for i, c in zip(rec_idx.tolist(), counts.tolist(), strict=True):
            rec = records[i]
            rejections.append(
                Rejection(
                    reason, f"{c} row(s) failed {reason}", rec.topic, rec.partition, rec.offset, rec.value, c
                )
            )

    def _empty_chunk(self, first: RawRecord, last: RawRecord, rejections: list[Rejection]) -> Chunk:
        return Chunk(
            topic=first.topic,
            partition=first.partition,
            first_offset=first.offset,
            last_offset=last.offset,
            labels=np.empty(0, dtype=np.float32),
            dense=np.empty((0, len(self.dense_names)), dtype=np.float32),
            ts=np.empty(0, dtype=np.float64),
            values={n: np.empty(0, dtype=np.uint64) for n in self.sparse_names},
            lengths={n: np.empty(0, dtype=np.int32) for n in self.sparse_names},
            row_offsets=np.empty(0, dtype=np.int64),
            rejections=rejections,
        )


def _rows_of(msg: Any) -> int:
    """Samples a wholly rejected message stood for: its batch count when readable, else 1."""
    if isinstance(msg, dict) and "batch" in msg:
        n = msg["batch"]
        return n if type(n) is int and n > 0 else 1
    return 1


def _reorder_rows(p: _Cols, order: np.ndarray) -> _Cols:
    """Rows of ``p`` permuted by ``order`` (jagged ids follow their rows, vectorised)."""
    values, lengths = [], []
    for v, ln in zip(p.values, p.lengths, strict=True):
        ln64 = ln.astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(ln64)[:-1]))[order]
        new_len = ln64[order]
        new_starts = np.concatenate(([0], np.cumsum(new_len)[:-1]))
        idx = np.repeat(starts - new_starts, new_len) + np.arange(int(new_len.sum()))
        values.append(v[idx])
        lengths.append(new_len.astype(np.int32))
    return _Cols(p.labels[order], p.dense[order], p.ts[order], values, lengths, [], p.row_record[order])


def _concat_cols(parts: list[_Cols]) -> _Cols:
    starts = np.cumsum([0] + [p.labels.shape[0] for p in parts[:-1]])
    return _Cols(
        labels=np.concatenate([p.labels.astype(np.float64) for p in parts]),
        dense=np.concatenate([p.dense.astype(np.float32, copy=False) for p in parts]),
        ts=np.concatenate([p.ts for p in parts]),
        values=[np.concatenate([p.values[f] for p in parts]) for f in range(len(parts[0].values))],
        lengths=[np.concatenate([p.lengths[f] for p in parts]) for f in range(len(parts[0].lengths))],
        bad_id_rows=[rows + s for p, s in zip(parts, starts, strict=True) for rows in p.bad_id_rows],
        row_record=np.concatenate([p.row_record for p in parts]),
    )
