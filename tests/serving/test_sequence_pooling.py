"""Serving's sequence inputs (``pooling: none``) equal the trainer's, bit for bit, beside the pooled ones.

Sequence features sit on a table shared with a pooled feature, on a table of
their own, and among tables of two widths, so the index arithmetic of
:meth:`~kelp.serving.pooling.PoolPlan.sequences` (each table's offset in the
request's one index space) is exercised; histories are empty, repeated and
one id long.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kelp.config import FeatureSpec
from kelp.consumers.batch import JaggedIds, MicroBatch
from kelp.serving.pooling import PoolPlan
from kelp.trainer.embedding import BatchTensors, gather_sequences, pool_features

from .pooling_inputs import random_batch, tagged_rows

CPU = torch.device("cpu")


def _spec() -> FeatureSpec:
    return FeatureSpec.model_validate(
        {
            "dense": [{"name": "I1"}],
            "sparse": [
                {"name": "A", "table": "wide"},
                {"name": "H1", "table": "wide", "max_ids": 5, "pooling": "none"},
                {"name": "C", "table": "narrow", "max_ids": 3, "pooling": "mean"},
                {"name": "H2", "table": "clicks", "max_ids": 4, "pooling": "none"},
                {"name": "E", "table": "narrow2"},
            ],
            "tables": [
                {"name": "wide", "dim": 8},
                {"name": "narrow", "dim": 4},
                {"name": "clicks", "dim": 4},
                {"name": "narrow2", "dim": 4},
            ],
        }
    )


@pytest.mark.parametrize("b", [1, 7, 50])
def test_sequence_and_pooled_inputs_equal_the_trainers(b: int) -> None:
    spec = _spec()
    plan = PoolPlan(spec)
    batch = random_batch(spec, np.random.default_rng(b), b)
    ids = plan.dedup(batch)
    rows = tagged_rows(spec, ids.unique)
    leaves = {t: torch.from_numpy(r) for t, r in rows.items()}
    bt = BatchTensors.from_batch(batch, spec, CPU)

    pooled = plan.pool(batch, ids, rows)
    want_pooled = pool_features(bt, leaves)
    assert len(pooled) == len(want_pooled) == 3  # A, C, E: the sequences are not pooled
    for got, want in zip(pooled, want_pooled, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)

    sequences = plan.sequences(batch, ids, rows)
    want_sequences = gather_sequences(bt, leaves)
    assert list(sequences) == list(want_sequences) == ["H1", "H2"]
    for name, got in sequences.items():
        torch.testing.assert_close(got.values, want_sequences[name].values, rtol=0, atol=0)
        assert torch.equal(got.offsets, want_sequences[name].offsets)
        jagged = batch.sparse[name]
        table = spec.sparse_table(name)
        expected = rows[table][np.searchsorted(ids.unique[table], jagged.values)]
        np.testing.assert_array_equal(got.values.numpy(), expected)


def test_a_plan_without_sequences_gathers_none() -> None:
    spec = FeatureSpec.model_validate({"sparse": [{"name": "A"}]})
    plan = PoolPlan(spec)
    batch = MicroBatch.from_columns(
        spec,
        labels=np.zeros(2, np.float32),
        dense=np.zeros((2, 0), np.float32),
        sparse={"A": JaggedIds.one_hot(np.array([1, 2], np.uint64))},
    )
    ids = plan.dedup(batch)
    assert plan.sequence_features == [] and plan.sequences(batch, ids, {}) == {}
