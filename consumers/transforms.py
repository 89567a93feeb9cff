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
    """Transform ``dense`` float32[B, n_dense] in place (column j by ``features[j].transforms``).

    Columns whose transform chains are equal are transformed together, a few
    numpy calls on their sub-matrix instead of a few per column: the usual spec
    gives every count-like feature the same ``clip``/``log1p`` chain, and a
    serving request's 100 rows cost far less than the per-call overhead.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        for columns, chain in _groups(features):
            if len(columns) == 1:
                _apply_chain(dense[:, columns[0]], chain)  # a view: transformed in place
            else:
                block = dense[:, columns]
                _apply_chain(block, chain)
                dense[:, columns] = block
    return dense


Chain = tuple[ClipTransform | Log1pTransform | StandardizeTransform, ...]
_GROUPS: dict[int, tuple[Sequence[DenseFeature], list[tuple[np.ndarray, Chain]]]] = {}


def _groups(features: Sequence[DenseFeature]) -> list[tuple[np.ndarray, Chain]]:
    """The columns of each distinct transform chain, worked out once per feature list (a spec's
    list lives as long as the spec; the cache holds it, so its id cannot be reused)."""
    cached = _GROUPS.get(id(features))
    if cached is not None and cached[0] is features:
        return cached[1]
    by_chain: dict[str, tuple[list[int], Chain]] = {}
    for j, feature in enumerate(features):
        chain = tuple(t for t in feature.transforms if not _is_noop(t))
        if chain:
            key = "|".join(t.model_dump_json() for t in chain)
            by_chain.setdefault(key, ([], chain))[0].append(j)
    groups = [(np.array(cols, dtype=np.intp), chain) for cols, chain in by_chain.values()]
    if len(_GROUPS) < 64:  # a handful of specs per process; never grows without bound
        _GROUPS[id(features)] = (features, groups)
    return groups


def _is_noop(t: object) -> bool:
    return isinstance(t, ClipTransform) and t.min is None and t.max is None


def _apply_chain(values: np.ndarray, chain: Chain) -> None:
    for t in chain:
        if isinstance(t, Log1pTransform):
            np.log1p(values, out=values)
        elif isinstance(t, ClipTransform):
            np.clip(values, t.min, t.max, out=values)
        elif isinstance(t, StandardizeTransform):
            values -= np.float32(t.mean)
            values /= np.float32(t.std)
        else:  # pragma: no cover - the config union is closed
            raise TypeError(f"unknown transform {t!r}")
