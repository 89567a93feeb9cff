"""Reading single-sample schema-v1 messages (``{"v": 1, "label": ..., "dense": ..., "sparse": ...}``).

Single-sample messages come one dict per record, so this is the one place
that walks Python objects per sample; the fast paths (one-hot int ids, dense
maps of numbers) avoid anything but appends. Value checks that can be
vectorised (finite labels, ``max_ids``...) are left to the decoder.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kelp.consumers.columns import (
    U64_LIMIT,
    Cols,
    FieldLayout,
    RejectError,
    has_extras,
    one_id_each,
    read_extras,
)
from kelp.consumers.ids import str_id

__all__ = ["read_plain", "read_singles"]

_NUMBER = frozenset((float, int))
_INT = frozenset((int,))


def read_plain(
    layout: FieldLayout, msgs: list[dict[str, Any]], tags: list[int]
) -> tuple[Cols | None, list[dict[str, Any]], list[int]]:
    """Messages in the plain form, read with C-level checks; ``(cols, other msgs, their tags)``.

    The plain form is what producers usually write (``kelp produce``,
    :func:`~kelp.consumers.codec.encode_sample`): a number label, ``ts``
    absent or a number, ``dense`` absent or a list of ``n_dense`` numbers, and
    ``sparse`` a map of every configured feature, in config order, to one int.
    Such a message is checked with a few type-set and list comparisons and
    its ids stay in one list per message, converted for the whole run by one
    ``np.array``: far less Python per sample than :func:`read_singles`,
    which walks every id (docs/performance.md). Messages not in that form are
    returned untouched for :func:`read_singles`, as is the whole run if an id
    falls outside ``[0, 2**64)``, so every reject reason and detail still
    comes from there. So are messages with several labels or a ``weight``.
    """
    if layout.rich:
        return None, msgs, tags
    names = layout.sparse_names
    n_dense = len(layout.dense_names)
    label_name = layout.label_name
    default_row = layout.default_row
    nan = math.nan
    labels: list[float] = []
    ts: list[float] = []
    dense_rows: list[list[float]] = []
    id_rows: list[list[int]] = []
    row_record: list[int] = []
    rest: list[dict[str, Any]] = []
    rest_tags: list[int] = []
    for msg, tag in zip(msgs, tags, strict=True):
        label = msg[label_name]
        t = msg.get("ts", nan)
        dense = msg.get("dense", default_row)
        sparse = msg.get("sparse")
        if (
            (type(label) is float or type(label) is int)
            and (type(t) is float or type(t) is int)
            and type(dense) is list
            and len(dense) == n_dense
            and type(sparse) is dict
            and list(sparse) == names
            and not has_extras(msg)
        ):
            ids = list(sparse.values())
            if set(map(type, dense)) <= _NUMBER and set(map(type, ids)) <= _INT:
                labels.append(label)
                ts.append(t)
                dense_rows.append(dense)
                id_rows.append(ids)
                row_record.append(tag)
                continue
        rest.append(msg)
        rest_tags.append(tag)
    if not labels:
        return None, rest, rest_tags
    b = len(labels)
    try:
        ids_2d = np.array(id_rows, dtype=np.uint64).reshape(b, len(names))
    except OverflowError:  # an id outside [0, 2**64): read_singles names the message and the reason
        return None, msgs, tags
    by_feature = np.ascontiguousarray(ids_2d.T)
    ones = one_id_each(b)
    with np.errstate(over="ignore"):  # beyond float32 is inf: the decoder rejects it as bad_dense
        dense = np.array(dense_rows, dtype=np.float32).reshape(b, n_dense)
    cols = Cols(
        labels=np.array(labels, dtype=np.float64),
        dense=dense,
        ts=np.array(ts, dtype=np.float64),
        values=list(by_feature),
        lengths=[ones] * len(names),
        bad_id_rows=[],
        row_record=np.array(row_record, dtype=np.int64),
    )
    return cols, rest, rest_tags


def read_singles(
    layout: FieldLayout, msgs: list[dict[str, Any]], tags: list[int]
) -> tuple[Cols, list[tuple[int, RejectError]]]:
    """Single-sample messages as columns; ``tags[i]`` becomes ``row_record`` of ``msgs[i]``'s row.

    Returns the columns of the good messages and ``(tag, error)`` for each
    message rejected while reading (its ids are rolled back, so one bad field
    never leaves half a row behind).
    """
    labels: list[float] = []
    ts: list[float] = []
    dense_rows: list[list[float]] = []
    n_sparse = len(layout.sparse_names)
    values: list[list[int]] = [[] for _ in range(n_sparse)]
    len_rows: list[list[int]] = []
    row_record: list[int] = []
    nan = math.nan
    label_name = layout.label_name
    sparse_index = layout.sparse_index
    no_ids = [0] * n_sparse
    failures: list[tuple[int, RejectError]] = []
    extra_rows: list[list[Any]] = []
    weights: list[Any] = []
    weighted = False
    for msg, i in zip(msgs, tags, strict=True):
        row_lens = no_ids
        try:
            label = msg[label_name]
            if type(label) is not float and type(label) is not int:
                raise RejectError("bad_type", f"label is {type(label).__name__}")
            extras, w = read_extras(layout, msg, None)
            t = msg.get("ts")
            if t is None:
                t = nan
            elif type(t) is not float and type(t) is not int:
                raise RejectError("bad_type", f"ts is {type(t).__name__}")
            row = _dense_row(layout, msg.get("dense"))
            sparse = msg.get("sparse")
            if sparse is not None:
                if type(sparse) is not dict:
                    raise RejectError("bad_type", f"sparse is {type(sparse).__name__}, expected a map")
                row_lens = [0] * n_sparse
                for name, ids in sparse.items():
                    fi = sparse_index.get(name)
                    if fi is None:
                        raise RejectError("unknown_feature", f"sparse feature {name!r} is unknown")
                    if type(ids) is int and 0 <= ids < U64_LIMIT:  # the common one-hot case
                        values[fi].append(ids)
                        row_lens[fi] = 1
                    else:
                        checked = _ids_of(layout, name, fi, ids)
                        values[fi].extend(checked)
                        row_lens[fi] = len(checked)
        except RejectError as rej:
            for fi, n in enumerate(row_lens):  # roll back ids appended before the bad field
                if n:
                    del values[fi][-n:]
            failures.append((i, rej))
            continue
        labels.append(label)
        ts.append(t)
        dense_rows.append(row)
        row_record.append(i)
        len_rows.append(row_lens)
        extra_rows.append(extras)
        weights.append(w)
        weighted = weighted or "weight" in msg
    b = len(labels)
    n_extra = len(layout.extra_tasks)
    lengths = (
        np.array(len_rows, dtype=np.int32).reshape(b, n_sparse).T if b else np.zeros((n_sparse, 0), np.int32)
    )
    with np.errstate(over="ignore"):  # beyond float32 is inf: the decoder rejects it as bad_dense
        dense = (
            np.array(dense_rows, dtype=np.float32).reshape(b, len(layout.dense_names))
            if b
            else np.empty((0, len(layout.dense_names)), dtype=np.float32)
        )
    cols = Cols(
        labels=np.array(labels, dtype=np.float64),
        dense=dense,
        ts=np.array(ts, dtype=np.float64),
        values=[np.array(v, dtype=np.uint64) for v in values],
        lengths=[np.ascontiguousarray(ln) for ln in lengths],
        bad_id_rows=[],
        row_record=np.array(row_record, dtype=np.int64),
        extra_labels=np.array(extra_rows, dtype=np.float64).reshape(b, n_extra) if n_extra else None,
        weight=np.array(weights, dtype=np.float64) if weighted else None,
    )
    return cols, failures


def _dense_row(layout: FieldLayout, dense: Any) -> list[float]:
    if dense is None:
        return layout.default_row
    if isinstance(dense, dict):
        row = list(layout.default_row)
        for name, x in dense.items():
            j = layout.dense_index.get(name)
            if j is None:
                raise RejectError("unknown_feature", f"dense feature {name!r} is not configured")
            if x is None:
                continue
            if type(x) is not float and type(x) is not int:
                raise RejectError("bad_type", f"dense {name!r} is {type(x).__name__}")
            row[j] = x
        return row
    if isinstance(dense, list):
        if len(dense) != len(layout.default_row):
            raise RejectError(
                "bad_shape", f"dense has {len(dense)} values, config has {len(layout.default_row)}"
            )
        row = list(dense)
        for j, x in enumerate(row):
            if x is None:
                row[j] = layout.default_row[j]
            elif type(x) is not float and type(x) is not int:
                raise RejectError("bad_type", f"dense[{j}] is {type(x).__name__}")
        return row
    raise RejectError("bad_type", f"dense is {type(dense).__name__}, expected a map or a list")


def _ids_of(layout: FieldLayout, name: str, fi: int, ids: Any) -> list[int]:
    if type(ids) is not list:
        ids = [ids]
    elif len(ids) > layout.max_ids[fi]:
        raise RejectError("too_many_ids", f"{name}: {len(ids)} ids > max_ids {layout.max_ids[fi]}")
    out = []
    for x in ids:
        t = type(x)
        if t is int:
            if not 0 <= x < U64_LIMIT:
                raise RejectError("bad_id", f"{name}: id {x} outside [0, 2**64)")
            out.append(x)
        elif t is str:  # digits are that integer, anything else its hash (kelp.consumers.ids)
            try:
                out.append(str_id(x))
            except UnicodeEncodeError:  # a lone surrogate (a lenient JSON parser's): no bytes to hash
                raise RejectError("bad_id", f"{name}: id {x!r} is not valid Unicode text") from None
        elif t is float or t is bool:
            raise RejectError("bad_id", f"{name}: id {x!r} is a {t.__name__}")
        else:
            raise RejectError("bad_type", f"{name}: id of type {t.__name__}")
    return out
