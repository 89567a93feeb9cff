"""A step on rows handed over as tensors (a working copy's gather) trains exactly as on numpy rows:
warm-started fallback rows, ids not admitted, a model that fails on some samples, on-device updates."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from kelp.config import DenseFeature, FeatureSpec, SparseFeature, TableSpec, TrainerConfig
from kelp.consumers.batch import MicroBatch
from kelp.store.base import PullResult
from kelp.store.memory import MemoryStore
from kelp.trainer.models import build_model
from kelp.trainer.step import StepResult, TrainStep

CPU = torch.device("cpu")
INIT = {"kind": "normal", "std": 0.3, "seed": 1}


def _spec() -> FeatureSpec:
    admission = {"min_count": 2, "fallback_buckets": 3, "fallback_warm_start": True}
    return FeatureSpec(
        dense=[DenseFeature(name="d")],
        sparse=[SparseFeature(name="user"), SparseFeature(name="item")],
        tables=[
            TableSpec(name="user", dim=4, init=INIT, admission=admission),
            TableSpec(name="item", dim=4, init=INIT),
        ],
    )


def _batch(spec: FeatureSpec, users: list[int], items: list[int]) -> MicroBatch:
    n = len(users)
    return MicroBatch.from_columns(
        spec,
        labels=np.arange(n, dtype=np.float32) % 2,
        dense=np.linspace(-0.5, 0.5, n, dtype=np.float32)[:, None],
        sparse={"user": np.array(users, np.uint64), "item": np.array(items, np.uint64)},
    )


class _FailsOnNegativeDense(nn.Module):
    """The built-in model, raising on any sample whose dense value is below -0.9 (one of the batch)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):  # type: ignore[no-untyped-def]
        if bool((x.dense < -0.9).any()):
            raise ValueError("a sample this model cannot take")
        return self.inner(x)


def _step(spec: FeatureSpec, on_device: bool) -> TrainStep:
    torch.manual_seed(0)
    cfg = TrainerConfig(bottom_mlp=[4, 4], top_mlp=[8], device="cpu")
    step = TrainStep(_FailsOnNegativeDense(build_model(spec, cfg)), spec, cfg, CPU)
    step.sparse_optimizer = dataclasses.replace(step.sparse_optimizer, on_device=on_device)
    return step


def _as_tensors(pulled: Mapping[str, PullResult]) -> dict[str, PullResult]:
    return {
        t: dataclasses.replace(
            p, rows=torch.from_numpy(p.rows.copy()), state=torch.from_numpy(p.state.copy())
        )
        for t, p in pulled.items()
    }


def _numpy(values: object) -> np.ndarray:
    return values.numpy() if isinstance(values, torch.Tensor) else np.asarray(values)


def test_tensor_rows_train_as_numpy_rows_do() -> None:
    spec = _spec()
    store = MemoryStore(spec.store_tables())
    first = _batch(spec, [1, 2, 3, 1], [10, 11, 12, 10])
    second = _batch(spec, [1, 2, 4, 5, 1], [10, 13, 12, 14, 10])  # user 1 and 2 admitted now (warm start)
    for batch in (first, second):
        plan = _step(spec, False).pull_plan(batch)
        occurrences = {
            t: np.bincount(x.inverse, minlength=len(x.unique_ids)) for t, x in batch.tables.items()
        }
        pulled = store.pull_many(plan.ids, occurrences=occurrences)
        results: list[StepResult] = []
        for on_device, given in ((False, pulled), (True, _as_tensors(pulled))):
            results.append(_step(spec, on_device)(batch, given, plan=plan))
        numpy_result, tensor_result = results
        assert not numpy_result.model_errors and numpy_result.skipped is None
        assert tensor_result.loss == numpy_result.loss
        assert set(tensor_result.updates) == set(numpy_result.updates)
        for table, update in numpy_result.updates.items():
            got = tensor_result.updates[table]
            assert isinstance(got.rows, torch.Tensor) and isinstance(got.state, torch.Tensor)
            np.testing.assert_array_equal(got.ids, update.ids)
            np.testing.assert_array_equal(_numpy(got.rows), update.rows)
            np.testing.assert_array_equal(_numpy(got.state), update.state)
        store.push_many(numpy_result.updates)
    assert any(p.admitted_now is not None and p.admitted_now.any() for p in pulled.values())


def test_a_model_error_is_isolated_the_same_way_on_tensor_rows() -> None:
    spec = _spec()
    store = MemoryStore(spec.store_tables())
    batch = MicroBatch.from_columns(
        spec,
        labels=np.array([0, 1, 0, 1], np.float32),
        dense=np.array([[-1.0], [0.1], [0.2], [0.3]], np.float32),  # sample 0 makes the model raise
        sparse={"user": np.array([1, 2, 3, 4], np.uint64), "item": np.array([10, 11, 12, 13], np.uint64)},
    )
    plan = _step(spec, False).pull_plan(batch)
    pulled = store.pull_many(plan.ids)
    numpy_result = _step(spec, False)(batch, pulled, plan=plan)
    tensor_result = _step(spec, True)(batch, _as_tensors(pulled), plan=plan)
    assert [p.rows.tolist() for p in tensor_result.model_errors] == [[0]]
    assert [p.rows.tolist() for p in numpy_result.model_errors] == [[0]]
    assert tensor_result.loss == numpy_result.loss
    for table, update in numpy_result.updates.items():
        np.testing.assert_array_equal(_numpy(tensor_result.updates[table].rows), update.rows)
