"""Rows exactly as a store holds them: what a snapshot writes and a restore or import loads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["StoredRows"]


@dataclass(frozen=True)
class StoredRows:
    """A block of one table's rows with everything a store keeps per row.

    A snapshot must bring back the row's optimizer state and the metadata that
    eviction reads (access count for LFU, last update for TTL), not only the
    embedding, or a restored store would train and evict differently from the
    one it was taken from.
    """

    ids: np.ndarray
    """uint64[n] row ids (a string id is already hashed by the one id rule)."""
    rows: np.ndarray
    """[n, dim] embeddings, in the table's storage dtype (float32 or float16)."""
    state: np.ndarray
    """float32[n] row-wise Adagrad accumulator."""
    access_count: np.ndarray
    """uint32[n] access count (LFU eviction reads it)."""
    updated_s: np.ndarray
    """uint32[n] last update, unix seconds (TTL eviction reads it)."""

    def __post_init__(self) -> None:
        n = len(self.ids)
        for name in ("rows", "state", "access_count", "updated_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"StoredRows.{name} has {len(getattr(self, name))} entries for {n} ids")

    def __len__(self) -> int:
        return len(self.ids)

    def part(self, keep: slice | np.ndarray) -> StoredRows:
        """Rows ``keep`` of this block (a slice, positions or a mask)."""
        return StoredRows(
            ids=self.ids[keep],
            rows=self.rows[keep],
            state=self.state[keep],
            access_count=self.access_count[keep],
            updated_s=self.updated_s[keep],
        )

    @classmethod
    def concat(cls, blocks: list[StoredRows]) -> StoredRows:
        """One block of ``blocks``' rows, in order (blocks of one table)."""
        if len(blocks) == 1:
            return blocks[0]
        return cls(
            ids=np.concatenate([b.ids for b in blocks]),
            rows=np.concatenate([b.rows for b in blocks]),
            state=np.concatenate([b.state for b in blocks]),
            access_count=np.concatenate([b.access_count for b in blocks]),
            updated_s=np.concatenate([b.updated_s for b in blocks]),
        )

    @classmethod
    def empty(cls, dim: int, dtype: str = "float32") -> StoredRows:
        return cls(
            ids=np.empty(0, np.uint64),
            rows=np.empty((0, dim), np.dtype(dtype)),
            state=np.empty(0, np.float32),
            access_count=np.empty(0, np.uint32),
            updated_s=np.empty(0, np.uint32),
        )
