"""A NaN or an infinity never trains: the step is skipped, nothing is applied or pushed, offsets still commit.

The step guard is checked on the in-memory dict store (pure compute); the
pipeline test pushes and commits through the real Redis store.
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from kelp.bench.baseline import spec_init
from kelp.config import InitSpec, StoreConfig
from kelp.consumers.batch import MicroBatch, SourceRange
from kelp.daemon.ledger import UpdateLedger
from kelp.daemon.outage import OutageGuard, outage_policy
from kelp.daemon.stages import PushWriter
from kelp.store.factory import build_store
from kelp.trainer import finite
from kelp.trainer import step as step_module
from kelp.trainer.evaluation import ProgressiveValidator
from kelp.trainer.finite import SkipLog, first_nonfinite, grads_finite, step_verdict
from kelp.trainer.metrics import TrainerMetrics
from kelp.trainer.models import build_model
from kelp.trainer.step import TrainStep

from .conftest import DictStore, Pulled, random_batch, small_config, small_spec

CPU = torch.device("cpu")
NAN = float("nan")


def _trained_step(rng: np.random.Generator) -> tuple[TrainStep, DictStore]:
    """A TrainStep (Adam) that has taken two good steps, so its optimizer holds state."""
    torch.manual_seed(0)
    spec = small_spec()
    config = small_config()
    store = DictStore(spec_init(spec, InitSpec(std=0.1)))
    step = TrainStep(
        build_model(spec, config), spec, config, CPU, validator=ProgressiveValidator(window_batches=5)
    )
    for _ in range(2):
        batch = random_batch(spec, 32, rng)
        result = step(batch, store.pull_many(batch))
        assert result.skipped is None
        for table, update in result.updates.items():
            store.push(table, *update)
    return step, store


def _dense_state(step: TrainStep) -> tuple[dict[str, torch.Tensor], Any]:
    return copy.deepcopy(step.model.state_dict()), copy.deepcopy(step.optimizer.state_dict()["state"])


def _assert_unchanged(step: TrainStep, before: tuple[dict[str, torch.Tensor], Any]) -> None:
    params, optim = before
    for name, tensor in step.model.state_dict().items():
        assert torch.equal(tensor, params[name]), name
    now = step.optimizer.state_dict()["state"]
    assert now.keys() == optim.keys()
    for pid, entry in now.items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(optim[pid][key])), (pid, key)


def _with_nan_dense(batch: MicroBatch) -> MicroBatch:
    dense = batch.dense.copy()
    dense[3, 0] = NAN  # what the decoder refuses; here it reaches the step anyway
    return MicroBatch.from_columns(
        small_spec(), labels=batch.labels, dense=dense, sparse=batch.sparse, sources=batch.sources
    )


def _poisoned(pulled: dict[str, Pulled], table: str, value: float = NAN) -> dict[str, Pulled]:
    rows = pulled[table].rows.copy()
    rows[0] = value
    return {**pulled, table: Pulled(rows, pulled[table].state, pulled[table].admitted)}


def test_nan_dense_feature_skips_the_step(rng: np.random.Generator) -> None:
    step, store = _trained_step(rng)
    before = _dense_state(step)
    scored = step.validator.batches  # type: ignore[union-attr]
    batch = _with_nan_dense(random_batch(step.spec, 32, rng))

    result = step(batch, store.pull_many(batch))

    assert result.skipped == "nonfinite_loss" and np.isnan(result.loss)
    assert result.updates == {} and result.grads == {}
    _assert_unchanged(step, before)
    assert step.validator.batches == scored  # type: ignore[union-attr]
    assert np.isfinite(step.validator.cumulative().log_loss)  # type: ignore[union-attr]
    assert step.skips.counts == {"nonfinite_loss": 1} and step.steps == 2
    assert all(p.grad is None for p in step.model.parameters())

    good = random_batch(step.spec, 32, rng)  # the next finite batch trains as usual
    after = step(good, store.pull_many(good))
    assert after.skipped is None and after.updates and step.validator.batches == scored + 1  # type: ignore[union-attr]
    assert any(not torch.equal(t, before[0][n]) for n, t in step.model.state_dict().items())


@pytest.mark.parametrize("value", [NAN, float("inf")])
def test_poisoned_embedding_row_skips_the_step(rng: np.random.Generator, value: float) -> None:
    step, store = _trained_step(rng)
    before = _dense_state(step)
    batch = random_batch(step.spec, 32, rng)

    result = step(batch, _poisoned(store.pull_many(batch), "shared", value))

    assert result.skipped in ("nonfinite_loss", "nonfinite_grad") and result.updates == {}
    _assert_unchanged(step, before)


def test_nonfinite_row_gradient_with_a_finite_loss_skips_the_whole_step(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the sparse row gradients are NaN: no dense update either, and no row is pushed."""
    step, store = _trained_step(rng)
    before = _dense_state(step)
    pool = step_module.pool_features

    def poisoned_pool(*args: Any) -> list[torch.Tensor]:
        pooled = pool(*args)
        pooled[0].register_hook(lambda g: g * NAN)  # reaches the rows' grads, not the dense ones
        return pooled

    monkeypatch.setattr(step_module, "pool_features", poisoned_pool)
    batch = random_batch(step.spec, 32, rng)
    result = step(batch, store.pull_many(batch))

    assert np.isfinite(result.loss)
    assert result.skipped == "nonfinite_grad" and result.updates == {}
    _assert_unchanged(step, before)
    assert step.skips.counts == {"nonfinite_grad": 1}


def test_nonfinite_dense_gradient_skips_the_step(rng: np.random.Generator) -> None:
    step, store = _trained_step(rng)
    before = _dense_state(step)
    handle = next(step.model.parameters()).register_hook(lambda g: torch.full_like(g, float("inf")))
    batch = random_batch(step.spec, 32, rng)
    result = step(batch, store.pull_many(batch))
    handle.remove()

    assert np.isfinite(result.loss) and result.skipped == "nonfinite_grad" and result.updates == {}
    _assert_unchanged(step, before)


def test_a_skipping_rank_contributes_nothing_but_applies_the_group_update(rng: np.random.Generator) -> None:
    """In a group the rank still meets the all-reduce (0 samples, no grads) and steps like its peers."""
    step, store = _trained_step(rng)
    peer_model, peer_opt = copy.deepcopy((step.model, step.optimizer))  # one copy: the optimizer's params
    seen: list[tuple[int, bool]] = []

    def dense_sync(samples: int) -> bool:  # what the group's exchange leaves: the peers' mean gradient
        seen.append((samples, all(p.grad is None for p in step.model.parameters())))
        for p in step.model.parameters():
            p.grad = torch.full_like(p, 0.5)
        return True

    batch = _with_nan_dense(random_batch(step.spec, 32, rng))
    result = step(batch, store.pull_many(batch), dense_sync)

    assert result.skipped == "nonfinite_loss" and result.updates == {}
    assert seen == [(0, True)]  # no samples and no gradients of this rank's bad batch
    for p in peer_model.parameters():
        p.grad = torch.full_like(p, 0.5)
    peer_opt.step()
    for (name, mine), theirs in zip(
        step.model.state_dict().items(), peer_model.state_dict().values(), strict=True
    ):
        assert torch.equal(mine, theirs), name  # the replicas stay bitwise equal


def test_skipped_step_pushes_nothing_and_still_commits_its_offsets(
    rng: np.random.Generator, redis_url: str
) -> None:
    """Through the real Redis store and the push writer: three batches, the middle one poisoned."""
    torch.manual_seed(0)
    spec = small_spec()
    config = small_config()
    step = TrainStep(build_model(spec, config), spec, config, CPU)
    metrics = TrainerMetrics(CollectorRegistry())
    commits: list[list[int]] = []
    source = SimpleNamespace(commit=lambda ranges: commits.append([r.first_offset for r in ranges]))
    ledger = UpdateLedger()
    guard = OutageGuard(1.0, metrics, policy=outage_policy(1.0, sleep=lambda _s: None))
    with build_store(StoreConfig(backend="redis", urls=[redis_url]), list(spec.tables), "nonfinite") as store:
        writer = PushWriter(source, store, ledger, guard=guard, metrics=metrics, depth=1, threaded=False)  # type: ignore[arg-type]
        stored_before: np.ndarray | None = None
        for number in (1, 2, 3):
            batch = random_batch(spec, 32, rng)
            batch.sources = [SourceRange("events", 0, number * 100, number * 100 + 31)]
            pulled = ledger.apply(ledger.begin_pull(), store.pull_many(step.pull_plan(batch).ids), {})
            if number == 2:
                ids = batch.tables["shared"].unique_ids
                stored_before = store.pull("shared", ids, count=False).rows
                params = copy.deepcopy(step.model.state_dict())
                pulled = _poisoned(pulled, "shared")  # type: ignore[arg-type]
            result = step(batch, pulled)
            assert (result.skipped is not None) == (number == 2)
            ledger.record(number, result.updates)
            writer.submit(number, batch, result.updates, result.grads)
            if number == 2:
                for name, tensor in step.model.state_dict().items():
                    assert torch.equal(tensor, params[name]), name
                stored_after = store.pull("shared", ids, count=False).rows
                np.testing.assert_array_equal(stored_after, stored_before)  # nothing pushed
        assert writer.drain(timeout_s=5.0)
    assert commits == [[100], [200], [300]]  # the skipped batch's offsets are committed too
    assert ledger.acked == 3 and writer.committed_step == 3


# --------------------------------------------------------------------------- the checks themselves


def test_step_verdict_is_exact() -> None:
    ok = torch.tensor(0.5)
    big = torch.tensor([3.0e38, -3.0e38])  # finite, and its sum would overflow float32
    assert step_verdict(ok, [big, None, torch.zeros(0, 4)]) is None
    assert step_verdict(torch.tensor(NAN), [big]) == "nonfinite_loss"
    assert step_verdict(torch.tensor(float("inf")), []) == "nonfinite_loss"
    for bad in (NAN, float("inf"), float("-inf")):
        grad = torch.zeros(5, 3)
        grad[4, 2] = bad
        assert step_verdict(ok, [big, grad]) == "nonfinite_grad", bad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_verdict_on_cuda() -> None:
    cuda = torch.device("cuda")
    big = torch.tensor([3.0e38, -3.0e38], device=cuda)
    grad = torch.zeros(5, 3, device=cuda)
    assert step_verdict(torch.tensor(0.5, device=cuda), [big, grad]) is None
    grad[1, 1] = NAN
    assert not bool(grads_finite([big, grad]))
    assert step_verdict(torch.tensor(0.5, device=cuda), [big, grad]) == "nonfinite_grad"


def test_first_nonfinite_names_the_first_bad_tensor() -> None:
    tensors = {
        "a": torch.ones(3),
        "step": torch.tensor(7),
        "b": torch.tensor([1.0, float("-inf")]),
        "c": torch.tensor([NAN]),
    }
    assert first_nonfinite(tensors) == "b"
    assert first_nonfinite({"a": torch.ones(3), "e": torch.zeros(0)}) is None


def test_skip_log_warns_at_once_then_at_most_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    skips = SkipLog(interval_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger=finite.log.name):
        for _ in range(5):
            skips.record("nonfinite_loss", NAN, 32)
            now[0] += 10.0
        now[0] += 60.0
        skips.record("nonfinite_grad", 1.0, 32)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "nonfinite_loss" in warnings[0] and "nonfinite_grad" in warnings[1]
    assert "5 skipped since the last warning, 6 in all" in warnings[1]
    assert skips.counts == {"nonfinite_loss": 5, "nonfinite_grad": 1}
