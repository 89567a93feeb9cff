"""Reading columnar schema-v1 messages (``{"v": 1, "batch": n, ...}``), packed binary columns included.

A columnar message carries many samples as arrays: lists, jagged
``{values, lengths}`` maps, or msgpack ``bin`` values holding little-endian
arrays (what ``kelp produce`` writes), which are read with ``frombuffer`` and
never touched per sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kelp.consumers.columns import Cols, FieldLayout, RejectError, bin_array, float_column, ids_from_list

__all__ = ["read_columnar"]


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
    return Cols(labels, dense, ts, values, lengths, bad_rows, np.full(n, tag, dtype=np.int64))


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
