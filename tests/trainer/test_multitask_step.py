"""Several labels and sample weights through the trainer's step: a loss per task, weighted samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from kelp.bench.baseline import spec_init
from kelp.config import DenseFeature, FeatureSpec, SparseFeature, TableSpec
from kelp.consumers.batch import JaggedIds, MicroBatch
from kelp.trainer import ModelContractError, ModelInput, ModelSpec, ProgressiveValidator
from kelp.trainer.evaluation import log_loss_from_logits
from kelp.trainer.step import TrainStep

from .conftest import DictStore, small_config

CPU = torch.device("cpu")


def two_task_spec() -> FeatureSpec:
    return FeatureSpec(
        labels=[{"name": "click"}, {"name": "buy", "loss_weight": 0.5}],
        dense=[DenseFeature(name="d0"), DenseFeature(name="d1")],
        sparse=[SparseFeature(name="item", table="items")],
        tables=[TableSpec(name="items", dim=4)],
    )


class TwoHeads(nn.Module):
    """A tiny model with one logit head per task, over dense features and the pooled item vector."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        width = len(spec.dense) + sum(spec.sparse.values())
        self.tasks = spec.tasks
        self.heads = nn.ModuleDict({t: nn.Linear(width, 1) for t in spec.tasks})

    def forward(self, batch: ModelInput) -> dict[str, Tensor]:
        x = torch.cat([batch.dense, *batch.sparse.values()], dim=1)
        return {t: self.heads[t](x).squeeze(1) for t in self.tasks}


def two_task_batch(spec: FeatureSpec, b: int, rng: np.random.Generator, weight=None) -> MicroBatch:  # type: ignore[no-untyped-def]
    """click follows d0, buy follows d1: each label is learnable from its own feature."""
    dense = rng.normal(size=(b, 2)).astype(np.float32)
    items = rng.integers(0, 20, size=b).astype(np.uint64)
    return MicroBatch.from_columns(
        spec,
        labels=(dense[:, 0] > 0).astype(np.float32),
        extra_labels={"buy": (dense[:, 1] > 0).astype(np.float32)},
        dense=dense,
        sparse={"item": items},
        weight=weight,
    )


def make_step(spec: FeatureSpec, seed: int = 0) -> TrainStep:
    torch.manual_seed(seed)
    model = TwoHeads(ModelSpec.from_features(spec))
    config = small_config(dense_optimizer={"kind": "adam", "lr": 0.05})
    return TrainStep(model, spec, config, CPU, validator=ProgressiveValidator(window_batches=4))


def test_both_tasks_losses_go_down_and_each_task_is_scored() -> None:
    spec = two_task_spec()
    rng = np.random.default_rng(7)
    batch = two_task_batch(spec, 256, rng)
    step = make_step(spec)
    store = DictStore(spec_init(spec))
    losses: dict[str, list[float]] = {"click": [], "buy": []}
    for _ in range(40):
        result = step(batch, store.pull_many(batch))
        assert result.skipped is None
        assert set(result.task_logits) == {"click", "buy"}
        np.testing.assert_array_equal(result.logits, result.task_logits["click"])
        for task, labels in (("click", batch.labels), ("buy", batch.extra_labels["buy"])):
            losses[task].append(float(log_loss_from_logits(labels, result.task_logits[task]).mean()))
        for table, update in result.updates.items():
            store.push(table, *update)
    for task, curve in losses.items():
        assert curve[-1] < 0.8 * curve[0], (task, curve[0], curve[-1])
    results = step.task_validators.results()  # type: ignore[union-attr]
    assert list(results) == ["click", "buy"]
    for cumulative, window in results.values():
        assert cumulative.samples == 40 * 256 and window.auc > 0.9


def test_zero_weight_samples_change_nothing_compared_to_dropping_them() -> None:
    spec = two_task_spec()
    rng = np.random.default_rng(3)
    full = two_task_batch(spec, 64, rng, weight=np.where(np.arange(64) % 3 == 0, 0.0, 1.0))
    keep = full.weights() > 0
    items = full.sparse["item"]
    dropped = MicroBatch.from_columns(
        spec,
        labels=full.labels[keep],
        extra_labels={"buy": full.extra_labels["buy"][keep]},
        dense=full.dense[keep],
        sparse={"item": JaggedIds.one_hot(items.values[keep])},
    )
    a, b = make_step(spec), make_step(spec)
    store_a, store_b = DictStore(spec_init(spec)), DictStore(spec_init(spec))
    got = a(full, store_a.pull_many(full))
    want = b(dropped, store_b.pull_many(dropped))
    assert got.loss == pytest.approx(want.loss, rel=1e-6)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, msg=name)
    # Ids seen only in zero-weight samples get no gradient; every other row moves as without them.
    ids_b, rows_b, _ = want.updates["items"]
    ids_a, rows_a, _ = got.updates["items"]
    at = np.searchsorted(ids_a, ids_b)
    np.testing.assert_allclose(rows_a[at], rows_b, rtol=1e-6, atol=1e-7)


def test_weights_scale_the_loss_of_their_samples() -> None:
    spec = two_task_spec()
    rng = np.random.default_rng(5)
    plain = two_task_batch(spec, 32, rng)
    doubled = MicroBatch.from_columns(
        spec,
        labels=plain.labels,
        extra_labels=plain.extra_labels,
        dense=plain.dense,
        sparse={"item": plain.sparse["item"].values},
        weight=np.where(np.arange(32) < 16, 3.0, 1.0),
    )
    a, b = make_step(spec), make_step(spec)
    got_plain = a(plain, DictStore(spec_init(spec)).pull_many(plain))
    got_weighted = b(doubled, DictStore(spec_init(spec)).pull_many(doubled))
    assert got_plain.loss != pytest.approx(got_weighted.loss, rel=1e-4)
    z = got_weighted.task_logits
    w = doubled.weights().astype(np.float64)
    click = (w * log_loss_from_logits(doubled.labels, z["click"])).sum() / w.sum()
    buy = (w * log_loss_from_logits(doubled.extra_labels["buy"], z["buy"])).sum() / w.sum()
    assert got_weighted.loss == pytest.approx(click + 0.5 * buy, rel=1e-5)


def test_a_single_tensor_output_for_several_tasks_is_a_contract_error_on_every_sample() -> None:
    spec = two_task_spec()

    class OneHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 1)

        def forward(self, batch: ModelInput) -> Tensor:
            return self.lin(batch.dense).squeeze(1)

    step = TrainStep(OneHead(), spec, small_config(), CPU)
    batch = two_task_batch(spec, 8, np.random.default_rng(0))
    result = step(batch, DictStore(spec_init(spec)).pull_many(batch))
    # Nothing trains; the daemon dead-letters or, batch after batch, stops on it (docs/trainer.md).
    assert result.skipped == "model_error" and result.failed_samples == 8
    assert all(p.error.startswith(ModelContractError.__name__) for p in result.model_errors)
    assert all("click" in p.error for p in result.model_errors)


def test_a_nonfinite_label_of_any_task_skips_the_step_and_scores_nothing() -> None:
    spec = two_task_spec()
    batch = two_task_batch(spec, 16, np.random.default_rng(2))
    batch.extra_labels["buy"][3] = np.nan
    step = make_step(spec)
    before = [p.detach().clone() for p in step.model.parameters()]
    result = step(batch, DictStore(spec_init(spec)).pull_many(batch))
    assert result.skipped == "nonfinite_loss" and result.updates == {}
    for p, q in zip(step.model.parameters(), before, strict=True):
        assert torch.equal(p, q)
    assert all(c.samples == 0 for c, _ in step.task_validators.results().values())  # type: ignore[union-attr]
