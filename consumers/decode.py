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

Reading each kind of message into columns is :mod:`~kelp.consumers.single`'s
and :mod:`~kelp.consumers.columnar`'s job; this module runs them, then the
value checks, and assembles the chunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
import numpy as np

from kelp.config import FeatureSpec
from kelp.consumers.codec import SCHEMA_VERSION
from kelp.consumers.columnar import PackedRun, read_columnar
from kelp.consumers.columns import Cols, FieldLayout, RejectError, first_label, has_extras
from kelp.consumers.layouts import PackedLayouts, PlainLayouts
from kelp.consumers.single import read_plain, read_singles
from kelp.consumers.transforms import apply_transforms

__all__ = ["Chunk", "Decoder", "RawRecord", "Rejection", "fits_float32"]


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

    ``ranges`` is set for a sample the trainer rejects (``model_error``): a
    micro-batch knows the record ranges it came from, not each sample's record,
    so ``ranges`` names them (``topic:partition:first-last``, comma-separated),
    ``topic``/``partition``/``offset`` are the first range's start, and
    ``value`` is the sample re-encoded as a single-sample message.
    """

    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    value: bytes
    rows: int = 1
    ranges: str | None = None


@dataclass
class Chunk:
    """Valid, transformed samples from a run of records of one partition.

    * ``labels`` float32[b] (the first task's), ``dense`` float32[b, n_dense], ``ts`` float64[b];
    * ``extra_labels[task]`` float32[b] for each task after the first (``features.labels``);
    * ``weight`` float32[b] sample weights, or None when no record carried one (all 1);
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
    extra_labels: dict[str, np.ndarray] = field(default_factory=dict)
    weight: np.ndarray | None = None
    _id_offsets: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def id_offsets(self, name: str) -> np.ndarray:
        """int64[b + 1]: where each row's ids of feature ``name`` start in ``values[name]``.

        Computed once per chunk and cached: the batcher cuts several batches
        from one chunk, and a cumulative sum over the whole chunk per feature
        per cut was a fifth of the poll thread's time (docs/performance.md).
        """
        off = self._id_offsets.get(name)
        if off is None:
            off = np.zeros(self.size + 1, dtype=np.int64)
            np.cumsum(self.lengths[name], out=off[1:])
            self._id_offsets[name] = off
        return off


class Decoder:
    """Validates and decodes schema-v1 records for one :class:`FeatureSpec`.

    ``max_message_bytes`` rejects larger records as ``oversize`` before parsing.
    """

    def __init__(self, spec: FeatureSpec, max_message_bytes: int | None = None) -> None:
        self.spec = spec
        self.max_message_bytes = max_message_bytes
        self.layout = FieldLayout.of(spec)
        self.dense_names = self.layout.dense_names
        self.sparse_names = self.layout.sparse_names
        self.max_ids = self.layout.max_ids
        self.label_name = spec.label.name
        self.binary = spec.label.kind == "binary"
        self.label_fields = tuple(f"label {task!r}" for task in spec.task_names())
        """How a rejection's detail names each task's label field (a JSON mapping names its paths)."""
        self.weight_field = "weight"
        self._unpacker_kw = {"raw": False, "strict_map_key": False}
        self._packed_layouts = PackedLayouts(self.layout)
        self._plain_layouts = PlainLayouts(self.layout)

    # ------------------------------------------------------------------ public

    def decode(self, records: Sequence[RawRecord]) -> Chunk:
        """Decode a non-empty run of records from one topic partition, in offset order."""
        rejections: list[Rejection] = []
        parts: list[Cols] = []
        packed = PackedRun(self.layout)
        single_idx: list[int] = []
        single_msgs: list[dict[str, Any]] = []
        nbytes = 0
        todo: list[int] | range = range(len(records))
        for layouts in (self._packed_layouts, self._plain_layouts):
            if layouts and todo:  # messages in a layout seen before: read straight from their bytes
                raws = [records[i].value or b"" for i in todo]
                known, todo, known_bytes = layouts.read(raws, todo)
                parts.extend(known)
                nbytes += known_bytes
        for i in todo:
            rec = records[i]
            raw = rec.value if rec.value is not None else b""
            nbytes += len(raw)
            msg: Any = None
            try:
                msg = self._parse(raw)
                if "batch" in msg:
                    if not packed.add(msg, i):
                        parts.append(read_columnar(self.layout, msg, i))
                else:
                    single_msgs.append(msg)
                    single_idx.append(i)
            except RejectError as rej:
                rejections.append(
                    Rejection(
                        rej.reason, rej.detail, rec.topic, rec.partition, rec.offset, raw, _rows_of(msg)
                    )
                )
        if len(packed):
            parts.append(packed.cols())
            self._learn(self._packed_layouts, records, packed.tags)
        if single_msgs:
            plain, single_msgs, single_idx = read_plain(self.layout, single_msgs, single_idx)
            if plain is not None:
                parts.append(plain)
                self._learn(self._plain_layouts, records, plain.row_record.tolist())
        if single_msgs:
            cols, failures = read_singles(self.layout, single_msgs, single_idx)
            parts.append(cols)
            for i, rej in failures:
                rec = records[i]
                rejections.append(
                    Rejection(rej.reason, rej.detail, rec.topic, rec.partition, rec.offset, rec.value)
                )
        chunk = self._finish(parts, records, rejections)
        chunk.nbytes = nbytes
        return chunk

    @staticmethod
    def _learn(layouts: PackedLayouts | PlainLayouts, records: Sequence[RawRecord], tags: list[int]) -> None:
        """Learn the layout of each message length not seen yet among these (accepted) records."""
        for i in tags:
            value = records[i].value
            if value is not None and not layouts.knows(len(value)):
                layouts.learn(value)

    # ------------------------------------------------------------------ parsing

    def _parse(self, raw: bytes) -> dict[str, Any]:
        if self.max_message_bytes is not None and len(raw) > self.max_message_bytes:
            raise RejectError("oversize", f"{len(raw)} bytes > max_message_bytes {self.max_message_bytes}")
        try:
            msg = msgpack.unpackb(raw, **self._unpacker_kw)
        except Exception as exc:  # msgpack raises several unrelated types for garbage
            raise RejectError("bad_msgpack", f"{type(exc).__name__}: {exc}"[:200]) from None
        if not isinstance(msg, dict):
            raise RejectError("bad_msgpack", f"top level is {type(msg).__name__}, expected a map")
        v = msg.get("v")
        if v != SCHEMA_VERSION or type(v) is not int:
            raise RejectError("bad_version", f"v={v!r}, expected {SCHEMA_VERSION}")
        if self.layout.rich or has_extras(msg):
            first_label(self.layout, msg)
        elif self.label_name not in msg:
            raise RejectError("missing_label", f"no {self.label_name!r} field")
        return msg

    # ------------------------------------------------------------------ value checks and assembly

    def _finish(self, parts: list[Cols], records: Sequence[RawRecord], rejections: list[Rejection]) -> Chunk:
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
            # Labels and weights train as float32: a finite float64 beyond its range (1e39) is inf there.
            bad_label = ~fits_float32(labels)
            if self.binary:
                bad_label |= (labels != 0) & (labels != 1)
            extra = p.extra_labels
            if extra is not None:
                bad_label |= ~fits_float32(extra).all(axis=1)
                for t, binary in enumerate(self.layout.binary[1:]):
                    if binary:
                        bad_label |= (extra[:, t] != 0) & (extra[:, t] != 1)
            bad["bad_label"] = bad_label
            bad["bad_weight"] = (
                ~(fits_float32(p.weight) & (p.weight >= 0)) if p.weight is not None else np.zeros(b, bool)
            )
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
                self._row_rejections(reason, fresh, p, dense=dense, records=records, rejections=rejections)
                reject |= fresh
        row_offsets = np.array([r.offset for r in records], dtype=np.int64)[p.row_record]
        extra_cols, weight = p.extra_labels, p.weight
        if reject.any():
            keep = ~reject
            extra_cols = None if extra_cols is None else extra_cols[keep]
            weight = None if weight is None else weight[keep]
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
            extra_labels={
                task: extra_cols[:, t].astype(np.float32)
                for t, task in enumerate(self.layout.extra_tasks)
                if extra_cols is not None
            },
            weight=None if weight is None else weight.astype(np.float32),
        )

    def _row_rejections(
        self,
        reason: str,
        mask: np.ndarray,
        p: Cols,
        *,
        dense: np.ndarray,
        records: Sequence[RawRecord],
        rejections: list[Rejection],
    ) -> None:
        """A :class:`Rejection` per record with rows in ``mask``, naming its first bad field and value."""
        rows = np.flatnonzero(mask)
        rec_idx, first, counts = np.unique(p.row_record[rows], return_index=True, return_counts=True)
        for i, at, c in zip(rec_idx.tolist(), rows[first].tolist(), counts.tolist(), strict=True):
            rec = records[i]
            why = self._why(reason, p, dense, at)
            detail = f"{c} row(s) failed {reason}" + (f": {why}" if why else "")
            rejections.append(Rejection(reason, detail, rec.topic, rec.partition, rec.offset, rec.value, c))

    def _why(self, reason: str, p: Cols, dense: np.ndarray, row: int) -> str:
        """The field and value that failed ``reason`` in ``row`` (empty where the reason says it all)."""
        if reason == "bad_weight" and p.weight is not None:
            return _bad_number(self.weight_field, float(p.weight[row]), nonnegative=True)
        if reason == "bad_label":
            values = [float(p.labels[row])]
            if p.extra_labels is not None:
                values += p.extra_labels[row].tolist()
            for field_name, binary, value in zip(self.label_fields, self.layout.binary, values, strict=False):
                why = _bad_number(field_name, value, nonnegative=False)
                if why:
                    return why
                if binary and value not in (0.0, 1.0):
                    return f"{field_name} is {value!r}, expected 0 or 1 (a binary label)"
        if reason == "bad_dense":
            for j in np.flatnonzero(~np.isfinite(dense[row])).tolist():
                return (
                    f"dense {self.dense_names[j]!r} is {float(dense[row, j])!r} as float32 "
                    "(NaN, infinite, beyond ±3.4e38, or made so by its transforms)"
                )
        return ""

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
            extra_labels={t: np.empty(0, dtype=np.float32) for t in self.layout.extra_tasks},
        )


_F32_MAX = float(np.finfo(np.float32).max)


def fits_float32(values: np.ndarray) -> np.ndarray:
    """bool mask: each value is finite once cast to float32, the dtype labels and weights train in.

    Checking finiteness in float64 is not enough: 1e39 is finite there and
    infinite in float32, where it turns a batch's loss into NaN.
    """
    if values.dtype == np.float32:
        return np.isfinite(values)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isfinite(values.astype(np.float32))


def _bad_number(field_name: str, value: float, *, nonnegative: bool) -> str:
    """Why ``value`` cannot train as float32 (or is negative where it must not be); empty if it can."""
    if math.isnan(value):
        return f"{field_name} is NaN"
    if math.isinf(value):
        return f"{field_name} is {value!r}"
    with np.errstate(over="ignore"):
        fits = bool(np.isfinite(np.float32(value)))
    if not fits:
        return f"{field_name} {value!r} does not fit float32 (|x| <= {_F32_MAX:.8g}), where it trains"
    if nonnegative and value < 0:
        return f"{field_name} {value!r} is negative"
    return ""


def _rows_of(msg: Any) -> int:
    """Samples a wholly rejected message stood for: its batch count when readable, else 1."""
    if isinstance(msg, dict) and "batch" in msg:
        n = msg["batch"]
        return n if type(n) is int and n > 0 else 1
    return 1


def _reorder_rows(p: Cols, order: np.ndarray) -> Cols:
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
    return Cols(
        p.labels[order],
        p.dense[order],
        p.ts[order],
        values,
        lengths,
        [],
        p.row_record[order],
        extra_labels=None if p.extra_labels is None else p.extra_labels[order],
        weight=None if p.weight is None else p.weight[order],
    )


def _concat_cols(parts: list[Cols]) -> Cols:
    starts = np.cumsum([0] + [p.labels.shape[0] for p in parts[:-1]])
    return Cols(
        labels=np.concatenate([p.labels.astype(np.float64) for p in parts]),
        dense=np.concatenate([p.dense.astype(np.float32, copy=False) for p in parts]),
        ts=np.concatenate([p.ts for p in parts]),
        values=[np.concatenate([p.values[f] for p in parts]) for f in range(len(parts[0].values))],
        lengths=[np.concatenate([p.lengths[f] for p in parts]) for f in range(len(parts[0].lengths))],
        bad_id_rows=[rows + s for p, s in zip(parts, starts, strict=True) for rows in p.bad_id_rows],
        row_record=np.concatenate([p.row_record for p in parts]),
        extra_labels=None
        if parts[0].extra_labels is None
        else np.concatenate([p.extra_labels for p in parts if p.extra_labels is not None]),
        weight=None
        if all(p.weight is None for p in parts)
        else np.concatenate([np.ones(p.labels.shape[0]) if p.weight is None else p.weight for p in parts]),
    )
