"""Random request batches and self-describing rows, shared by the pooling tests of serving and training."""

from __future__ import annotations

import numpy as np

from kelp.config import FeatureSpec
from kelp.consumers.batch import JaggedIds, MicroBatch


def random_batch(
    spec: FeatureSpec, rng: np.random.Generator, b: int, *, one_hot_only: bool = False
) -> MicroBatch:
    """``b`` samples of ids in [0, 6): one per feature (one_hot_only or max_ids 1), else 0..max_ids."""
    sparse: dict[str, JaggedIds] = {}
    for f in spec.sparse:
        if f.max_ids == 1 or one_hot_only:
            sparse[f.name] = JaggedIds.one_hot(rng.integers(0, 6, b).astype(np.uint64))
        else:
            lengths = rng.integers(0, f.max_ids + 1, b)
            values = rng.integers(0, 6, int(lengths.sum())).astype(np.uint64)
            sparse[f.name] = JaggedIds.from_lengths(values, lengths)
    return MicroBatch.from_columns(
        spec, labels=np.zeros(b, np.float32), dense=np.zeros((b, 1), np.float32), sparse=sparse
    )


def tagged_rows(spec: FeatureSpec, unique: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows that identify their table and id, so a wrong index shows up in the values."""
    dims = {t.name: t.dim for t in spec.tables}
    out = {}
    for k, (table, ids) in enumerate(sorted(unique.items())):
        base = ids.astype(np.float32)[:, None] * 10 + k * 1000
        out[table] = (base + np.arange(dims[table], dtype=np.float32)).astype(np.float32)
    return out
