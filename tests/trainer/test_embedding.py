from __future__ import annotations

import numpy as np
import pytest
import torch

from kelp.consumers.batch import MicroBatch
from kelp.trainer.embedding import BatchTensors, pool_features, rows_to_leaf

from .conftest import random_batch, small_spec

CPU = torch.device("cpu")


def _naive_pool(batch: MicroBatch, table_rows: dict[str, dict[int, np.ndarray]], spec) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    out = []
    for feature in spec.sparse:
        jag = batch.sparse[feature.name]
        dim = spec.table(feature.table_name).dim
        pooled = np.zeros((batch.size, dim), dtype=np.float64)
        for i in range(batch.size):
            ids = jag.values[jag.offsets[i] : jag.offsets[i + 1]].tolist()
            for key in ids:
                pooled[i] += table_rows[feature.table_name][key]
            if ids and feature.pooling == "mean":
                pooled[i] /= len(ids)
        out.append(pooled)
    return out


def _rows_for(batch: MicroBatch, spec, rng: np.random.Generator):  # type: ignore[no-untyped-def]
    arrays, by_id = {}, {}
    for table, ids in batch.tables.items():
        rows = rng.normal(size=(ids.unique_ids.size, spec.table(table).dim)).astype(np.float32)
        arrays[table] = rows
        by_id[table] = dict(zip(ids.unique_ids.tolist(), rows.astype(np.float64), strict=True))
    return arrays, by_id


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_pooling_matches_naive_reference(pooling: str, rng: np.random.Generator) -> None:
    spec = small_spec(pooling=pooling)
    batch = random_batch(spec, 40, rng)
    assert any((batch.sparse[f.name].lengths() == 0).any() for f in spec.sparse)  # empty bags present
    arrays, by_id = _rows_for(batch, spec, rng)
    bt = BatchTensors.from_batch(batch, spec, CPU)
    leaves = {t: rows_to_leaf(a, CPU) for t, a in arrays.items()}
    pooled = pool_features(bt, leaves)
    for got, want in zip(pooled, _naive_pool(batch, by_id, spec), strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_row_gradients_match_naive(pooling: str, rng: np.random.Generator) -> None:
    """d/d rows of sum_b <pooled_f[b], w_f[b]>: each occurrence of an id adds w_f[b] (/ bag size for mean)."""
    spec = small_spec(pooling=pooling)
    batch = random_batch(spec, 12, rng, n_ids=6)
    arrays, _ = _rows_for(batch, spec, rng)
    bt = BatchTensors.from_batch(batch, spec, CPU)
    leaves = {t: rows_to_leaf(a, CPU) for t, a in arrays.items()}
    pooled = pool_features(bt, leaves)
    weights = [torch.randn(p.shape, dtype=torch.float32) for p in pooled]
    sum((p * w).sum() for p, w in zip(pooled, weights, strict=True)).backward()

    expected = {t: np.zeros_like(a, dtype=np.float64) for t, a in arrays.items()}
    for feature, w in zip(spec.sparse, weights, strict=True):
        table = batch.tables[feature.table_name]
        position = {key: i for i, key in enumerate(table.unique_ids.tolist())}
        jag = batch.sparse[feature.name]
        for b in range(batch.size):
            ids = jag.values[jag.offsets[b] : jag.offsets[b + 1]].tolist()
            for key in ids:
                scale = 1.0 / len(ids) if pooling == "mean" else 1.0
                expected[feature.table_name][position[key]] += w[b].numpy() * scale
    for table, leaf in leaves.items():
        np.testing.assert_allclose(leaf.grad.numpy(), expected[table], rtol=1e-5, atol=1e-6)


def test_one_hot_features_use_a_gather_with_same_values(rng: np.random.Generator) -> None:
    spec = small_spec()
    b = 8
    sparse = {f.name: rng.integers(0, 5, size=b).astype(np.uint64) for f in spec.sparse}
    batch = MicroBatch.from_columns(spec, labels=np.zeros(b), dense=np.zeros((b, 3)), sparse=sparse)
    bt = BatchTensors.from_batch(batch, spec, CPU)
    assert all(bag.offsets is None for bag in bt.bags)
    arrays, by_id = _rows_for(batch, spec, rng)
    pooled = pool_features(bt, {t: rows_to_leaf(a, CPU) for t, a in arrays.items()})
    for got, want in zip(pooled, _naive_pool(batch, by_id, spec), strict=True):
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-6)


def test_feature_absent_from_whole_batch_pools_zeros(rng: np.random.Generator) -> None:
    spec = small_spec()
    b = 4
    batch = MicroBatch.from_columns(
        spec, labels=np.zeros(b), dense=np.zeros((b, 3)), sparse={"f0": np.arange(b, dtype=np.uint64)}
    )
    arrays, _ = _rows_for(batch, spec, rng)
    assert arrays["t2"].shape == (0, 8)
    bt = BatchTensors.from_batch(batch, spec, CPU)
    pooled = pool_features(bt, {t: rows_to_leaf(a, CPU) for t, a in arrays.items()})
    assert pooled[2].shape == (b, 8) and not pooled[2].any()
