"""Event schema v1 on the wire (msgpack): constants, id hashing and encoders.

Decoding and validation live in :mod:`kelp.consumers.decode`; this module is
what producers need. The full schema, with examples, is in docs/consumers.md.

A message is a msgpack map with ``"v": 1`` and either one sample::

    {"v": 1, "ts": 1700000000.5, "label": 1,
     "dense": {"I1": 3.0, "I2": 0.5}            # or [3.0, 0.5] in config order
     "sparse": {"C1": 123, "C2": ["a", "b"]}}   # id or list of ids

or a columnar batch of ``n`` samples (``"batch": n``)::

    {"v": 1, "batch": 2, "ts": [t0, t1] | t,
     "label": [1, 0],
     "dense": {"I1": [3.0, 1.0]} | [[3.0, .5], [1.0, 0]],
     "sparse": {"C1": [123, 456],                            # one id per sample
                "C2": {"values": ["a", "b", "c"], "lengths": [2, 1]}}}

Any numeric column of a batch may instead be a msgpack *bin* holding a packed
little-endian array (the fast form ``kelp produce`` writes): ``label`` float32[n],
``ts`` float64[n], ``dense`` float32[n, n_dense] row-major (or one float32[n]
per name), sparse ``values`` uint64[N] and ``lengths`` int32[n] (or a bare
uint64[n] bin for one id per sample).

Ids are ints in ``[0, 2**64)`` or strings, read by the one id rule every
format and serving share (:mod:`kelp.consumers.ids`): a string of ASCII
digits with a value below ``2**64`` is that integer (``"258029"`` is
``258029``), any other string the xxh3-64 hash (seed 0) of its UTF-8 bytes
(:func:`hash_str_id`; that hash is part of schema v1 and never changes).
Digit strings in msgpack were hashed too before this rule, a deliberate
breaking change: a model trained on digit strings sent as msgpack strings
(``{"C1": "258029"}``) finds those ids under new rows (the integers, which
CSV files and integer events already used), so it relearns their embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np
import xxhash

__all__ = [
    "MAX_REQUEST_ID_BYTES",
    "REASONS",
    "SCHEMA_VERSION",
    "encode_columns",
    "encode_request_record",
    "encode_sample",
    "hash_str_id",
    "is_valid_request_id",
]

SCHEMA_VERSION = 1

# Every reason a record can be rejected for (the `reason` label and dead-letter header).
REASONS: tuple[str, ...] = (
    "bad_msgpack",  # not msgpack, or not a map
    "bad_version",  # "v" missing or not 1
    "missing_label",  # no label field
    "bad_label",  # label not finite, or not 0/1 when label.kind is binary; a task not configured
    "bad_weight",  # sample weight negative or not finite
    "bad_dense",  # NaN/inf dense value (before or after transforms)
    "unknown_feature",  # a dense or sparse name the config does not list
    "bad_type",  # a field of the wrong type (string label, dict where a list belongs...)
    "bad_shape",  # columnar arrays of inconsistent lengths, dense list of the wrong width
    "too_many_ids",  # more ids than the feature's max_ids for one sample
    "bad_id",  # negative, >= 2**64, float or bool id
    "oversize",  # record larger than kafka.max_message_bytes
    "bad_json",  # format json: not JSON, or not an object
    "missing_field",  # a plug-in decoder found no field the record must have
    "bad_payload",  # a plug-in decoder could not read the record (framing, encoding)
    "unknown_schema",  # a plug-in decoder does not know the record's schema (id)
    "model_error",  # the trainer's model raised on the sample (kelp.daemon.model_errors)
)


def hash_str_id(value: str) -> int:
    """``xxh3_64(value.encode("utf-8"), seed=0)``: the id of a string that is not a number.

    The id of any string is :func:`kelp.consumers.ids.str_id`, which calls this for
    every string but a uint64 written in ASCII digits.
    """
    return xxhash.xxh3_64_intdigest(value.encode("utf-8"))


def encode_sample(
    label: float,
    dense: Mapping[str, float] | Sequence[float] | None = None,
    sparse: Mapping[str, int | str | Sequence[int | str]] | None = None,
    ts: float | None = None,
    *,
    labels: Mapping[str, float] | None = None,
    weight: float | None = None,
) -> bytes:
    """One sample as a schema-v1 message.

    ``labels`` (task -> label) is written as the ``labels`` map, for a config
    with several labels (``features.labels``); ``weight`` as the sample weight.
    """
    msg: dict[str, Any] = {"v": SCHEMA_VERSION, "label": label}
    if labels is not None:
        msg["labels"] = dict(labels)
    if weight is not None:
        msg["weight"] = weight
    if ts is not None:
        msg["ts"] = ts
    if dense is not None:
        msg["dense"] = dict(dense) if isinstance(dense, Mapping) else list(dense)
    if sparse is not None:
        msg["sparse"] = dict(sparse)
    return msgpack.packb(msg, use_bin_type=True)


def _pack(arr: np.ndarray, dtype: str, packed: bool) -> Any:
    a = np.ascontiguousarray(arr, dtype=dtype)
    return a.tobytes() if packed else a.tolist()


MAX_REQUEST_ID_BYTES = 128
"""The longest request id Kelp logs or joins on: one rule for the request log and ``kelp join``, so an
id is never accepted by one and refused (or stored at any size) by the other."""


def is_valid_request_id(given: bytes | str | None) -> bool:
    """True for 1 to :data:`MAX_REQUEST_ID_BYTES` printable ASCII characters (no spaces)."""
    if isinstance(given, str):
        given = given.encode("utf-8", "replace")
    return bool(given) and len(given) <= MAX_REQUEST_ID_BYTES and all(0x21 <= b <= 0x7E for b in given)


def encode_request_record(
    *,
    request_id: str,
    model_version: int,
    ts: float,
    dense: np.ndarray,
    sparse: Mapping[str, tuple[np.ndarray, np.ndarray]],
    scores: Mapping[str, np.ndarray],
    client_id: str | None = None,
) -> bytes:
    """What a serving replica scored, as a columnar message of this schema without labels.

    ``dense`` f32[n, n_dense] holds the features as the request sent them
    (defaults filled in, before transforms, as events carry them);
    ``sparse[f]`` is ``(values u64[N], lengths i32[n])``, the ids as scored;
    ``scores[task]`` f32[n]. The columns are packed like :func:`encode_columns`
    writes them, so a join adds labels and has a training event; the
    ``request`` map carries the id, the version and the scores, and ``client_id``
    when the client named the request itself (the logged id is always the
    replica's own, so a reused client id never merges two impressions). A trainer reading
    the record as it is rejects it (``missing_label``): it is an impression, not
    yet an example.
    """
    return msgpack.packb(
        {
            "v": SCHEMA_VERSION,
            "batch": int(dense.shape[0]),
            "ts": float(ts),
            "dense": _pack(dense, "<f4", True),
            "sparse": {
                name: {"values": _pack(values, "<u8", True), "lengths": _pack(lengths, "<i4", True)}
                for name, (values, lengths) in sparse.items()
            },
            "request": {
                "id": request_id,
                "model_version": int(model_version),
                "scores": {task: _pack(values, "<f4", True) for task, values in scores.items()},
                **({"client_id": client_id} if client_id is not None else {}),
            },
        },
        use_bin_type=True,
    )


def encode_columns(
    labels: np.ndarray,
    dense: np.ndarray | Mapping[str, np.ndarray] | None = None,
    sparse: Mapping[str, np.ndarray | tuple[np.ndarray, np.ndarray]] | None = None,
    ts: np.ndarray | float | None = None,
    packed: bool = True,
    *,
    task_labels: Mapping[str, np.ndarray] | None = None,
    weight: np.ndarray | None = None,
) -> bytes:
    """A columnar batch message of ``n = len(labels)`` samples.

    ``dense`` is float[n, n_dense] in config order or name -> float[n].
    ``sparse[f]`` is uint64[n] (one id per sample) or ``(values uint64[N], lengths int[n])``.
    ``task_labels`` is task -> float[n] (the ``labels`` map, several labels); ``weight`` float[n].
    ``packed=True`` writes little-endian binary arrays (fast); ``False`` writes msgpack lists.
    """
    n = len(labels)
    msg: dict[str, Any] = {"v": SCHEMA_VERSION, "batch": n, "label": _pack(labels, "<f4", packed)}
    if task_labels is not None:
        msg["labels"] = {k: _pack(v, "<f4", packed) for k, v in task_labels.items()}
    if weight is not None:
        msg["weight"] = _pack(weight, "<f4", packed)
    if ts is not None:
        msg["ts"] = float(ts) if np.isscalar(ts) else _pack(np.asarray(ts), "<f8", packed)
    if dense is not None:
        if isinstance(dense, Mapping):
            msg["dense"] = {k: _pack(v, "<f4", packed) for k, v in dense.items()}
        else:
            arr = np.asarray(dense)
            msg["dense"] = arr.astype("<f4").tobytes() if packed else arr.tolist()
    if sparse is not None:
        out: dict[str, Any] = {}
        for name, col in sparse.items():
            if isinstance(col, tuple):
                values, lengths = col
                out[name] = {"values": _pack(values, "<u8", packed), "lengths": _pack(lengths, "<i4", packed)}
            else:
                out[name] = _pack(col, "<u8", packed)
        msg["sparse"] = out
    return msgpack.packb(msg, use_bin_type=True)
