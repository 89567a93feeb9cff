"""A model that raises on some samples: the step finds them, trains the others, and applies nothing else."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from kelp.bench.baseline import spec_init
from kelp.trainer import build_model
from kelp.trainer.isolate import ModelRaisedError, isolate, probe_budget, take_rows
from kelp.trainer.step import TrainStep

from .conftest import DictStore, random_batch, small_config, small_spec

CPU = torch.device("cpu")
PLUGINS = Path(__file__).parent / "plugin_models"
MARKER = 12345.0  # tiny_models.MARKER


@pytest.fixture(autouse=True)
def plugins_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))


def test_isolate_finds_exactly_the_failing_samples_by_halving() -> None:
    bad = {3, 500, 501}
    calls: list[int] = []

    def probe(rows: np.ndarray) -> None:
        calls.append(len(rows))
        hit = bad.intersection(rows.tolist())
        if hit:
            raise ModelRaisedError(ValueError(f"sample {min(hit)}"))

    failed = isolate(1000, probe, probe_budget(1000), "ValueError: whole batch")
    assert [part.rows.tolist() for part in failed] == [[3], [500], [501]]
    assert [part.error for part in failed] == [
        "ValueError: sample 3",
        "ValueError: sample 500",
        "ValueError: sample 501",
    ]
    assert len(calls) <= probe_budget(1000)


def test_isolate_gives_up_within_its_budget_on_a_model_that_always_raises() -> None:
    calls = 0

    def probe(rows: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        raise ModelRaisedError(RuntimeError("broken"))

    failed = isolate(4096, probe, probe_budget(4096), "RuntimeError: broken")
    assert calls == probe_budget(4096)
    assert sorted(np.concatenate([p.rows for p in failed]).tolist()) == list(range(4096))  # every row, once


def test_take_rows_keeps_each_samples_ids_labels_and_dense(rng: np.random.Generator) -> None:
    spec = small_spec()
    batch = random_batch(spec, 20, rng)
    rows = np.array([0, 3, 4, 11, 19])
    sub = take_rows(batch, rows)
    np.testing.assert_array_equal(sub.labels, batch.labels[rows])
    np.testing.assert_array_equal(sub.dense, batch.dense[rows])
    for name, jag in batch.sparse.items():
        for i, row in enumerate(rows.tolist()):
            mine = sub.sparse[name].values[sub.sparse[name].offsets[i] : sub.sparse[name].offsets[i + 1]]
            theirs = jag.values[jag.offsets[row] : jag.offsets[row + 1]]
            np.testing.assert_array_equal(mine, theirs)


def _steps(reference: str) -> tuple[TrainStep, TrainStep]:
    """Two steps with the same initial weights: one to meet the odd sample, one never shown it."""
    spec = small_spec()
    config = small_config(model=reference, model_args={})
    model = build_model(spec, config)
    return TrainStep(model, spec, config, CPU), TrainStep(copy.deepcopy(model), spec, config, CPU)


def test_a_sample_the_model_raises_on_is_left_out_and_the_rest_train_exactly(
    rng: np.random.Generator,
) -> None:
    step, reference = _steps("tiny_models:raises_on_marked")
    batch = random_batch(small_spec(), 32, rng)
    batch.dense[5, 0] = MARKER
    store = DictStore(spec_init(small_spec()))
    result = step(batch, store.pull_many(batch))

    (part,) = result.model_errors
    assert part.rows.tolist() == [5] and result.failed_samples == 1
    assert part.error.startswith(
        "ValueError: cannot score a sample with dense value 12345.0 (tiny_models.py:"
    )
    assert result.skipped is None and result.logits.shape == (31,)

    good = take_rows(batch, np.setdiff1d(np.arange(32), [5]))
    expected = reference(good, store.pull_many(good))
    assert result.loss == pytest.approx(expected.loss, rel=1e-6)
    for p, q in zip(step.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(p, q)  # the same update as a batch without the odd sample
    assert result.updates.keys() == expected.updates.keys()
    for table, update in result.updates.items():  # ids only the odd sample had are not pushed
        np.testing.assert_array_equal(update.ids, expected.updates[table].ids)
        np.testing.assert_allclose(update.rows, expected.updates[table].rows, rtol=1e-6)


def test_a_model_that_raises_on_every_sample_applies_nothing(rng: np.random.Generator) -> None:
    step, _ = _steps("tiny_models:always_raises")
    before = [p.detach().clone() for p in step.model.parameters()]
    batch = random_batch(small_spec(), 16, rng)
    result = step(batch, DictStore(spec_init(small_spec())).pull_many(batch))
    assert result.skipped == "model_error" and result.updates == {}
    assert result.failed_samples == 16
    assert all(part.error.startswith("RuntimeError: model is broken") for part in result.model_errors)
    for p, q in zip(step.model.parameters(), before, strict=True):
        assert torch.equal(p, q) and p.grad is None
    assert not step.optimizer.state  # no optimizer step was taken
    assert step.skips.total == 0  # not a non-finite skip: the daemon handles model errors


class _Flaky(torch.nn.Module):
    """A working model that raises on more than ``limit`` samples, and on its first ``times`` forwards."""

    def __init__(self, inner: torch.nn.Module, *, limit: int | None = None, times: int = 0) -> None:
        super().__init__()
        self.inner = inner
        self.limit = limit
        self.times = times

    def forward(self, batch):  # type: ignore[no-untyped-def]
        if self.limit is not None and batch.dense.shape[0] > self.limit:
            raise RuntimeError(f"cannot score more than {self.limit} samples")
        if self.times:
            self.times -= 1
            raise RuntimeError("transient failure")
        return self.inner(batch)


def _flaky_steps(**flaky: int) -> tuple[TrainStep, TrainStep]:
    """A step on a flaky model, and one on an identical model that never raises."""
    spec = small_spec()
    config = small_config(model="tiny_models:tiny_mlp", model_args={})
    model = build_model(spec, config)
    reference = TrainStep(copy.deepcopy(model), spec, config, CPU)
    return TrainStep(_Flaky(model, **flaky), spec, config, CPU), reference


def test_a_model_that_fails_only_on_large_batches_skips_the_step_as_model_error(
    rng: np.random.Generator,
) -> None:
    # Every half passes, so no sample fails alone; the retry on all rows fails again.
    step, _ = _flaky_steps(limit=8)
    before = [p.detach().clone() for p in step.model.parameters()]
    batch = random_batch(small_spec(), 16, rng)
    result = step(batch, DictStore(spec_init(small_spec())).pull_many(batch))
    assert result.skipped == "model_error" and result.updates == {}
    (part,) = result.model_errors
    assert part.rows.tolist() == list(range(16)) and result.failed_samples == 16
    assert part.error.startswith("RuntimeError: cannot score more than 8 samples")
    for p, q in zip(step.model.parameters(), before, strict=True):
        assert torch.equal(p, q) and p.grad is None
    assert not step.optimizer.state


def test_a_model_that_fails_once_trains_on_every_row_in_the_retry(rng: np.random.Generator) -> None:
    step, reference = _flaky_steps(times=1)
    batch = random_batch(small_spec(), 16, rng)
    store = DictStore(spec_init(small_spec()))
    result = step(batch, store.pull_many(batch))
    assert result.skipped is None and result.model_errors == () and result.failed_samples == 0
    expected = reference(batch, store.pull_many(batch))
    assert result.loss == pytest.approx(expected.loss, rel=1e-6)
    for p, q in zip(step.model.inner.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(p, q)  # the same update as a step that never failed
