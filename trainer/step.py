"""One training step on a micro-batch whose embedding rows were pulled from the store.

Pure compute, no I/O: the daemon pulls rows, calls :class:`TrainStep`, pushes
``result.updates`` and only then commits offsets. Per step::

    batch + pulled rows ──> BatchTensors (device) + per-table leaf rows [U, dim]
      ──> forward ──> logits f32[B] ──> progressive eval (scored *before* the update)
      ──> BCE-with-logits ──> backward ──> dense optimizer step
      ──> row-wise Adagrad on admitted rows ──> updates {table: (ids, rows, state)}

The forward pass precedes every update, so its logits are exactly the
predictions a progressive validator wants; no second forward is needed.

In a trainer group the daemon passes ``dense_sync``: called between backward
and the dense optimizer step with the batch's sample count, it replaces the
local dense gradients with the group's (an all-reduce) and says whether to
step. A rank without a batch calls :meth:`TrainStep.idle` so the group's
collective still meets. This module never talks to the process group itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the PyTorch convention
from torch import Tensor, nn

from kelp.config import FeatureSpec, TrainerConfig
from kelp.consumers.batch import MicroBatch
from kelp.trainer.embedding import BatchTensors, pool_features, rows_to_leaf
from kelp.trainer.evaluation import ProgressiveValidator
from kelp.trainer.optim import RowWiseAdagrad, SparseUpdate, build_dense_optimizer

__all__ = ["STAGES", "DenseSync", "PulledRows", "StageTimer", "StepResult", "TrainStep", "forward_backward"]

DenseSync = Callable[[int], bool]
"""``dense_sync(local_samples) -> step?``: make the dense grads the group's; False when nobody had data."""

STAGES: tuple[str, ...] = ("to_device", "forward_backward", "dense_update", "sparse_update", "evaluate")
"""Stage names in :attr:`StepResult.timings` (seconds each), in execution order."""


class PulledRows(Protocol):
    """What the store's ``pull(table, unique_ids)`` returns (``PullResult`` fits), U = len(unique_ids).

    * ``rows``: float32[U, dim], the default row where not admitted;
    * ``state``: float32[U], row-wise Adagrad accumulator;
    * ``admitted``: bool[U], whether the id has a stored row its update may overwrite.
    """

    @property
    def rows(self) -> np.ndarray: ...

    @property
    def state(self) -> np.ndarray: ...

    @property
    def admitted(self) -> np.ndarray: ...


@dataclass(frozen=True)
class StepResult:
    """The outcome of one step.

    * ``loss``: mean BCE over the batch, before the update;
    * ``logits``: float32[B], the pre-update predictions (progressive validation);
    * ``updates``: per table, admitted ids and their new rows and state, to ``push``;
    * ``grads``: per table, the row gradients behind ``updates`` (only when the
      sparse optimizer keeps them: ``store.sparse_updates: compose``);
    * ``timings``: seconds per stage of :data:`STAGES`.
    """

    loss: float
    logits: np.ndarray
    updates: dict[str, SparseUpdate]
    timings: dict[str, float] = field(default_factory=dict)
    grads: dict[str, np.ndarray] = field(default_factory=dict)


class StageTimer:
    """Wall-clock seconds per stage. With ``sync`` on CUDA, each stage ends with a device sync.

    Without ``sync`` the numbers are host times: asynchronous CUDA work is
    billed to whichever later stage waits for it (the sparse update's copy to host).
    """

    def __init__(self, device: torch.device, sync: bool) -> None:
        self._sync = sync and device.type == "cuda"
        self._device = device
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        if self._sync:
            torch.cuda.synchronize(self._device)
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - self._last
        self._last = now


def forward_backward(model: nn.Module, bt: BatchTensors, rows: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Forward and backward; returns ``(loss, logits f32[B])`` with grads left in params and ``rows``."""
    logits = model(bt.dense, pool_features(bt, rows))
    loss = F.binary_cross_entropy_with_logits(logits, bt.labels)
    loss.backward()
    return loss.detach(), logits.detach()


def finish_step(
    timer: StageTimer,
    *,
    validator: ProgressiveValidator | None,
    labels: np.ndarray,
    loss: Tensor,
    logits: Tensor,
    updates: dict[str, SparseUpdate],
) -> StepResult:
    """The common end of every step: logits to the host, progressive eval, the result.

    The logits are those of the forward pass *before* this step's update, so the
    validator scores each batch before training on it.
    """
    logits_np = logits.to("cpu").numpy()
    loss_value = float(loss)
    if validator is not None:
        validator.update(labels, logits_np)
    timer.lap("evaluate")
    return StepResult(loss=loss_value, logits=logits_np, updates=updates, timings=timer.timings)


class TrainStep:
    """The trainer's compute core: model, dense optimizer, row-wise Adagrad and progressive eval.

    ``pulled`` must hold one entry per table of the batch (``batch.tables``),
    pulled for exactly ``batch.tables[t].unique_ids``. Example::

        step = TrainStep(model, spec, cfg, device)
        pulled = store.pull_many({t: ids.unique_ids for t, ids in batch.tables.items()})
        result = step(batch, pulled)
        store.push_many(result.updates)
    """

    def __init__(
        self,
        model: nn.Module,
        spec: FeatureSpec,
        config: TrainerConfig,
        device: torch.device,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        validator: ProgressiveValidator | None = None,
        sync_timings: bool = False,
    ) -> None:
        self.model = model.to(device)
        self.spec = spec
        self.device = device
        self.optimizer = optimizer or build_dense_optimizer(self.model.parameters(), config.dense_optimizer)
        self.sparse_optimizer = RowWiseAdagrad.from_spec(config.sparse_optimizer)
        self.validator = validator
        self.sync_timings = sync_timings
        self.steps = 0

    def idle(self, dense_sync: DenseSync) -> None:
        """Take part in a group step without a batch: zero dense grads, then the group's update (if any)."""
        self.optimizer.zero_grad(set_to_none=True)
        if dense_sync(0):
            self.optimizer.step()

    def __call__(
        self, batch: MicroBatch, pulled: Mapping[str, PulledRows], dense_sync: DenseSync | None = None
    ) -> StepResult:
        timer = StageTimer(self.device, self.sync_timings)
        self.model.train()
        bt = BatchTensors.from_batch(batch, self.spec, self.device)
        rows: dict[str, Tensor] = {}
        states: dict[str, Tensor] = {}
        for table, ids in bt.unique_ids.items():
            if table not in pulled:
                raise KeyError(f"no pulled rows for table {table!r}")
            got = pulled[table]
            dim = self.spec.table(table).dim
            if got.rows.shape != (ids.size, dim) or got.state.shape != (ids.size,):
                raise ValueError(
                    f"table {table!r}: pulled rows {got.rows.shape} / state {got.state.shape} "
                    f"do not match {ids.size} unique ids of dim {dim}"
                )
            rows[table] = rows_to_leaf(got.rows, self.device)
            states[table] = torch.from_numpy(np.asarray(got.state, dtype=np.float32)).to(self.device)
        timer.lap("to_device")

        self.optimizer.zero_grad(set_to_none=True)
        loss, logits = forward_backward(self.model, bt, rows)
        timer.lap("forward_backward")

        if dense_sync is None or dense_sync(batch.size):
            self.optimizer.step()
        timer.lap("dense_update")

        updates: dict[str, SparseUpdate] = {}
        grads: dict[str, np.ndarray] = {}
        for table, leaf in rows.items():
            updates[table], grad = self.sparse_optimizer.update_with_grads(
                bt.unique_ids[table], leaf, states[table], leaf.grad, pulled[table].admitted
            )
            if grad is not None:
                grads[table] = grad
        timer.lap("sparse_update")

        self.steps += 1
        result = finish_step(
            timer, validator=self.validator, labels=batch.labels, loss=loss, logits=logits, updates=updates
        )
        return replace(result, grads=grads) if grads else result
