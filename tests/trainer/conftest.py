"""Shared helpers for the trainer tests: small specs, a dict-of-arrays store, synthetic batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kelp.bench.baseline import InitFn
from kelp.config import DenseFeature, FeatureSpec, SparseFeature, TableSpec, TrainerConfig
from kelp.consumers.batch import JaggedIds, MicroBatch


@dataclass(frozen=True)
class Pulled:
    rows: np.ndarray
    state: np.ndarray
    admitted: np.ndarray
    admitted_now: np.ndarray | None = None


class DictStore:
    """The simplest correct store: one dict per table, id -> (row, state); admits everything by default.

    ``admit`` optionally decides admission per id (a not-admitted id reads its init row and
    its pushes are rejected, as the store's admission contract says).
    """

    def __init__(self, init_fn: InitFn, initial_state: float = 0.0, admit=None) -> None:  # type: ignore[no-untyped-def]
        self.init_fn = init_fn
        self.initial_state = initial_state
        self.admit = admit
        self.rows: dict[str, dict[int, tuple[np.ndarray, float]]] = {}

    def pull(self, table: str, ids: np.ndarray) -> Pulled:
        stored = self.rows.setdefault(table, {})
        init = self.init_fn(table, ids)
        state = np.full(ids.size, self.initial_state, dtype=np.float32)
        admitted = np.ones(ids.size, dtype=bool)
        for i, key in enumerate(ids.tolist()):
            if self.admit is not None and not self.admit(table, key):
                admitted[i] = False
            elif key in stored:
                init[i], state[i] = stored[key]
        return Pulled(init, state, admitted)

    def pull_many(self, batch: MicroBatch) -> dict[str, Pulled]:
        return {t: self.pull(t, ids.unique_ids) for t, ids in batch.tables.items()}

    def push(self, table: str, ids: np.ndarray, rows: np.ndarray, state: np.ndarray) -> None:
        stored = self.rows.setdefault(table, {})
        for key, row, s in zip(ids.tolist(), rows, state.tolist(), strict=True):
            if self.admit is not None and not self.admit(table, key):
                raise AssertionError(f"pushed not-admitted id {key}")
            stored[key] = (row.copy(), s)


def small_spec(n_dense: int = 3, dims: tuple[int, ...] = (4, 4, 8), pooling: str = "sum") -> FeatureSpec:
    """Sparse features f0..: f0 and f1 share table ``shared`` (multi-hot), the rest have their own."""
    sparse = []
    tables = []
    for i, dim in enumerate(dims):
        table = "shared" if i < 2 else f"t{i}"
        if i != 1:
            tables.append(TableSpec(name=table, dim=dim))
        sparse.append(SparseFeature(name=f"f{i}", table=table, max_ids=4, pooling=pooling))
    return FeatureSpec(
        dense=[DenseFeature(name=f"d{i}") for i in range(n_dense)], sparse=sparse, tables=tables
    )


def small_config(**overrides) -> TrainerConfig:  # type: ignore[no-untyped-def]
    base = {"bottom_mlp": [8, 4], "top_mlp": [16, 8], "device": "cpu"}
    base.update(overrides)
    return TrainerConfig(**base)


def random_batch(spec: FeatureSpec, b: int, rng: np.random.Generator, n_ids: int = 30) -> MicroBatch:
    """A multi-hot batch (0..3 ids per sample, so some empty bags) with a learnable label."""
    sparse: dict[str, JaggedIds] = {}
    signal = np.zeros(b)
    for feature in spec.sparse:
        lengths = rng.integers(0, 4, size=b)
        values = rng.integers(0, n_ids, size=int(lengths.sum())).astype(np.uint64)
        sparse[feature.name] = JaggedIds.from_lengths(values, lengths)
        owner = np.repeat(np.arange(b), lengths)
        np.add.at(signal, owner, np.where(values % 2 == 0, 1.0, -1.0))
    dense = rng.normal(size=(b, len(spec.dense))).astype(np.float32)
    logit = signal + (dense[:, 0] if len(spec.dense) else 0.0)
    labels = (rng.random(b) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return MicroBatch.from_columns(spec, labels=labels, dense=dense, sparse=sparse)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def model_input(dense, pooled):  # type: ignore[no-untyped-def]
    """A :class:`ModelInput` for :func:`small_spec` models: ``pooled[i]`` is feature ``f{i}``'s vector."""
    from kelp.trainer import ModelInput

    return ModelInput(dense, {f"f{i}": p for i, p in enumerate(pooled)})
