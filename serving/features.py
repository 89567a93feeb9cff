"""Decoded request bodies -> a :class:`~kelp.consumers.batch.MicroBatch`, checked in one pass.

Why not pydantic here: a 100-candidate request would become ~300 pydantic
objects before any scoring, and that validation would be the largest single cost
of the serving path (docs/performance.md). The rules are the same as the
generated request models (:mod:`kelp.serving.schemas`, still the OpenAPI
contract) and the event schema's, checked directly on the decoded JSON or
msgpack values:

* ``dense``: feature name -> finite number or null (null or absent = the
  feature's ``default``); booleans, strings, NaN and infinities are
  ``bad_dense``; a value that becomes non-finite after the config's transforms
  (``log1p(-2)``, ``1e300`` in float32) is ``bad_dense`` too;
* ``sparse``: feature name -> one id or a list of ids, each an integer in
  ``[0, 2**64)`` or a string (``bad_id`` otherwise: negative, too large,
  float, bool, anything else); a string is read by the one id rule of
  training (:func:`~kelp.consumers.ids.str_id`: digits are that integer,
  ``"258029"`` is ``258029``, any other string its xxh3-64 hash), so the
  id a client sends reaches the row the trainer wrote whatever its form;
  absent, null or ``[]`` = no ids; a list longer than
  ``min(max_ids, serving.max_ids_per_feature)`` is ``too_many_ids``;
* an unknown feature name is ``unknown_feature``; any other shape problem is
  ``invalid_request``; more than ``serving.max_samples_per_request`` samples or
  candidates is ``too_many_samples`` (413).

Candidates come row-wise (a list of feature objects, candidate *i* overriding
the user's features per name with its non-null ones) or **columnar**, the
compact form for msgpack clients::

    {"user": {...}, "candidates": {"count": 100,
                                   "dense": {"I1": [..100 floats..] | bin f32[100]},
                                   "sparse": {"C14": [..100 ids..] | bin u64[100] |
                                              {"values": [...], "lengths": [..100..]}}}}

A columnar feature replaces the user's for every candidate; packed ``bin``
columns are read with ``numpy.frombuffer`` and never touched per candidate.
Integer ids are checked and converted in bulk; only string ids are read one
by one in Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from kelp.config import FeatureSpec, ServingConfig
from kelp.consumers.batch import JaggedIds, MicroBatch, table_features
from kelp.consumers.ids import str_id
from kelp.consumers.transforms import apply_transforms, defaults_of
from kelp.serving.errors import BadRequestError, RequestError

__all__ = ["RequestBatch", "RequestParser", "ids_of"]

U64_LIMIT = 1 << 64
_SHOWN_CHARS = 40  # of a refused value's repr in an error message
_SPARSE = itemgetter("sparse")
_NO_IDS: list[int] = []
Given = tuple[dict[int, float], dict[int, "int | list[int]"]]
"""One sample's non-null dense values and sparse ids (one id, or a list), by column index."""


@dataclass
class RequestBatch(MicroBatch):
    """A scoring batch that also keeps the dense features as the request sent them.

    ``raw_dense`` f64[B, n_dense] has the defaults filled in but no transforms:
    the form events carry, so the request log can record what was scored in
    the form a trainer reads.
    """

    raw_dense: np.ndarray | None = None


def _invalid(message: str) -> BadRequestError:
    return BadRequestError("invalid_request", message)


def _shown(value: Any) -> str:
    """``repr(value)`` cut short: an error names the value it refuses without echoing a huge one back."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        return "<an integer too long to show>"
    return text if len(text) <= _SHOWN_CHARS else f"{text[: _SHOWN_CHARS - 3]}..."


def _not_an_id(where: str, value: Any) -> BadRequestError:
    return BadRequestError(
        "bad_id", f"{where}: {_shown(value)} is not an id (an integer in [0, 2**64) or a string)"
    )


def _string_id(value: str, where: str) -> int:
    """The id of a string sent as one (:func:`~kelp.consumers.ids.str_id`); ``bad_id`` if it has no UTF-8."""
    try:
        return str_id(value)
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON): there are no bytes to hash
        raise BadRequestError("bad_id", f"{where}: {_shown(value)} is not valid Unicode text") from None


def _ids_with_strings(ids: list[Any], where: str) -> list[Any]:
    """``ids`` checked, each string replaced by its id; the same list when all are integer ids."""
    strings = False
    for v in ids:
        if type(v) is not int or not 0 <= v < U64_LIMIT:
            if type(v) is not str:
                raise _not_an_id(where, v)
            strings = True
    if not strings:
        return ids
    return [_string_id(v, where) if type(v) is str else v for v in ids]


def ids_of(values: list[Any], where: str) -> np.ndarray:
    """uint64 ids of a list of integer or string ids (the one id rule); ``bad_id`` naming ``where``."""
    return np.asarray(_ids_with_strings(values, where), dtype=np.uint64)


def _out_of_range(where: str, value: Any) -> BadRequestError:
    """An integer too large for a float: ``math.isfinite`` raised OverflowError converting it."""
    return BadRequestError(
        "bad_dense", f"{where}: {_shown(value)} is not a finite number (beyond float range)"
    )


class RequestParser:
    """Checks decoded request bodies against one feature spec and builds the batch the scorer takes."""

    def __init__(self, spec: FeatureSpec, serving: ServingConfig) -> None:
        self.spec = spec
        self.max_samples = serving.max_samples_per_request
        self.dense_names = [f.name for f in spec.dense]
        self.sparse_names = [f.name for f in spec.sparse]
        self.dense_index = {name: j for j, name in enumerate(self.dense_names)}
        self.sparse_index = {name: i for i, name in enumerate(self.sparse_names)}
        self.id_limits = [min(f.max_ids, serving.max_ids_per_feature) for f in spec.sparse]
        self.defaults = defaults_of(spec.dense).astype(np.float64)  # float32 only after the checks
        self.features_by_table = table_features(spec)

    # ------------------------------------------------------------------ endpoints

    def samples(self, body: Any) -> MicroBatch:
        """``{"samples": [features, ...]}``: one batch row per sample."""
        self._keys(body, required=("samples",), optional=())
        samples = self._rows(body["samples"], "samples")
        return self._batch([self._features(s, f"samples[{r}]") for r, s in enumerate(samples)])

    def candidates(self, body: Any) -> MicroBatch:
        """``{"user": features, "candidates": [features, ...] | columnar}``: one batch row per candidate."""
        self._keys(body, required=("candidates",), optional=("user",))
        user = self._features(body.get("user"), "user")
        raw = body["candidates"]
        if isinstance(raw, dict):
            return self._columnar(user, raw)
        raw = self._rows(raw, "candidates")
        columns = self._uniform_ids(raw)
        if columns is not None:
            return self.assemble(
                self._dense_matrix([], user[0], len(raw)), self._sparse_columns(columns, user)
            )
        rows = [self._features(c, f"candidates[{r}]") for r, c in enumerate(raw)]
        return self._batch(rows, user)

    # ------------------------------------------------------------------ checks

    @staticmethod
    def _keys(body: Any, required: Sequence[str], optional: Sequence[str]) -> None:
        if not isinstance(body, dict):
            raise _invalid(f"the body is {type(body).__name__}, expected an object")
        for key in required:
            if key not in body:
                raise _invalid(f"{key!r} is required")
        extra = [k for k in body if k not in required and k not in optional]
        if extra:
            raise _invalid(f"unknown field {_shown(extra[0])}; expected {', '.join((*required, *optional))}")

    def _rows(self, value: Any, what: str) -> list[Any]:
        if not isinstance(value, list):
            raise _invalid(f"{what} is {type(value).__name__}, expected a list")
        if not value:
            raise _invalid(f"{what} is empty; send at least one")
        if len(value) > self.max_samples:
            raise RequestError(
                "too_many_samples",
                f"{len(value)} {what}, more than serving.max_samples_per_request ({self.max_samples})",
                status=413,
            )
        return value

    def _features(self, value: Any, where: str) -> Given:
        if value is None:
            return {}, {}
        if not isinstance(value, dict):
            raise _invalid(f"{where} is {type(value).__name__}, expected an object")
        extra = [k for k in value if k not in ("dense", "sparse")]
        if extra:
            raise _invalid(f"{where}: unknown field {_shown(extra[0])}; expected dense, sparse")
        return self._dense(value.get("dense", {}), where), self._sparse(value.get("sparse", {}), where)

    def _dense(self, value: Any, where: str) -> dict[int, float]:
        if not isinstance(value, dict):
            raise BadRequestError("bad_dense", f"{where}.dense is {type(value).__name__}, expected an object")
        out: dict[int, float] = {}
        try:
            for name, x in value.items():
                j = self.dense_index.get(name)
                if j is None:
                    raise BadRequestError(
                        "unknown_feature", f"{where}.dense: {_shown(name)} is not a dense feature"
                    )
                if x is None:
                    continue
                t = type(x)
                if (t is not float and t is not int) or not math.isfinite(x):
                    raise BadRequestError(
                        "bad_dense", f"{where}.dense.{name}: {_shown(x)} is not a finite number"
                    )
                out[j] = x
        except OverflowError:  # an int beyond float range; the loop's name and x are the culprit
            raise _out_of_range(f"{where}.dense.{name}", x) from None
        return out

    def _sparse(self, value: Any, where: str) -> dict[int, int | list[int]]:
        if not isinstance(value, dict):
            raise BadRequestError("bad_id", f"{where}.sparse is {type(value).__name__}, expected an object")
        out: dict[int, int | list[int]] = {}
        index = self.sparse_index
        for name, x in value.items():
            i = index.get(name)
            if i is None:
                raise BadRequestError(
                    "unknown_feature", f"{where}.sparse: {_shown(name)} is not a sparse feature"
                )
            if type(x) is int and 0 <= x < U64_LIMIT and self.id_limits[i]:  # the common case: one id
                out[i] = x
                continue
            if x is None:
                continue
            if type(x) is str and self.id_limits[i]:  # one string id
                out[i] = _string_id(x, f"{where}.sparse.{name}")
                continue
            ids = x if type(x) is list else [x]
            if len(ids) > self.id_limits[i]:
                raise BadRequestError(
                    "too_many_ids", f"{where}.sparse.{name}: {len(ids)} ids, at most {self.id_limits[i]}"
                )
            out[i] = _ids_with_strings(ids, f"{where}.sparse.{name}")
        return out

    # ------------------------------------------------------------------ uniform row candidates

    def _uniform_ids(self, rows: list[Any]) -> dict[int, np.ndarray] | None:
        """The common row-wise body, checked in bulk: ``{column index: uint64[n]}``, or None.

        It applies when every candidate is ``{"sparse": {...}}`` with the same feature names
        in the same order, each with one integer or string id. Then the ids are one flat list,
        type-checked with one ``set(map(type, ...))`` and converted by one ``np.array`` (which
        refuses negative and 65-bit integers), instead of a Python loop per candidate and
        feature; string ids, if any, are replaced by their ids first.
        Anything else (dense values, lists, nulls, a bad id) returns None and takes the
        per-candidate path, which finds the precise error.
        """
        # Every candidate a one-key dict holding "sparse": checked by C-level passes, not a loop.
        if set(map(type, rows)) != {dict} or set(map(len, rows)) != {1}:
            return None
        try:
            sparse = list(map(_SPARSE, rows))
        except KeyError:
            return None
        if type(sparse[0]) is not dict or len(set(map(type, sparse))) != 1:
            return None
        keys = tuple(sparse[0])
        # Every candidate names the same features in the same order: one comparison of the flattened
        # names (orjson hands out the same key objects, so it is mostly identity checks).
        if list(chain.from_iterable(sparse)) != list(keys) * len(sparse):
            return None
        index = [self.sparse_index.get(k) for k in keys]
        if not keys or None in index or not all(self.id_limits[i] for i in index):  # type: ignore[index]
            return None
        flat = list(chain.from_iterable(map(dict.values, sparse)))
        types = set(map(type, flat))
        if types != {int}:
            if not types <= {int, str}:
                return None
            try:
                flat = [str_id(v) if type(v) is str else v for v in flat]
            except UnicodeEncodeError:  # a string with no UTF-8: the per-candidate path names it
                return None
        try:
            ids = np.array(flat, dtype=np.uint64).reshape(len(rows), len(keys))
        except OverflowError:  # negative, or 2**64 and above
            return None
        return {i: ids[:, k] for k, i in enumerate(index)}  # type: ignore[misc]

    def _sparse_columns(self, columns: dict[int, np.ndarray], user: Given) -> dict[str, JaggedIds]:
        """Every sparse feature's column: the candidates' ids where they give them, else the user's."""
        n = len(next(iter(columns.values())))
        one_each = _one_each(n)
        user_sparse = user[1]
        out: dict[str, JaggedIds] = {}
        for i, name in enumerate(self.sparse_names):
            col = columns.get(i)
            if col is not None:
                out[name] = JaggedIds(np.ascontiguousarray(col), one_each)
            else:
                out[name] = _repeated(user_sparse.get(i), n, one_each)
        return out

    # ------------------------------------------------------------------ columnar candidates

    def _columnar(self, user: Given, raw: dict[str, Any]) -> MicroBatch:
        self._keys(raw, required=("count",), optional=("dense", "sparse"))
        n = raw["count"]
        if type(n) is not int or n < 1:
            raise _invalid(f"candidates.count is {_shown(n)}, expected a count >= 1")
        if n > self.max_samples:
            raise RequestError(
                "too_many_samples",
                f"{_shown(n)} candidates, more than serving.max_samples_per_request ({self.max_samples})",
                status=413,
            )
        user_dense, user_sparse = user
        dense = self._dense_matrix([], user_dense, n)
        columns = raw.get("dense") or {}
        if not isinstance(columns, dict):
            raise BadRequestError("bad_dense", "candidates.dense is not an object")
        for name, col in columns.items():
            j = self.dense_index.get(name)
            if j is None:
                raise BadRequestError(
                    "unknown_feature", f"candidates.dense: {_shown(name)} is not a dense feature"
                )
            dense[:, j] = self._dense_column(col, n, name)
        sparse: dict[str, JaggedIds] = {}
        columns = raw.get("sparse") or {}
        if not isinstance(columns, dict):
            raise BadRequestError("bad_id", "candidates.sparse is not an object")
        unknown = [k for k in columns if k not in self.sparse_index]
        if unknown:
            raise BadRequestError(
                "unknown_feature", f"candidates.sparse: {_shown(unknown[0])} is not a sparse feature"
            )
        for i, name in enumerate(self.sparse_names):
            if name in columns and columns[name] is not None:
                sparse[name] = self._sparse_column(columns[name], n, i)
            else:
                sparse[name] = _repeated(user_sparse.get(i), n, _one_each(n))
        return self.assemble(dense, sparse)

    @staticmethod
    def _dense_column(col: Any, n: int, name: str) -> np.ndarray:
        if isinstance(col, bytes):
            if len(col) != 4 * n:
                raise BadRequestError(
                    "bad_dense", f"candidates.dense.{name}: {len(col)} bytes, expected {n} x 4"
                )
            return np.frombuffer(col, dtype="<f4")
        if not isinstance(col, list) or len(col) != n:
            raise BadRequestError("bad_dense", f"candidates.dense.{name}: expected {n} numbers or f32 bytes")
        try:
            for x in col:
                t = type(x)
                if (t is not float and t is not int) or not math.isfinite(x):
                    raise BadRequestError(
                        "bad_dense", f"candidates.dense.{name}: {_shown(x)} is not a finite number"
                    )
        except OverflowError:  # an int beyond float range
            raise _out_of_range(f"candidates.dense.{name}", x) from None
        return np.asarray(col, dtype=np.float64)

    def _sparse_column(self, col: Any, n: int, i: int) -> JaggedIds:
        name, limit = self.sparse_names[i], self.id_limits[i]
        if isinstance(col, bytes):  # one id per candidate, packed
            if len(col) != 8 * n:
                raise BadRequestError(
                    "bad_id", f"candidates.sparse.{name}: {len(col)} bytes, expected {n} x 8"
                )
            return JaggedIds.one_hot(np.frombuffer(col, dtype="<u8"))
        if isinstance(col, list):
            if len(col) != n:
                raise BadRequestError(
                    "bad_id", f"candidates.sparse.{name}: {len(col)} ids for {n} candidates"
                )
            if limit < 1:
                raise BadRequestError("too_many_ids", f"candidates.sparse.{name}: at most {limit} ids")
            col = _ids_with_strings(col, f"candidates.sparse.{name}")
            return JaggedIds.one_hot(np.asarray(col, dtype=np.uint64))
        if isinstance(col, dict) and set(col) == {"values", "lengths"}:
            values, lengths = col["values"], col["lengths"]
            if isinstance(lengths, bytes):
                lengths = np.frombuffer(lengths, dtype="<i4") if len(lengths) == 4 * n else None
            elif isinstance(lengths, list) and all(type(x) is int for x in lengths):
                try:
                    lengths = np.asarray(lengths, dtype=np.int64)
                except OverflowError:  # beyond int64: refused below like any bad count
                    lengths = None
            else:
                lengths = None
            if lengths is None or len(lengths) != n or (lengths < 0).any():
                raise BadRequestError("bad_id", f"candidates.sparse.{name}.lengths: expected {n} counts >= 0")
            if int(lengths.max()) > limit:
                raise BadRequestError(
                    "too_many_ids", f"candidates.sparse.{name}: {int(lengths.max())} ids, at most {limit}"
                )
            if isinstance(values, bytes) and len(values) == 8 * int(lengths.sum()):
                ids = np.frombuffer(values, dtype="<u8")
            elif isinstance(values, list) and len(values) == int(lengths.sum()):
                values = _ids_with_strings(values, f"candidates.sparse.{name}.values")
                ids = np.asarray(values, dtype=np.uint64)
            else:
                raise BadRequestError(
                    "bad_id", f"candidates.sparse.{name}.values: expected sum(lengths) ids or u64 bytes"
                )
            return JaggedIds.from_lengths(ids, lengths.astype(np.int32))
        raise BadRequestError(
            "bad_id", f"candidates.sparse.{name}: expected a list, u64 bytes or {{values, lengths}}"
        )

    # ------------------------------------------------------------------ assembly

    def _batch(self, rows: list[Given], user: Given | None = None) -> MicroBatch:
        """Column by column: a row's value where it gives one, else the user's (candidates), else none."""
        user_dense, user_sparse = user if user is not None else ({}, {})
        dense = self._dense_matrix([d for d, _ in rows], user_dense, len(rows))
        sparse_rows = [s for _, s in rows]
        sparse = {}
        for i, name in enumerate(self.sparse_names):
            users = user_sparse.get(i)
            sparse[name] = _column([s.get(i, users) for s in sparse_rows])
        return self.assemble(dense, sparse)

    def _dense_matrix(self, rows: list[dict[int, float]], user: dict[int, float], n: int) -> np.ndarray:
        dense = np.tile(self.defaults, (n, 1))
        for j, x in user.items():
            dense[:, j] = x
        for r, d in enumerate(rows):
            for j, x in d.items():
                dense[r, j] = x
        return dense

    def assemble(self, dense: np.ndarray, sparse: dict[str, JaggedIds]) -> RequestBatch:
        """Transforms, the non-finite check after them, and the batch (labels are unused zeros).

        ``dense`` holds raw feature values, float64 ``[B, n_dense]``, and ``sparse``
        checked ids per feature: every request form (JSON, msgpack, named tensors)
        ends here, so they all score alike.
        """
        raw = dense
        if dense.size:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                dense = dense.astype(np.float32)  # 1e300 -> inf: rejected below, as the event schema does
                apply_transforms(dense, self.spec.dense)
            bad = ~np.isfinite(dense)
            if bad.any():
                r, j = (int(x[0]) for x in np.nonzero(bad))
                raise BadRequestError(
                    "bad_dense",
                    f"sample {r}: dense {self.spec.dense[j].name!r} is not finite after its transforms "
                    f"({[t.kind for t in self.spec.dense[j].transforms]})",
                )
        b = dense.shape[0]
        batch = RequestBatch.from_columns(
            self.spec,
            labels=np.zeros(b, np.float32),
            dense=dense.astype(np.float32, copy=False),
            sparse=sparse,
            features_by_table=self.features_by_table,
        )
        assert isinstance(batch, RequestBatch)
        batch.raw_dense = raw
        return batch


def _one_each(n: int) -> np.ndarray:
    """Offsets ``0..n`` of a one-id-per-row column, read-only so that every such column of a
    request can share them (26 ``arange`` calls become one)."""
    offsets = np.arange(n + 1, dtype=np.int32)
    offsets.flags.writeable = False
    return offsets


def _repeated(value: int | list[int] | None, n: int, one_each: np.ndarray) -> JaggedIds:
    """The user's checked ids (one, a list, or None for none) as the column of all ``n`` candidates."""
    if type(value) is int:
        return JaggedIds(np.full(n, value, dtype=np.uint64), one_each)
    return _column([value] * n)


def _column(per_row: list[Any]) -> JaggedIds:
    """Checked ids per row (one id, a list, or None for none) as the batch's jagged column."""
    if None not in per_row:
        try:  # the common case, one id per row: one C-level conversion
            one_each = np.array(per_row, dtype=np.uint64)
        except (TypeError, ValueError):  # lists among them
            pass
        else:
            if one_each.ndim == 1:
                return JaggedIds.one_hot(one_each)
    lists = [v if type(v) is list else (_NO_IDS if v is None else [v]) for v in per_row]
    lengths = np.fromiter(map(len, lists), dtype=np.int32, count=len(lists))
    values = np.fromiter(chain.from_iterable(lists), dtype=np.uint64, count=int(lengths.sum()))
    return JaggedIds.from_lengths(values, lengths)
