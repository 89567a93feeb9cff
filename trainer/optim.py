"""Optimizers: row-wise Adagrad for embedding rows, a factory for the dense ones.

Sparse and dense parameters get different optimizers (Kraken, Persia).
Embedding rows use row-wise Adagrad, FBGEMM's ``EXACT_ROWWISE_ADAGRAD``: one
float of state per row instead of one per element, so a dim-16 row carries 4
bytes of optimizer state, not 64. For a row with gradient ``g`` [dim] and
state ``s``::

    s   <- s + mean(g ** 2)
    row <- row - lr * g / (sqrt(s) + eps)

The update is applied once per unique id per step (gradients of repeated ids
were already summed by backward). Only *admitted* ids are written back: a
not-admitted id read the table's default row, and its update is discarded by
contract with the store's admission policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from kelp.config import DenseOptimizerSpec, SparseOptimizerSpec

__all__ = ["RowWiseAdagrad", "SparseUpdate", "build_dense_optimizer"]


class SparseUpdate(NamedTuple):
    """What goes back to the store for one table: ``push(table, ids, rows, state)``.

    * ``ids``: uint64[K], admitted ids only (K <= U), in pull order;
    * ``rows``: float32[K, dim];
    * ``state``: float32[K].

    ``rows`` and ``state`` are numpy, or tensors on the trainer's device where the
    optimizer is ``on_device`` (a working copy takes them there).

    With ``RowWiseAdagrad(keep_grads=True)`` the gradients that made ``rows``
    travel beside it (``StepResult.grads``), for a store that applies them itself.
    """

    ids: np.ndarray
    rows: np.ndarray | Tensor
    state: np.ndarray | Tensor


@dataclass(frozen=True)
class RowWiseAdagrad:
    """Vectorised row-wise Adagrad over the rows a batch touched (tensors on any device)."""

    lr: float = 0.05
    eps: float = 1e-8
    keep_grads: bool = False
    """Also return each row's gradient (``store.sparse_updates: compose``)."""
    defer: bool = False
    """Return the rows as they were and their gradients, unapplied: in a trainer group each row's
    owner applies the step once, to every rank's gradients together (:mod:`kelp.daemon.row_owners`)."""
    on_device: bool = False
    """Return the stepped rows and state as tensors where they are (the trainer's device), not numpy:
    a working copy (:mod:`kelp.store.hot.working_copy`) writes them in place there."""

    @classmethod
    def from_spec(cls, spec: SparseOptimizerSpec) -> RowWiseAdagrad:
        return cls(lr=spec.lr, eps=spec.eps)

    @torch.no_grad()
    def step(self, rows: Tensor, state: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """New ``(rows f32[U, dim], state f32[U])``; inputs are not modified.

        A row whose gradient is all zeros keeps its row and state.
        """
        new_state = state + grad.square().mean(dim=1)
        new_rows = torch.addcdiv(rows, grad, (new_state.sqrt() + self.eps).unsqueeze(1), value=-self.lr)
        return new_rows, new_state

    @torch.no_grad()
    def update(
        self,
        ids: np.ndarray,
        rows: Tensor,
        state: Tensor,
        grad: Tensor | None,
        admitted: np.ndarray | None = None,
    ) -> SparseUpdate:
        """:meth:`update_with_grads` without the gradients."""
        return self.update_with_grads(ids, rows, state, grad, admitted)[0]

    @torch.no_grad()
    def update_with_grads(
        self,
        ids: np.ndarray,
        rows: Tensor,
        state: Tensor,
        grad: Tensor | None,
        admitted: np.ndarray | None = None,
    ) -> tuple[SparseUpdate, np.ndarray | None]:
        """Step the admitted rows and return them as numpy, ready to push (and their grads if kept).

        ``ids`` uint64[U], ``rows`` f32[U, dim], ``state`` f32[U], ``grad``
        f32[U, dim] (None when no gradient reached the table: nothing changes,
        rows are still returned so admitted ids are pushed consistently) and
        ``admitted`` bool[U] (None = all admitted). Rows of not-admitted ids
        are neither updated nor returned. With ``defer`` the rows come back as they were.
        """
        if admitted is not None and not admitted.all():
            keep = np.flatnonzero(admitted)
            index = torch.from_numpy(keep).to(rows.device, non_blocking=True)
            ids = ids[keep]
            rows, state = rows.index_select(0, index), state.index_select(0, index)
            grad = grad.index_select(0, index) if grad is not None else None
        grads = None
        if self.keep_grads or self.defer:
            grads = (
                np.zeros(tuple(rows.shape), np.float32)
                if grad is None
                else grad.to("cpu", torch.float32).numpy()
            )
        if grad is not None and not self.defer:
            rows, state = self.step(rows, state, grad)
        if self.on_device:
            return SparseUpdate(ids=ids, rows=rows.detach(), state=state.detach()), grads
        update = SparseUpdate(
            ids=ids,
            rows=rows.detach().to("cpu", torch.float32).numpy(),
            state=state.detach().to("cpu", torch.float32).numpy(),
        )
        return update, grads


def build_dense_optimizer(params: Iterable[Tensor], spec: DenseOptimizerSpec) -> torch.optim.Optimizer:
    """Adam, Adagrad or SGD over the model's dense parameters, as configured.

    ``weight_decay`` is the classic L2 term of each torch optimizer (not AdamW's decoupled decay).
    """
    params = list(params)
    if spec.kind == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.kind == "adagrad":
        return torch.optim.Adagrad(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.kind == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown dense optimizer {spec.kind!r}")
