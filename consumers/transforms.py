"""Dense-feature transforms, applied column-wise to a whole chunk at once.

Order per feature (config ``features.dense[j]``): missing values were already
replaced by ``default`` during decoding, then ``transforms`` apply in the
listed order. ``log1p`` of a value below -1 gives NaN and of -1 gives -inf;
the decoder re-checks finiteness afterwards and rejects such rows as
``bad_dense`` (put a ``clip: {min: 0}`` first for count-like features).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kelp.config import ClipTransform, DenseFeature, Log1pTransform, StandardizeTransform

__all__ = ["apply_transforms", "defaults_of"]


def defaults_of(features: Sequence[DenseFeature]) -> np.ndarray:
    """float32[n_dense]: each feature's ``default``."""
    return np.array([f.default for f in features], dtype=np.float32)


def apply_transforms(dense: np.ndarray, features: Sequence[DenseFeature]) -> np.ndarray:
    """Transform ``dense`` float32[B, n_dense] in place (column j by ``features[j].transforms``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        for j, feature in enumerate(features):
            if not feature.transforms:
                continue
            col = dense[:, j]
            for t in feature.transforms:
                if isinstance(t, Log1pTransform):
                    np.log1p(col, out=col)
                elif isinstance(t, ClipTransform):
                    if t.min is None and t.max is None:
                        continue
                    np.clip(col, t.min, t.max, out=col)
                elif isinstance(t, StandardizeTransform):
                    col -= np.float32(t.mean)
                    col /= np.float32(t.std)
                else:  # pragma: no cover - the config union is closed
                    raise TypeError(f"unknown transform {t!r}")
    return dense
