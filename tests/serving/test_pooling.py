"""Serving's one-sort dedup and fused pooling give the trainer's pooled inputs, bit for bit.

:class:`~kelp.serving.pooling.PoolPlan` replaces ``MicroBatch.tables`` +
``BatchTensors.from_batch`` + ``pool_features`` on the scoring path for speed;
these tests hold it to the trainer's results on batches that exercise every
branch: one-hot and multi-hot features, empty bags, a table shared by two
features, tables of different widths, ids repeated across and within features.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from kelp.config import FeatureSpec
from kelp.consumers.batch import JaggedIds, MicroBatch
from kelp.serving.pooling import PoolPlan
from kelp.trainer.embedding import BatchTensors, pool_features

from .pooling_inputs import random_batch, tagged_rows


def _spec() -> FeatureSpec:
    return FeatureSpec.model_validate(
        {
            "dense": [{"name": "I1"}],
            "sparse": [
                {"name": "A", "table": "wide"},
                {"name": "B", "table": "wide", "max_ids": 4, "pooling": "mean"},
                {"name": "C", "table": "narrow"},
                {"name": "D", "table": "narrow2", "max_ids": 3},
                {"name": "E", "table": "wide2"},
            ],
            "tables": [
                {"name": "wide", "dim": 8},
                {"name": "narrow", "dim": 4},
                {"name": "narrow2", "dim": 4},
                {"name": "wide2", "dim": 8},
            ],
        }
    )


def _one_table_each_spec() -> FeatureSpec:
    """One table per feature, one width: the features laid out table by table are in config order."""
    return FeatureSpec.model_validate(
        {
            "dense": [{"name": "I1"}],
            "sparse": [
                {"name": "A", "table": "a"},
                {"name": "B", "table": "b", "max_ids": 4, "pooling": "mean"},
                {"name": "C", "table": "c"},
            ],
            "tables": [{"name": t, "dim": 8} for t in ("a", "b", "c")],
        }
    )


@pytest.mark.parametrize(("make_spec", "in_order"), [(_spec, False), (_one_table_each_spec, True)])
@pytest.mark.parametrize("one_hot_only", [True, False])
@pytest.mark.parametrize("b", [1, 7, 50])
def test_pooled_inputs_equal_the_trainers(
    b: int, one_hot_only: bool, make_spec: Callable[[], FeatureSpec], in_order: bool
) -> None:
    spec = make_spec()
    plan = PoolPlan(spec)
    assert plan.in_order is in_order  # both layouts of the dedup's inverse are checked
    rng = np.random.default_rng(b)
    batch = random_batch(spec, rng, b, one_hot_only=one_hot_only)

    ids = plan.dedup(batch)
    for table, t in batch.tables.items():
        np.testing.assert_array_equal(ids.unique[table], t.unique_ids)
    rows = tagged_rows(spec, ids.unique)
    got = plan.pool(batch, ids, rows)

    bt = BatchTensors.from_batch(batch, spec, torch.device("cpu"))
    want = pool_features(bt, {t: torch.from_numpy(r) for t, r in rows.items()})
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    if one_hot_only:
        assert all(ids.one_hot)  # so the fused gather, not embedding_bag, produced every feature


def test_b_ids_in_uneven_bags_are_not_taken_for_one_hot() -> None:
    spec = _spec()
    b = 3
    sparse = {f.name: JaggedIds.one_hot(np.arange(b, dtype=np.uint64)) for f in spec.sparse}
    sparse["B"] = JaggedIds.from_lengths(np.array([1, 2, 3], np.uint64), np.array([2, 0, 1]))
    batch = MicroBatch.from_columns(
        spec, labels=np.zeros(b, np.float32), dense=np.zeros((b, 1), np.float32), sparse=sparse
    )
    plan = PoolPlan(spec)
    ids = plan.dedup(batch)
    assert ids.one_hot == [True, False, True, True, True]
    rows = tagged_rows(spec, ids.unique)
    pooled = plan.pool(batch, ids, rows)
    wide = rows["wide"]
    position = {int(v): i for i, v in enumerate(ids.unique["wide"])}
    torch.testing.assert_close(pooled[1][0], torch.from_numpy((wide[position[1]] + wide[position[2]]) / 2))
    assert not pooled[1][1].any()  # an empty bag pools to zeros
