"""The in-memory single-process baseline that ``kelp bench train`` measures Kelp against (the oracle).

Same model, same optimizers, same pooling code as :class:`~kelp.trainer.step.TrainStep`,
but every embedding table lives in memory as one tensor on the device::

    table t:  weight f32[capacity, dim]   state f32[capacity]   IdIndex: uint64 id -> row
    step:     idx   = index.get_or_insert(batch.tables[t].unique_ids)      (host, vectorised)
              rows  = weight.index_select(0, idx)          leaf [U, dim], requires_grad
              forward / backward / dense step              (shared with TrainStep)
              rows', state' = RowWiseAdagrad(rows, state[idx], rows.grad)
              weight.index_copy_(0, idx, rows'); state.index_copy_(0, idx, state')

Gathering only the batch's unique rows keeps every step proportional to
unique ids (no sparse gradient over the whole table, no coalesce), which is
the fastest plain-PyTorch formulation. Because the math is shared, training
through ``TrainStep`` with any correct store gives the same predictions as
this baseline on the same batches and initial rows: the "no lost updates"
oracle. Admission is off here (every id gets a row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from kelp.config import FeatureSpec, InitSpec, TrainerConfig
from kelp.consumers.batch import MicroBatch
from kelp.store.policy.initial_rows import init_rows
from kelp.store.rows.slots import Column, SlotTable
from kelp.trainer.embedding import BatchTensors
from kelp.trainer.evaluation import ProgressiveValidator
from kelp.trainer.optim import RowWiseAdagrad, build_dense_optimizer
from kelp.trainer.step import StageTimer, StepResult, finish_step, forward_backward

__all__ = ["InMemoryBaseline", "InitFn", "PreparedBatch", "spec_init"]

InitFn = Callable[[str, np.ndarray], np.ndarray]
"""``(table, ids uint64[n]) -> float32[n, dim]``: deterministic initial rows (pass the store's to match).

Rows must depend only on (table, id), never on call order."""


def spec_init(spec: FeatureSpec, override: InitSpec | None = None) -> InitFn:
    """The store's own deterministic init (:func:`kelp.store.policy.initial_rows.init_rows`) for every
    table of ``spec``.

    Using the very function the store uses means the baseline and a store-backed
    trainer start from bit-identical rows, which the equivalence oracle relies on.
    ``override`` replaces each table's :class:`InitSpec` (tests use a larger std).
    """
    tables = {t.name: t for t in spec.tables}

    def init(table: str, ids: np.ndarray) -> np.ndarray:
        t = tables[table]
        return init_rows(override or t.init, table, ids, t.dim)

    return init


@dataclass(frozen=True)
class PreparedBatch:
    """A batch on the device plus, per table, the int64[U] rows of its unique ids in the in-memory tables."""

    batch: MicroBatch
    tensors: BatchTensors
    rows: dict[str, Tensor]


class _Table:
    """One in-memory table: a :class:`~kelp.store.rows.slots.SlotTable`, ``weight`` and ``state`` on the
    device.

    Slots are never freed here (the baseline keeps every id it trained), so a
    new id's row is the next slot, inserted with its init row; its state reads
    ``initial_state`` (the column's fill).
    """

    def __init__(self, dim: int, capacity: int, initial_state: float, device: torch.device) -> None:
        self.slots = SlotTable(
            {
                "weight": Column(torch.float32, width=dim, device=device),
                "state": Column(torch.float32, fill=initial_state, device=device),
            },
            capacity,
        )

    @property
    def weight(self) -> Tensor:
        return self.slots["weight"]

    @property
    def state(self) -> Tensor:
        return self.slots["state"]


class InMemoryBaseline:
    """All embeddings in memory; trains on pre-decoded micro-batches as fast as plain PyTorch allows.

    ``prepare`` (id lookup, new-row init, host-to-device copies) and
    ``train`` (forward, backward, both optimizers) are separate so a benchmark
    can time them apart; :meth:`step` does both.
    """

    def __init__(
        self,
        model: nn.Module,
        spec: FeatureSpec,
        config: TrainerConfig,
        device: torch.device,
        *,
        init_fn: InitFn | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        validator: ProgressiveValidator | None = None,
        initial_capacity: int = 1 << 14,
        sync_timings: bool = False,
    ) -> None:
        self.model = model.to(device)
        self.spec = spec
        self.device = device
        dims = {t.name: t.dim for t in spec.tables}
        self.init_fn = init_fn or spec_init(spec)
        self.optimizer = optimizer or build_dense_optimizer(self.model.parameters(), config.dense_optimizer)
        self.sparse_optimizer = RowWiseAdagrad.from_spec(config.sparse_optimizer)
        initial_state = config.sparse_optimizer.initial_accumulator
        self.tables = {t: _Table(dim, initial_capacity, initial_state, device) for t, dim in dims.items()}
        self.validator = validator
        self.sync_timings = sync_timings
        self.steps = 0

    def prepare(self, batch: MicroBatch) -> PreparedBatch:
        """Map each table's unique ids to rows (initialising new ones); move the batch to the device."""
        tensors = BatchTensors.from_batch(batch, self.spec, self.device)
        rows: dict[str, Tensor] = {}
        for name, ids in tensors.unique_ids.items():
            table = self.tables[name]
            idx = table.slots.lookup(ids)
            new = idx < 0
            if new.any():  # new ids get the next slots, holding their init rows (one copy to the device)
                idx[new] = table.slots.insert(ids[new], weight=self.init_fn(name, ids[new]))
            rows[name] = torch.from_numpy(idx).to(self.device, non_blocking=True)
        return PreparedBatch(batch, tensors, rows)

    def train(self, prepared: PreparedBatch) -> StepResult:
        """One step on a prepared batch; ``updates`` is empty (the tables were updated in place)."""
        timer = StageTimer(self.device, self.sync_timings)
        self.model.train()
        leaves = {
            name: self.tables[name].weight.index_select(0, idx).requires_grad_(True)
            for name, idx in prepared.rows.items()
        }
        self.optimizer.zero_grad(set_to_none=True)
        loss, logits = forward_backward(self.model, prepared.tensors, leaves)
        timer.lap("forward_backward")
        self.optimizer.step()
        timer.lap("dense_update")
        with torch.no_grad():
            for name, idx in prepared.rows.items():
                grad = leaves[name].grad
                if grad is None:
                    continue
                table = self.tables[name]
                new_rows, new_state = self.sparse_optimizer.step(
                    leaves[name], table.state.index_select(0, idx), grad
                )
                table.weight.index_copy_(0, idx, new_rows)
                table.state.index_copy_(0, idx, new_state)
        timer.lap("sparse_update")
        self.steps += 1
        return finish_step(
            timer,
            validator=self.validator,
            labels=prepared.batch.labels,
            loss=loss,
            logits=logits,
            updates={},
        )

    def step(self, batch: MicroBatch) -> StepResult:
        """``train(prepare(batch))``, with the preparation timed as ``to_device``."""
        timer = StageTimer(self.device, self.sync_timings)
        prepared = self.prepare(batch)
        timer.lap("to_device")
        result = self.train(prepared)
        result.timings["to_device"] = timer.timings["to_device"]
        return result

    def lookup(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows f32[n, dim], state f32[n])`` of ``ids`` already trained (inspection and tests)."""
        t = self.tables[table]
        idx = t.slots.lookup(np.asarray(ids, dtype=np.uint64))
        if (idx < 0).any():
            raise KeyError(f"table {table!r}: {int((idx < 0).sum())} id(s) never trained")
        index = torch.from_numpy(idx).to(self.device)
        return t.weight.index_select(0, index).cpu().numpy(), t.state.index_select(0, index).cpu().numpy()
