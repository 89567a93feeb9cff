"""Validated requests -> a :class:`~kelp.consumers.batch.MicroBatch`, the type the trainer scores.

Reusing the trainer's batch type means serving pools embeddings exactly as
training did (same dedup per table, same bag offsets, same transforms):

* dense: start from each feature's ``default``, overwrite with the values
  given (null = absent), then apply the config's transforms (the consumer's
  :func:`~kelp.consumers.transforms.apply_transforms`). A value that becomes
  NaN/inf (``log1p(-2)`` without a clip) is rejected as ``bad_dense`` (422),
  as the event schema does;
* sparse: one id or a list per feature; absent, null or ``[]`` = no ids
  (the bag pools to zeros), again as in event schema v1;
* user + candidates: candidate *i* is the user's features overridden, per
  feature name, by candidate *i*'s non-null features (no concatenation of ids).
  The user's ids repeat in every row, and the batch's per-table dedup turns them
  into one store lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel

from kelp.config import FeatureSpec
from kelp.consumers.batch import JaggedIds, MicroBatch
from kelp.consumers.transforms import apply_transforms, defaults_of
from kelp.serving.errors import BadRequestError
from kelp.serving.schemas import RequestModels

__all__ = ["RequestEncoder"]


class RequestEncoder:
    """Turns validated request models into micro-batches for one feature spec."""

    def __init__(self, spec: FeatureSpec, models: RequestModels) -> None:
        self.spec = spec
        self.dense_index = {name: j for j, name in enumerate(models.dense_fields)}
        self.sparse_index = {name: i for i, name in enumerate(models.sparse_fields)}
        self.defaults = defaults_of(spec.dense)
        self.sparse_names = [f.name for f in spec.sparse]

    def _given(self, features: BaseModel) -> tuple[dict[int, float], dict[int, list[int]]]:
        """Non-null dense values and sparse id lists of one sample, by column index."""
        dense = {self.dense_index[k]: v for k, v in features.dense.__dict__.items() if v is not None}  # type: ignore[attr-defined]
        sparse = {
            self.sparse_index[k]: (v if isinstance(v, list) else [v])
            for k, v in features.sparse.__dict__.items()  # type: ignore[attr-defined]
            if v is not None
        }
        return dense, sparse

    def samples(self, samples: Sequence[BaseModel]) -> MicroBatch:
        """One batch row per sample."""
        return self._batch([self._given(s) for s in samples])

    def candidates(self, user: BaseModel, candidates: Sequence[BaseModel]) -> MicroBatch:
        """One batch row per candidate: the user's features, overridden per feature by the candidate's."""
        user_dense, user_sparse = self._given(user)
        rows = []
        for c in candidates:
            dense, sparse = self._given(c)
            rows.append(({**user_dense, **dense}, {**user_sparse, **sparse}))
        return self._batch(rows)

    def _batch(self, rows: list[tuple[dict[int, float], dict[int, list[int]]]]) -> MicroBatch:
        b = len(rows)
        dense = np.tile(self.defaults, (b, 1))
        n_sparse = len(self.sparse_names)
        values: list[list[int]] = [[] for _ in range(n_sparse)]
        lengths = np.zeros((n_sparse, b), dtype=np.int32)
        with np.errstate(over="ignore", invalid="ignore"):  # 1e300 -> inf in float32: rejected below
            for r, (d, s) in enumerate(rows):
                for j, x in d.items():
                    dense[r, j] = x
                for i, ids in s.items():
                    values[i].extend(ids)
                    lengths[i, r] = len(ids)
            if dense.size:
                apply_transforms(dense, self.spec.dense)
        if dense.size:
            bad = ~np.isfinite(dense)
            if bad.any():
                r, j = (int(x[0]) for x in np.nonzero(bad))
                raise BadRequestError(
                    "bad_dense",
                    f"sample {r}: dense {self.spec.dense[j].name!r} is not finite after its transforms "
                    f"({[t.kind for t in self.spec.dense[j].transforms]})",
                )
        sparse: dict[str, Any] = {
            name: JaggedIds.from_lengths(np.array(values[i], dtype=np.uint64), lengths[i])
            for i, name in enumerate(self.sparse_names)
        }
        return MicroBatch.from_columns(self.spec, labels=np.zeros(b, np.float32), dense=dense, sparse=sparse)
