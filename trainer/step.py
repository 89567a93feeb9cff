"""One training step on a micro-batch whose embedding rows were pulled from the store.

Pure compute, no I/O: the daemon pulls rows, calls :class:`TrainStep`, pushes
``result.updates`` and only then commits offsets. Per step::

    batch + pulled rows ──> BatchTensors (device) + per-table leaf rows [U, dim]
      (ids not admitted read their fallback bucket's row, see kelp.store.policy.fallback)
      ──> forward(ModelInput) ──> logits f32[B] ──> progressive eval (scored *before* the update)
      ──> BCE per task (sample-weighted, summed by loss_weight) ──> backward
      ──> finite? ──> dense optimizer step
      ──> row-wise Adagrad on admitted rows ──> updates {table: (ids, rows, state)}

With several labels (``features.labels``) the model returns ``{task: logits}``;
each task's loss is the sample-weighted mean BCE, ``sum(w * bce) / sum(w)``
(a zero-weight sample changes nothing), and the step's loss is their sum by
``loss_weight``. One task with no sample weights is exactly the mean BCE.

The forward pass precedes every update, so its logits are exactly the
predictions a progressive validator wants; no second forward is needed.

A step whose loss, or any gradient it would apply (dense parameters or row
gradients), is NaN or infinite is *skipped* (:func:`kelp.trainer.finite.step_verdict`,
one fused check and one device-to-host sync): no dense update, no row is
pushed (``updates`` is empty, so the daemon still acknowledges and commits the
batch's offsets), its samples stay out of the progressive metrics, and
``StepResult.skipped`` says why. One poisoned row or feature would otherwise
turn every dense parameter into NaN at the next optimizer step.

A model that raises on a batch (forward, backward, or an output that breaks
the contract) has applied nothing yet: the step finds the samples it fails on
by halving the batch (:mod:`kelp.trainer.isolate`), trains once on the others
and names the failures in ``StepResult.model_errors``; if none is left the step
is skipped as ``model_error``. What becomes of those samples (dead letters, or
a stop when the model is broken) is the daemon's call.

In a trainer group the daemon passes ``dense_sync``: called between backward
and the dense optimizer step with the batch's sample count, it replaces the
local dense gradients with the group's (an all-reduce) and says whether to
step. A rank without a batch calls :meth:`TrainStep.idle` so the group's
collective still meets. A rank that skips its step still meets it, contributing
nothing (``dense_sync(0)`` with its gradients dropped), and applies the group's
update of the other ranks' samples, so the dense replicas stay equal. This
module never talks to the process group itself.
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
from kelp.store.policy.fallback import Fallback, PullPlan
from kelp.trainer.embedding import (
    BatchTensors,
    gather_sequences,
    model_input,
    pool_features,
    rows_to_leaf,
    to_device,
)
from kelp.trainer.evaluation import ProgressiveValidator, TaskValidators
from kelp.trainer.finite import SkipLog, step_verdict
from kelp.trainer.isolate import (
    ModelErrorRows,
    ModelRaisedError,
    is_model_error,
    isolate,
    probe_budget,
    restore_buffers,
    snapshot_buffers,
    subset_pulled,
    take_rows,
)
from kelp.trainer.model_api import ModelContractError, ModelSpec, to_logits
from kelp.trainer.optim import RowWiseAdagrad, SparseUpdate, build_dense_optimizer

__all__ = [
    "STAGES",
    "DenseSync",
    "PulledRows",
    "StageTimer",
    "StepResult",
    "Targets",
    "TrainStep",
    "forward_backward",
    "task_logits",
    "weighted_loss",
]

DenseSync = Callable[[int], bool]
"""``dense_sync(local_samples) -> step?``: make the dense grads the group's; False when nobody had data."""

STAGES: tuple[str, ...] = ("to_device", "forward_backward", "dense_update", "sparse_update", "evaluate")
"""Stage names in :attr:`StepResult.timings` (seconds each), in execution order."""


_ONE_TASK = ModelSpec(dense=(), sparse={})


@dataclass(frozen=True)
class Targets:
    """What a multi-task or weighted loss needs on the device (None: one task, every weight 1).

    * ``labels``: f32[B, T], column t = task t (``ModelSpec.tasks`` order);
    * ``weight``: f32[B] sample weights;
    * ``loss_weights``: f32[T], each task's factor in the summed loss.
    """

    labels: Tensor
    weight: Tensor
    loss_weights: Tensor

    @classmethod
    def from_batch(cls, batch: MicroBatch, spec: FeatureSpec, device: torch.device) -> Targets | None:
        tasks = spec.tasks
        if len(tasks) == 1 and batch.weight is None and tasks[0].loss_weight == 1.0:
            return None
        labels = batch.task_labels([t.name for t in tasks])
        return cls(
            labels=torch.from_numpy(np.ascontiguousarray(labels)).to(device),
            weight=torch.from_numpy(np.ascontiguousarray(batch.weights())).to(device),
            loss_weights=torch.tensor([t.loss_weight for t in tasks], dtype=torch.float32, device=device),
        )


def task_logits(output: object, spec: ModelSpec, batch_size: int) -> Tensor:
    """A forward's output -> logits f32[B, T] in ``spec.tasks`` order (each task checked by ``to_logits``)."""
    if len(spec.tasks) == 1:
        return to_logits(output, spec, batch_size).unsqueeze(1)
    if not isinstance(output, Mapping):
        raise ModelContractError(
            f"model returned {type(output).__name__}, expected a mapping {{task: f32[B] logits}} "
            f"for tasks {list(spec.tasks)}"
        )
    to_logits(output, spec, batch_size)  # the key check
    one = [replace(spec, tasks=(task,)) for task in spec.tasks]
    return torch.stack([to_logits({s.tasks[0]: output[s.tasks[0]]}, s, batch_size) for s in one], dim=1)


def weighted_loss(logits: Tensor, targets: Targets) -> tuple[Tensor, Tensor]:
    """``(total, per_task f32[T])``: each task's sample-weighted mean BCE, and their ``loss_weight`` sum."""
    per_sample = F.binary_cross_entropy_with_logits(logits, targets.labels, reduction="none")
    weight = targets.weight.unsqueeze(1)
    per_task = (per_sample * weight).sum(dim=0) / targets.weight.sum().clamp_min(1e-12)
    return (per_task * targets.loss_weights).sum(), per_task


class PulledRows(Protocol):
    """What the store's ``pull(table, unique_ids)`` returns (``PullResult`` fits), U = len(unique_ids).

    * ``rows``: float32[U, dim], the default row where not admitted (numpy, or a
      tensor on any device: a working copy's gather hands tensors on the trainer's device);
    * ``state``: float32[U], row-wise Adagrad accumulator (likewise);
    * ``admitted``: bool[U], whether the id has a stored row its update may overwrite;
    * ``admitted_now``: bool[U] or None, admitted by this very pull (its row is the init row).
    """

    @property
    def rows(self) -> np.ndarray | Tensor: ...

    @property
    def state(self) -> np.ndarray | Tensor: ...

    @property
    def admitted(self) -> np.ndarray: ...

    @property
    def admitted_now(self) -> np.ndarray | None: ...


@dataclass(frozen=True)
class StepResult:
    """The outcome of one step.

    * ``loss``: mean BCE over the batch, before the update (several tasks or sample
      weights: the weighted sum of the tasks' losses, see the module docstring);
    * ``logits``: float32[B], the first task's pre-update predictions (progressive validation);
    * ``task_logits``: with several tasks, each task's float32[B] logits (else empty);
    * ``updates``: per table, admitted ids and their new rows and state, to ``push``;
    * ``grads``: per table, the row gradients behind ``updates`` (only when the
      sparse optimizer keeps them: ``store.sparse_updates: compose``);
    * ``timings``: seconds per stage of :data:`STAGES`;
    * ``skipped``: None for a step that trained, else why it did not
      (``nonfinite_loss``, ``nonfinite_grad``, or ``model_error`` when the model
      raised on every sample): then ``updates`` is empty, nothing was applied
      and ``loss``/``logits`` may be NaN;
    * ``model_errors``: the samples of the batch the model raised on (forward,
      backward or its output contract), with the exception; the step trained on
      the others only, so ``logits`` and ``loss`` cover those (see
      :mod:`kelp.trainer.isolate`). Empty when the model raised on nothing.
    """

    loss: float
    logits: np.ndarray
    updates: dict[str, SparseUpdate]
    timings: dict[str, float] = field(default_factory=dict)
    grads: dict[str, np.ndarray] = field(default_factory=dict)
    skipped: str | None = None
    task_logits: dict[str, np.ndarray] = field(default_factory=dict)
    model_errors: tuple[ModelErrorRows, ...] = ()

    @property
    def failed_samples(self) -> int:
        """How many samples of the batch the model raised on (not trained)."""
        return sum(len(part.rows) for part in self.model_errors)


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


def forward_backward(
    model: nn.Module,
    bt: BatchTensors,
    rows: Mapping[str, Tensor],
    spec: ModelSpec | None = None,
    targets: Targets | None = None,
) -> tuple[Tensor, Tensor]:
    """Forward and backward; returns ``(loss, logits)`` with grads left in params and ``rows``.

    The model's output is checked against the contract (:func:`~kelp.trainer.model_api.to_logits`;
    ``spec`` names the tasks of a mapping output, default one task ``label``). Without
    ``targets`` the loss is the mean BCE against ``bt.labels`` and logits are f32[B];
    with them it is :func:`weighted_loss` and logits are f32[B, T].
    """
    output = model(model_input(bt, pool_features(bt, rows), gather_sequences(bt, rows)))
    if targets is None:
        logits = to_logits(output, spec or _ONE_TASK, bt.size)
        loss = F.binary_cross_entropy_with_logits(logits, bt.labels)
    else:
        logits = task_logits(output, spec or _ONE_TASK, bt.size)
        loss, _ = weighted_loss(logits, targets)
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
    skipped: str | None = None,
    tasks: TaskValidators | None = None,
    batch: MicroBatch | None = None,
) -> StepResult:
    """The common end of every step: logits to the host, progressive eval, the result.

    The logits are those of the forward pass *before* this step's update, so the
    validator scores each batch before training on it. A ``skipped`` step is not
    scored: its logits may be NaN, and it was not trained on either. Logits
    f32[B, T] (several tasks) score task 0 in ``validator`` and every task in ``tasks``.
    """
    all_np = logits.to("cpu").numpy()
    logits_np = all_np[:, 0].copy() if all_np.ndim == 2 else all_np
    by_task: dict[str, np.ndarray] = {}
    if all_np.ndim == 2 and tasks is not None and len(tasks.names) > 1:
        by_task = {name: all_np[:, t].copy() for t, name in enumerate(tasks.names)}
    loss_value = float(loss)
    if validator is not None and skipped is None:
        validator.update(labels, logits_np)
    if tasks is not None and batch is not None and by_task and skipped is None:
        tasks.update(batch, by_task)
    timer.lap("evaluate")
    return StepResult(
        loss=loss_value,
        logits=logits_np,
        updates=updates,
        timings=timer.timings,
        skipped=skipped,
        task_logits=by_task,
    )


class TrainStep:
    """The trainer's compute core: model, dense optimizer, row-wise Adagrad and progressive eval.

    ``pulled`` must hold one entry per table of :meth:`pull_plan` (the batch's
    tables, ``batch.tables[t].unique_ids``, plus their fallback buckets). Example::

        step = TrainStep(model, spec, cfg, device)
        pulled = store.pull_many(step.pull_plan(batch).ids)
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
        self.model_spec = ModelSpec.from_features(spec)
        self.device = device
        self.optimizer = optimizer or build_dense_optimizer(self.model.parameters(), config.dense_optimizer)
        self.sparse_optimizer = RowWiseAdagrad.from_spec(config.sparse_optimizer)
        self.validator = validator
        self.task_validators = (
            TaskValidators.beside(validator, self.model_spec.tasks) if validator is not None else None
        )
        """Every task's progressive metrics (the first task's validator is ``validator``)."""
        self.sync_timings = sync_timings
        self.steps = 0
        self.skips = SkipLog()
        """Steps skipped for a non-finite loss or gradient, by reason (not counted in ``steps``)."""
        self.fallback = Fallback(spec.tables)
        self._warm = {t.name for t in spec.tables if t.admission.fallback_warm_start}
        self._dims = {t.name: t.dim for t in spec.store_tables()}

    def _warm_start(
        self, table: str, got: PulledRows, pulled: Mapping[str, PulledRows], plan: PullPlan
    ) -> tuple[np.ndarray | Tensor, np.ndarray | Tensor]:
        """``(rows, state)`` of ``table``: as pulled, but with ``admission.fallback_warm_start`` an id
        admitted by this pull starts from its bucket's row instead of the random init row.

        The id keeps what its bucket learned while it waited (the store's init row
        is overwritten by this step's push); its Adagrad state starts fresh. Pays
        when buckets are few per waiting id (docs/accuracy.md), hurts when many
        ids share a bucket: then the row carries the other ids' updates.
        """
        new = got.admitted_now
        if table not in self._warm or new is None or not new.any():
            return got.rows, got.state
        bucket = pulled[self.fallback.tables[table].table]
        rows = to_device(got.rows, self.device).clone()  # a working copy's rows are on the device already
        at = torch.from_numpy(plan.position[table][new]).to(self.device)
        rows[torch.from_numpy(np.flatnonzero(new)).to(self.device)] = to_device(bucket.rows, self.device)[at]
        return rows, got.state

    def _lookup_rows(
        self, rows: Mapping[str, Tensor], pulled: Mapping[str, PulledRows], plan: PullPlan
    ) -> dict[str, Tensor]:
        """Per embedding table, the rows its ids read: their own, or (not admitted) their bucket's.

        ``torch.where`` keeps both leaves in the graph, so backward sums the
        gradients of every not-admitted id into its bucket row.
        """
        out = {name: leaf for name, leaf in rows.items() if not self.fallback.is_bucket_table(name)}
        for name, position in plan.position.items():
            admitted = pulled[name].admitted
            if admitted.all():
                continue
            mask = torch.from_numpy(np.ascontiguousarray(admitted)).to(self.device).unsqueeze(1)
            index = torch.from_numpy(position).to(self.device)
            bucket_rows = rows[self.fallback.tables[name].table].index_select(0, index)
            out[name] = torch.where(mask, rows[name], bucket_rows)
        return out

    def idle(self, dense_sync: DenseSync) -> None:
        """Take part in a group step without a batch: zero dense grads, then the group's update (if any)."""
        self.optimizer.zero_grad(set_to_none=True)
        if dense_sync(0):
            self.optimizer.step()

    def pull_plan(self, batch: MicroBatch) -> PullPlan:
        """What a step on ``batch`` needs pulled: each table's unique ids, plus fallback buckets."""
        return self.fallback.expand({name: t.unique_ids for name, t in batch.tables.items()})

    def __call__(
        self,
        batch: MicroBatch,
        pulled: Mapping[str, PulledRows],
        dense_sync: DenseSync | None = None,
        *,
        plan: PullPlan | None = None,
    ) -> StepResult:
        """Train on ``batch``; samples the model raises on are left out (``StepResult.model_errors``)."""
        timer = StageTimer(self.device, self.sync_timings)
        self.model.train()
        if plan is None:  # the daemon passes the plan its prefetcher pulled by; others have it made here
            plan = self.pull_plan(batch)
        saved = snapshot_buffers(self.model)
        try:
            return self._train(batch, pulled, plan, dense_sync, timer)
        except ModelRaisedError as failure:
            # Nothing was applied: forward/backward precede every update and the group's all-reduce.
            self.optimizer.zero_grad(set_to_none=True)
            restore_buffers(saved)
            return self._around_failure(
                batch, pulled, plan=plan, dense_sync=dense_sync, timer=timer, failure=failure
            )

    def _around_failure(
        self,
        batch: MicroBatch,
        pulled: Mapping[str, PulledRows],
        *,
        plan: PullPlan,
        dense_sync: DenseSync | None,
        timer: StageTimer,
        failure: ModelRaisedError,
    ) -> StepResult:
        """Find the samples the model fails on (:func:`~kelp.trainer.isolate.isolate`), train the others.

        Probes apply nothing: their gradients are dropped and the model's buffers
        put back. If no sample is left, or the model fails again on the rest,
        the step is skipped as ``model_error`` (it still meets the group's all-reduce).
        """
        saved = snapshot_buffers(self.model)

        def probe(rows: np.ndarray) -> None:
            sub, sub_pulled, sub_plan = self._subset(batch, pulled, plan, rows)
            try:
                bt, leaves, _ = self._to_device(sub, sub_pulled, sub_plan)
                self._forward_backward(sub, bt, leaves, sub_pulled, sub_plan)
            finally:
                self.optimizer.zero_grad(set_to_none=True)
                restore_buffers(saved)

        failed = isolate(batch.size, probe, probe_budget(batch.size), str(failure))
        # No part may fail alone (a model that fails only on large batches, or at random): then every
        # row is retried at once, and a second failure skips the step below.
        bad = np.concatenate([part.rows for part in failed]) if failed else np.empty(0, np.int64)
        good = np.setdiff1d(np.arange(batch.size, dtype=np.int64), bad)
        if len(good):
            sub, sub_pulled, sub_plan = self._subset(batch, pulled, plan, good)
            try:
                result = self._train(sub, sub_pulled, sub_plan, dense_sync, timer)
                return replace(result, model_errors=tuple(failed))
            except ModelRaisedError as again:  # a model that fails at random: give up on the batch
                self.optimizer.zero_grad(set_to_none=True)
                restore_buffers(saved)
                failed = [ModelErrorRows(np.arange(batch.size, dtype=np.int64), str(again))]
        nan = torch.tensor(float("nan"))
        logits = torch.full((batch.size,), float("nan"))
        result = self._skip(
            "model_error", timer=timer, batch=batch, loss=nan, logits=logits, dense_sync=dense_sync
        )
        return replace(result, model_errors=tuple(failed))

    def _subset(
        self, batch: MicroBatch, pulled: Mapping[str, PulledRows], plan: PullPlan, rows: np.ndarray
    ) -> tuple[MicroBatch, dict[str, PulledRows], PullPlan]:
        """Samples ``rows`` of ``batch`` with their own pull plan, and their rows cut from ``pulled``."""
        sub = take_rows(batch, rows)
        sub_plan = self.pull_plan(sub)
        return sub, dict(subset_pulled(pulled, plan.ids, sub_plan.ids)), sub_plan

    def _forward_backward(
        self,
        batch: MicroBatch,
        bt: BatchTensors,
        rows: Mapping[str, Tensor],
        pulled: Mapping[str, PulledRows],
        plan: PullPlan,
    ) -> tuple[Tensor, Tensor]:
        """:func:`forward_backward`, with anything the model raises wrapped in :class:`ModelRaisedError`."""
        targets = Targets.from_batch(batch, self.spec, self.device)
        lookup = self._lookup_rows(rows, pulled, plan)
        try:
            return forward_backward(self.model, bt, lookup, self.model_spec, targets)
        except Exception as exc:
            if not is_model_error(exc):
                raise
            raise ModelRaisedError(exc) from exc

    def _to_device(
        self, batch: MicroBatch, pulled: Mapping[str, PulledRows], plan: PullPlan
    ) -> tuple[BatchTensors, dict[str, Tensor], dict[str, Tensor]]:
        """The batch's tensors, and per table of ``plan`` its rows as leaves and their Adagrad state."""
        bt = BatchTensors.from_batch(batch, self.spec, self.device)
        rows: dict[str, Tensor] = {}
        states: dict[str, Tensor] = {}
        for table, ids in plan.ids.items():
            if table not in pulled:
                raise KeyError(f"no pulled rows for table {table!r}")
            got = pulled[table]
            dim = self._dims[table]
            if got.rows.shape != (ids.size, dim) or got.state.shape != (ids.size,):
                raise ValueError(
                    f"table {table!r}: pulled rows {got.rows.shape} / state {got.state.shape} "
                    f"do not match {ids.size} unique ids of dim {dim}"
                )
            table_rows, table_state = self._warm_start(table, got, pulled, plan)
            rows[table] = rows_to_leaf(table_rows, self.device)
            states[table] = to_device(table_state, self.device)
        return bt, rows, states

    def _train(
        self,
        batch: MicroBatch,
        pulled: Mapping[str, PulledRows],
        plan: PullPlan,
        dense_sync: DenseSync | None,
        timer: StageTimer,
    ) -> StepResult:
        """One step on the whole of ``batch``; raises :class:`ModelRaisedError` before applying anything."""
        bt, rows, states = self._to_device(batch, pulled, plan)
        timer.lap("to_device")

        self.optimizer.zero_grad(set_to_none=True)
        loss, logits = self._forward_backward(batch, bt, rows, pulled, plan)
        timer.lap("forward_backward")

        dense_grads = [p.grad for group in self.optimizer.param_groups for p in group["params"]]
        skipped = step_verdict(loss, dense_grads + [leaf.grad for leaf in rows.values()])
        if skipped is not None:
            return self._skip(
                skipped, timer=timer, batch=batch, loss=loss, logits=logits, dense_sync=dense_sync
            )
        if dense_sync is None or dense_sync(batch.size):
            self.optimizer.step()
        timer.lap("dense_update")

        updates: dict[str, SparseUpdate] = {}
        grads: dict[str, np.ndarray] = {}
        for table, leaf in rows.items():
            keep = pulled[table].admitted
            if self.fallback.is_bucket_table(table):  # push only the buckets some waiting id used
                used = leaf.grad is not None and (leaf.grad != 0).any(dim=1).cpu().numpy()
                keep = keep & used
            updates[table], grad = self.sparse_optimizer.update_with_grads(
                plan.ids[table], leaf, states[table], leaf.grad, keep
            )
            if grad is not None:
                grads[table] = grad
        timer.lap("sparse_update")

        self.steps += 1
        result = finish_step(
            timer,
            validator=self.validator,
            labels=batch.labels,
            loss=loss,
            logits=logits,
            updates=updates,
            tasks=self.task_validators,
            batch=batch,
        )
        return replace(result, grads=grads) if grads else result

    def _skip(
        self,
        reason: str,
        *,
        timer: StageTimer,
        batch: MicroBatch,
        loss: Tensor,
        logits: Tensor,
        dense_sync: DenseSync | None,
    ) -> StepResult:
        """End a step that must not train: drop its gradients, push nothing, score nothing.

        In a group the rank still takes part in the step's all-reduce with no
        samples, and applies whatever the other ranks' samples agreed on. A
        non-finite step is counted (and warned about) in :attr:`skips`; a
        ``model_error`` one is reported by whoever handles its samples.
        """
        self.optimizer.zero_grad(set_to_none=True)
        if dense_sync is not None and dense_sync(0):
            self.optimizer.step()
        timer.lap("dense_update")
        timer.lap("sparse_update")
        result = finish_step(
            timer,
            validator=self.validator,
            labels=batch.labels,
            loss=loss,
            logits=logits,
            updates={},
            skipped=reason,
            tasks=self.task_validators,
            batch=batch,
        )
        if reason != "model_error":
            self.skips.record(reason, result.loss, batch.size)
        return result
