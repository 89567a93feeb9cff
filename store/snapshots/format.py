"""One shard of a snapshot: a block of one table's rows as a safetensors file.

safetensors (a JSON header, then raw little-endian tensors) is readable from
any language with nothing but its reader and numpy, holds no code (a shard is
never unpickled), and maps straight onto :class:`StoredRows`::

    __metadata__  {"kelp_shard_format": "1", "table": "<table>"}
    ids           U64 [n]        row ids
    rows          F32|F16 [n, dim]  embeddings, in the table's storage dtype
    state         F32 [n]        row-wise Adagrad accumulator
    access_count  U32 [n]        LFU eviction's counter
    updated_s     U32 [n]        last update, unix seconds (TTL eviction)

:func:`decode_shard` refuses anything else (another file, a missing tensor, a
wrong dtype, lengths that disagree, a truncated file) with one line, so a bad
shard never reaches a store.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.errors import SnapshotError

__all__ = ["SHARD_FORMAT", "decode_shard", "encode_shard"]

SHARD_FORMAT = "1"
"""``__metadata__["kelp_shard_format"]`` of the shards this module writes and reads."""

_ROW_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2")}
_COLUMNS = {  # tensor -> (safetensors dtype, numpy dtype); "rows" takes one of _ROW_DTYPES
    "ids": ("U64", np.dtype("<u8")),
    "state": ("F32", np.dtype("<f4")),
    "access_count": ("U32", np.dtype("<u4")),
    "updated_s": ("U32", np.dtype("<u4")),
}
_MAX_HEADER = 1 << 20
"""A shard's JSON header names five tensors; anything near this size is not a shard."""


def encode_shard(table: str, rows: StoredRows) -> bytes:
    """The safetensors bytes of ``rows`` (all of table ``table``); an empty block is a valid shard."""
    if not table:
        raise SnapshotError("a shard needs a table name")
    if rows.rows.ndim != 2:
        raise SnapshotError(f"table {table}: rows must be [n, dim], got shape {list(rows.rows.shape)}")
    row_dtype = np.dtype(rows.rows.dtype).newbyteorder("<")
    if row_dtype not in _ROW_DTYPES.values():
        raise SnapshotError(f"table {table}: rows must be float32 or float16, not {rows.rows.dtype}")
    tensors = {
        name: np.ascontiguousarray(getattr(rows, name), dtype=dt) for name, (_, dt) in _COLUMNS.items()
    }
    tensors["rows"] = np.ascontiguousarray(rows.rows, dtype=row_dtype)
    metadata = {"kelp_shard_format": SHARD_FORMAT, "table": table}
    return bytes(safetensors.numpy.save(tensors, metadata=metadata))


def decode_shard(data: bytes, *, source: str = "shard") -> tuple[str, StoredRows]:
    """``(table, rows)`` of a shard written by :func:`encode_shard`; ``source`` names it in errors.

    The arrays are read-only views of ``data``'s copy (copy one to change it).
    """
    header = _header(data, source)
    table = _check_metadata(header.get("__metadata__"), source)
    _check_tensors(header, source)
    try:
        tensors = safetensors.numpy.load(data)
    except safetensors.SafetensorError as exc:
        raise SnapshotError(f"{source}: not a readable safetensors file ({_one_line(exc)})") from None
    rows = StoredRows(
        ids=tensors["ids"],
        rows=tensors["rows"],
        state=tensors["state"],
        access_count=tensors["access_count"],
        updated_s=tensors["updated_s"],
    )
    return table, rows


def _header(data: bytes, source: str) -> dict[str, Any]:
    """The JSON header, read by hand so a foreign or cut file is named before safetensors parses it."""
    if len(data) < 8:
        raise SnapshotError(f"{source}: not a Kelp row shard ({len(data)} bytes, truncated)")
    size = int.from_bytes(data[:8], "little")
    if size > _MAX_HEADER or size > len(data) - 8:
        raise SnapshotError(
            f"{source}: not a Kelp row shard (header of {size} bytes in a {len(data)}-byte file)"
        )
    try:
        header = json.loads(bytes(data[8 : 8 + size]))
    except (UnicodeDecodeError, ValueError):
        raise SnapshotError(f"{source}: not a Kelp row shard (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise SnapshotError(f"{source}: not a Kelp row shard (its header is not a JSON object)")
    return header


def _check_metadata(metadata: object, source: str) -> str:
    """The shard's table, after checking the file says it is a Kelp shard of a format this reads."""
    if not isinstance(metadata, dict) or "kelp_shard_format" not in metadata:
        raise SnapshotError(f"{source}: not a Kelp row shard (no kelp_shard_format in its metadata)")
    version = metadata["kelp_shard_format"]
    if version != SHARD_FORMAT:
        raise SnapshotError(
            f"{source}: shard format {version!r} is not one this Kelp reads ({SHARD_FORMAT!r}); upgrade Kelp"
        )
    table = metadata.get("table")
    if not isinstance(table, str) or not table:
        raise SnapshotError(f"{source}: Kelp row shard without a table name in its metadata")
    return table


def _check_tensors(header: dict[str, Any], source: str) -> None:
    """Every column present, with its dtype, and one entry per id in each."""
    for name in ("ids", "rows", *_COLUMNS):
        if not isinstance(header.get(name), dict):
            raise SnapshotError(f"{source}: Kelp row shard without the {name!r} tensor")
    n = _shape(header, "ids", source, 1)[0]
    for name, (dtype, _) in _COLUMNS.items():
        if header[name].get("dtype") != dtype:
            raise SnapshotError(f"{source}: tensor {name!r} is {header[name].get('dtype')}, expected {dtype}")
        if name != "ids" and _shape(header, name, source, 1)[0] != n:
            raise SnapshotError(
                f"{source}: tensor {name!r} has {header[name]['shape'][0]} entries for {n} ids"
            )
    if header["rows"].get("dtype") not in _ROW_DTYPES:
        raise SnapshotError(f"{source}: tensor 'rows' is {header['rows'].get('dtype')}, expected F32 or F16")
    rows = _shape(header, "rows", source, 2)
    if rows[0] != n:
        raise SnapshotError(f"{source}: tensor 'rows' has {rows[0]} rows for {n} ids")


def _shape(header: dict[str, Any], name: str, source: str, ndim: int) -> list[int]:
    shape = header[name].get("shape")
    if not isinstance(shape, list) or len(shape) != ndim or not all(isinstance(d, int) for d in shape):
        raise SnapshotError(f"{source}: tensor {name!r} has shape {shape}, expected {ndim} dimension(s)")
    return shape


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
