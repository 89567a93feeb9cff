"""``kelp store import``: pre-trained rows into a deployment's store, with admission metadata set.

Three kinds of file, told apart by their content (never by the name), none of
them unpickled:

* **safetensors with ``ids`` and ``rows``**: ``ids`` uint64[n] (int64 without
  negatives is taken too), ``rows`` [n, dim] floats, optionally ``state``
  float32[n] (the row-wise Adagrad accumulator);
* **a Kelp snapshot shard** (``kelp_shard_format`` in its metadata): rows with
  every stored field (state, access count, last update) as the snapshot has them;
* **a PyTorch / TorchRec ``state_dict`` saved with ``torch.save``**, read with
  ``torch.load(weights_only=True)``: ``--tensor NAME`` picks the weight
  ([num_embeddings, dim], e.g. ``embedding_bags.t_user.weight``; needed when
  the file holds more than one 2-D tensor), and a row's index is its id. Kelp
  hashes string ids into 64-bit ids; a table trained elsewhere on indices
  matches only when its ids are those indices.

What a row gets that the file does not give: ``state`` is the configured
``trainer.sparse_optimizer.initial_accumulator`` (what a new row starts with),
``access_count`` 1 and ``updated_s`` now, so LFU eviction treats an imported
row as seen once and TTL eviction counts its age from the import.

Without ``--replace`` a table that already holds rows is refused (an import is
for a new deployment, or for rows the operator means to throw away); with it,
the table's rows are deleted first. Rows are written in blocks
(``EmbeddingStore.load_rows``), never one round trip per row.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kelp.config import KelpConfig, TableSpec
from kelp.errors import UserError
from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.restore_rows import stored_tables

__all__ = ["ImportReport", "import_rows", "read_rows_file"]

BLOCK_ROWS = 65536
"""Rows per ``load_rows`` call: bounded memory per round trip whatever the file's size."""


@dataclass(frozen=True)
class ImportReport:
    table: str
    rows: int
    dropped: int
    kind: str
    """What the file was read as: ``safetensors``, ``kelp shard`` or ``torch state_dict``."""


@dataclass(frozen=True)
class _FileRows:
    ids: np.ndarray
    rows: np.ndarray
    state: np.ndarray | None
    access_count: np.ndarray | None
    updated_s: np.ndarray | None
    kind: str


def import_rows(
    cfg: KelpConfig, table: str, path: Path, *, replace: bool = False, tensor: str | None = None
) -> ImportReport:
    """Load the rows of ``path`` into ``table`` of the store; bad input is one :class:`UserError` line."""
    from kelp.store.factory import build_store

    spec = _table(cfg, table)
    found = read_rows_file(path, tensor=tensor)
    stored = to_stored(found, spec, cfg, path)
    if cfg.store.backend == "memory":
        raise UserError(
            "store.backend is memory: its rows live inside one process and an import would vanish "
            "with this command; import into a Redis backend"
        )
    # Straight to the backing store: a hot tier's copy here would only delay the rows' write.
    direct = cfg.store.model_copy(
        update={"hot_cache": cfg.store.hot_cache.model_copy(update={"enabled": False})}
    )
    with build_store(direct, cfg.features.store_tables(), cfg.deployment) as store:
        dropped = 0
        if replace:
            dropped = store.drop_rows(table)
        elif stored_tables(store, [table]):
            raise UserError(
                f"table {table!r} of deployment {cfg.deployment!r} already holds rows; "
                "--replace deletes them first"
            )
        for start in range(0, len(stored), BLOCK_ROWS):
            store.load_rows(table, stored.part(slice(start, start + BLOCK_ROWS)))
    return ImportReport(table=table, rows=len(stored), dropped=dropped, kind=found.kind)


def _table(cfg: KelpConfig, name: str) -> TableSpec:
    tables = {t.name: t for t in cfg.features.store_tables()}
    if name not in tables:
        raise UserError(f"--table {name!r} is not a table of this config (tables: {', '.join(tables)})")
    return tables[name]


# --------------------------------------------------------------------------- reading


def read_rows_file(path: Path, *, tensor: str | None = None) -> _FileRows:
    """The ids and rows of a safetensors file, a Kelp shard or a ``torch.save``-d state_dict."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    header = _safetensors_header(path)
    if header is not None:
        if tensor is not None:
            raise UserError(f"{path}: --tensor is for a torch state_dict; this is a safetensors file")
        if "kelp_shard_format" in (header.get("__metadata__") or {}):
            return _read_shard(path)
        return _read_safetensors(path, header)
    return _read_state_dict(path, tensor)


def _safetensors_header(path: Path) -> dict | None:
    """The safetensors JSON header, or None when the file is not safetensors."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        size = int.from_bytes(head, "little")
        if size <= 0 or size > 100_000_000:
            return None
        raw = f.read(size)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _read_shard(path: Path) -> _FileRows:
    from kelp.store.snapshots.format import decode_shard

    _, rows = decode_shard(path.read_bytes())
    return _FileRows(rows.ids, rows.rows, rows.state, rows.access_count, rows.updated_s, "kelp shard")


def _read_safetensors(path: Path, header: dict) -> _FileRows:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    names = sorted(k for k in header if k != "__metadata__")
    missing = [n for n in ("ids", "rows") if n not in names]
    if missing:
        raise UserError(
            f"{path}: a safetensors import needs tensors 'ids' (uint64[n]) and 'rows' ([n, dim]); "
            f"missing {', '.join(map(repr, missing))} (it holds {', '.join(names) or 'none'})"
        )
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable safetensors file: {' '.join(str(exc).split())}") from None
    return _FileRows(tensors["ids"], tensors["rows"], tensors.get("state"), None, None, "safetensors")


def _read_state_dict(path: Path, tensor: str | None) -> _FileRows:
    import pickle
    import zipfile

    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise UserError(
            f"{path}: neither safetensors nor a torch.save file of tensors "
            f"(torch.load weights_only: {' '.join(str(exc).split())[:200]})"
        ) from None
    if isinstance(loaded, torch.Tensor):
        loaded = {"": loaded}
    if not isinstance(loaded, dict):
        raise UserError(f"{path}: holds a {type(loaded).__name__}, not a state_dict of tensors")
    weights = {k: v for k, v in loaded.items() if isinstance(v, torch.Tensor) and v.dim() == 2}
    name = _pick_tensor(path, weights, tensor)
    weight = weights[name].detach().to(torch.float32).numpy()
    ids = np.arange(len(weight), dtype=np.uint64)
    return _FileRows(ids, weight, None, None, None, "torch state_dict")


def _pick_tensor(path: Path, weights: dict, tensor: str | None) -> str:
    listed = ", ".join(sorted(weights)) or "none"
    if tensor is not None:
        if tensor not in weights:
            raise UserError(f"{path}: no 2-D tensor {tensor!r} (2-D tensors: {listed})")
        return tensor
    if len(weights) != 1:
        raise UserError(
            f"{path}: holds {len(weights)} 2-D tensors; name the table's with --tensor ({listed})"
        )
    return next(iter(weights))


# --------------------------------------------------------------------------- checking


def to_stored(found: _FileRows, spec: TableSpec, cfg: KelpConfig, path: Path) -> StoredRows:
    """The file's rows as the table stores them, with admission metadata filled in; refuses bad input."""
    ids = _ids(found.ids, path)
    rows = np.asarray(found.rows)
    if rows.ndim != 2 or len(rows) != len(ids):
        raise UserError(f"{path}: rows must be [{len(ids)}, dim] for {len(ids)} ids, got {list(rows.shape)}")
    if rows.shape[1] != spec.dim:
        raise UserError(f"{path}: rows have dim {rows.shape[1]}, table {spec.name!r} has dim {spec.dim}")
    if not np.issubdtype(rows.dtype, np.floating):
        raise UserError(f"{path}: rows are {rows.dtype}, expected floats")
    bad = ~np.isfinite(rows).all(axis=1)
    if bad.any():
        raise UserError(f"{path}: {int(bad.sum())} rows hold NaN or infinity (first id {int(ids[bad][0])})")
    n = len(ids)
    initial = cfg.trainer.sparse_optimizer.initial_accumulator
    state = _column(found.state, n, np.float32, initial, name="state", path=path)
    if not np.isfinite(state).all() or (state < 0).any():
        raise UserError(f"{path}: state must be finite and >= 0 (a row-wise Adagrad accumulator)")
    return StoredRows(
        ids=ids,
        rows=np.ascontiguousarray(rows, dtype=np.dtype(spec.dtype)),
        state=state,
        access_count=_column(found.access_count, n, np.uint32, 1, name="access_count", path=path),
        updated_s=_column(found.updated_s, n, np.uint32, int(time.time()), name="updated_s", path=path),
    )


def _ids(raw: np.ndarray, path: Path) -> np.ndarray:
    ids = np.asarray(raw)
    if ids.ndim != 1:
        raise UserError(f"{path}: ids must be one-dimensional, got shape {list(ids.shape)}")
    if ids.dtype == np.int64:
        if (ids < 0).any():
            raise UserError(f"{path}: ids must be uint64; found negative int64 ids")
        ids = ids.astype(np.uint64)
    if ids.dtype != np.uint64:
        raise UserError(f"{path}: ids must be uint64, got {ids.dtype}")
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) != len(ids):
        raise UserError(f"{path}: id {int(unique[counts > 1][0])} appears more than once")
    return ids


def _column(
    given: np.ndarray | None, n: int, dtype: type, default: float, *, name: str, path: Path
) -> np.ndarray:
    if given is None:
        return np.full(n, default, dtype=dtype)
    column = np.asarray(given)
    if column.shape != (n,):
        raise UserError(f"{path}: {name} must be [{n}], got {list(column.shape)}")
    return column.astype(dtype)
