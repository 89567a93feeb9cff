"""Reading columnar schema-v1 messages (``{"v": 1, "batch": n, ...}``), packed binary columns included.

A columnar message carries many samples as arrays: lists, jagged
``{values, lengths}`` maps, or msgpack ``bin`` values holding little-endian
arrays (what ``kelp produce`` writes), which are read with ``frombuffer`` and
never touched per sample.

Messages entirely in the packed one-id-per-sample form ``kelp produce``
writes go through :class:`PackedRun` instead: it only checks byte lengths
and joins each column's bytes across the run, so a whole run costs one
``frombuffer`` per column rather than dozens of numpy calls per message.
Any other message takes :func:`read_columnar`, which gives every reject reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kelp.consumers.columns import (
    Cols,
    FieldLayout,
    RejectError,
    bin_array,
    float_column,
    has_extras,
    ids_from_list,
    one_id_each,
    read_extras,
)

__all__ = ["PackedRun", "read_columnar"]


def read_columnar(layout: FieldLayout, msg: dict[str, Any], tag: int) -> Cols:
    """One columnar message (``{"batch": n, ...}``) as columns, every row tagged ``tag``.

    A structural problem (wrong lengths, unknown feature, bad types) raises
    :class:`RejectError` for the whole message; per-row problems (bad ids) are
    marked in ``bad_id_rows`` for the decoder's value checks.
    """
    n = msg["batch"]
    if type(n) is not int or n < 0:
        raise RejectError("bad_type", f"batch is {n!r}, expected a count >= 0")
    labels = float_column(msg[layout.label_name], n, "label")
    t = msg.get("ts")
    if t is None:
        ts = np.full(n, np.nan)
    elif type(t) is float or type(t) is int:
        ts = np.full(n, float(t))
    else:
        ts = float_column(t, n, "ts", "<f8")
    dense = _dense(layout, msg.get("dense"), n)
    values: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    bad_rows: list[np.ndarray] = []
    sparse = msg.get("sparse") or {}
    if not isinstance(sparse, dict):
        raise RejectError("bad_type", f"sparse is {type(sparse).__name__}, expected a map")
    unknown = [k for k in sparse if k not in layout.sparse_index]
    if unknown:
        raise RejectError("unknown_feature", f"sparse feature {unknown[0]!r} is not configured")
    empty_ids = np.empty(0, dtype=np.uint64)
    for name in layout.sparse_names:
        col = sparse.get(name)
        if col is None:
            values.append(empty_ids)
            lengths.append(np.zeros(n, dtype=np.int32))
            continue
        v, ln, bad = _ids(name, col, n)
        values.append(v)
        lengths.append(ln)
        if bad is not None and bad.any():
            rows = np.repeat(np.arange(n), ln)[bad]
            bad_rows.append(np.unique(rows))
    extras, weight = read_extras(layout, msg, n)
    return Cols(
        labels,
        dense,
        ts,
        values,
        lengths,
        bad_rows,
        np.full(n, tag, dtype=np.int64),
        extra_labels=np.stack(extras, axis=1) if extras else None,
        weight=weight,
    )


class PackedRun:
    """Collects a run's packed one-hot columnar messages, then reads them as one :class:`Cols`.

    :meth:`add` accepts a message only when :func:`read_columnar` would read it
    without any reject or per-row check: ``batch`` a positive int, label a
    ``float32[n]`` bin, ``ts`` absent, a number or a ``float64[n]`` bin, dense
    absent or a ``float32[n, n_dense]`` bin, and every configured sparse
    feature (and no other) a ``uint64[n]`` bin, one label and no ``weight``. Any other message is left to
    :func:`read_columnar`, so reasons and details never depend on the path.
    Packed uint64 ids are all valid, and one id per sample never exceeds
    ``max_ids`` >= 1, so nothing is lost by skipping those checks here.
    """

    def __init__(self, layout: FieldLayout) -> None:
        self.layout = layout
        self._d = len(layout.dense_names)
        self._names = layout.sparse_names
        self._labels: list[bytes] = []
        self._ts: list[bytes] = []
        self._dense: list[bytes] = []
        self._values: list[list[bytes]] = [[] for _ in self._names]
        self._counts: list[int] = []
        self._tags: list[int] = []

    def __len__(self) -> int:
        return len(self._tags)

    @property
    def tags(self) -> list[int]:
        """The tags of the messages taken, in order."""
        return self._tags

    def add(self, msg: dict[str, Any], tag: int) -> bool:
        """Take ``msg`` (rows tagged ``tag``) if it is in the packed form; False leaves it untouched."""
        n = msg["batch"]
        if type(n) is not int or n <= 0 or self.layout.rich or has_extras(msg):
            return False
        label = msg[self.layout.label_name]
        if type(label) is not bytes or len(label) != 4 * n:
            return False
        t = msg.get("ts")
        if type(t) is bytes:
            if len(t) != 8 * n:
                return False
            ts = t
        elif t is None:
            ts = _full_f8(n, np.nan)
        elif type(t) is float or type(t) is int:
            ts = _full_f8(n, float(t))
        else:
            return False
        dense = msg.get("dense")
        if dense is None:
            dense = np.tile(self.layout.defaults, (n, 1)).tobytes()
        elif type(dense) is not bytes or len(dense) != 4 * n * self._d:
            return False
        sparse = msg.get("sparse")
        if type(sparse) is not dict or len(sparse) != len(self._names):
            return False
        cols = []
        for name in self._names:
            col = sparse.get(name)
            if type(col) is not bytes or len(col) != 8 * n:
                return False
            cols.append(col)
        for acc, col in zip(self._values, cols, strict=True):
            acc.append(col)
        self._labels.append(label)
        self._ts.append(ts)
        self._dense.append(dense)
        self._counts.append(n)
        self._tags.append(tag)
        return True

    def cols(self) -> Cols:
        """Everything added, as one :class:`Cols` in the order added."""
        total = sum(self._counts)
        ones = one_id_each(total)
        return Cols(
            labels=np.frombuffer(b"".join(self._labels), dtype="<f4"),
            dense=np.frombuffer(b"".join(self._dense), dtype="<f4").reshape(total, self._d),
            ts=np.frombuffer(b"".join(self._ts), dtype="<f8"),
            values=[np.frombuffer(b"".join(parts), dtype="<u8") for parts in self._values],
            lengths=[ones] * len(self._names),
            bad_id_rows=[],
            row_record=np.repeat(np.array(self._tags, dtype=np.int64), self._counts),
        )


def _full_f8(n: int, value: float) -> bytes:
    return np.full(n, value, dtype="<f8").tobytes()


def _dense(layout: FieldLayout, dense: Any, n: int) -> np.ndarray:
    d = len(layout.dense_names)
    if dense is None:
        return np.tile(layout.defaults, (n, 1))
    if isinstance(dense, bytes):
        return bin_array(dense, "<f4", n * d, "dense").reshape(n, d).copy()
    if isinstance(dense, list):
        if len(dense) != n:
            raise RejectError("bad_shape", f"dense: {len(dense)} rows for a batch of {n}")
        try:
            with np.errstate(over="ignore"):  # beyond float32 is inf: the decoder rejects it as bad_dense
                arr = np.array(dense, dtype=np.float32)
        except (TypeError, ValueError):
            raise RejectError("bad_type", "dense: rows of non-numbers or of different widths") from None
        if arr.shape != (n, d):
            raise RejectError("bad_shape", f"dense: shape {arr.shape}, expected ({n}, {d})")
        return arr
    if isinstance(dense, dict):
        out = np.tile(layout.defaults, (n, 1))
        for name, col in dense.items():
            j = layout.dense_index.get(name)
            if j is None:
                raise RejectError("unknown_feature", f"dense feature {name!r} is not configured")
            with np.errstate(over="ignore"):  # beyond float32 is inf: rejected as bad_dense
                out[:, j] = float_column(col, n, f"dense {name!r}")
        return out
    raise RejectError("bad_type", f"dense is {type(dense).__name__}")


def _ids(name: str, col: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    if isinstance(col, bytes):
        return bin_array(col, "<u8", n, f"sparse {name!r}"), np.ones(n, dtype=np.int32), None
    if isinstance(col, dict):
        raw_v, raw_l = col.get("values"), col.get("lengths")
        if raw_v is None or raw_l is None:
            raise RejectError("bad_type", f"sparse {name!r}: needs values and lengths")
        if isinstance(raw_l, bytes):
            ln = bin_array(raw_l, "<i4", n, f"sparse {name!r} lengths").astype(np.int32)
        elif isinstance(raw_l, list) and len(raw_l) == n:
            try:
                ln = np.array(raw_l, dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                raise RejectError("bad_type", f"sparse {name!r}: lengths must be ints") from None
        else:
            raise RejectError("bad_shape", f"sparse {name!r}: lengths must have {n} entries")
        if (ln < 0).any():
            raise RejectError("bad_shape", f"sparse {name!r}: negative length")
        total = int(ln.sum())
        if isinstance(raw_v, bytes):
            v, bad = bin_array(raw_v, "<u8", total, f"sparse {name!r} values"), None
        elif isinstance(raw_v, list):
            if len(raw_v) != total:
                raise RejectError(
                    "bad_shape", f"sparse {name!r}: {len(raw_v)} values, lengths sum to {total}"
                )
            v, bad = ids_from_list(raw_v)
        else:
            raise RejectError("bad_type", f"sparse {name!r}: values must be a list or packed bytes")
        return v, ln.astype(np.int32), bad
    if isinstance(col, list):
        if len(col) != n:
            raise RejectError("bad_shape", f"sparse {name!r}: {len(col)} entries for a batch of {n}")
        if any(type(x) is list for x in col):
            ln = np.array([len(x) if type(x) is list else 1 for x in col], dtype=np.int32)
            flat = [y for x in col for y in (x if type(x) is list else (x,))]
            v, bad = ids_from_list(flat)
            return v, ln, bad
        v, bad = ids_from_list(col)
        return v, np.ones(n, dtype=np.int32), bad
    raise RejectError("bad_type", f"sparse {name!r} is {type(col).__name__}")
