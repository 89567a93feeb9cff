"""Finding the samples a model cannot train on, so one odd sample does not stop the trainer.

A plug-in model may raise (or return the wrong shape) on one sample it was
never written for. Crashing would meet the same batch again after every
restart; dropping the batch would lose every good sample in it. So when a
step's forward or backward raises, :func:`isolate` retries the batch in halves,
down to single samples, and names the samples that fail on their own::

    [0 .. 4095] raises
      [0 .. 2047] trains                    (a probe: forward + backward, nothing applied)
      [2048 .. 4095] raises
        [2048 .. 3071] trains
        [3072 .. 4095] raises ... [3301] raises alone -> failed, with its exception

The number of probes is bounded (:func:`probe_budget`); parts left unresolved
when it runs out count as failed with the last exception they raised. Probes
change no parameter and no optimizer state; the step then trains once on the
samples that did not fail. :class:`ModelRaisedError` is what the step raises
internally to mark an exception as the model's; resource errors (out of
memory) are not the sample's fault and are never isolated.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from kelp.consumers.batch import JaggedIds, MicroBatch

__all__ = [
    "ModelErrorRows",
    "ModelRaisedError",
    "Subset",
    "describe",
    "is_model_error",
    "isolate",
    "probe_budget",
    "restore_buffers",
    "snapshot_buffers",
    "subset_pulled",
    "take_rows",
]

_DETAIL_CHARS = 500


class ModelRaisedError(Exception):
    """The model's forward or backward (or its output contract) raised ``error`` on a batch."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(describe(error))
        self.error = error


@dataclass(frozen=True)
class ModelErrorRows:
    """Samples of a batch (``rows``, int64 indexes) the model failed on, and the exception it raised."""

    rows: np.ndarray
    error: str


def describe(error: BaseException) -> str:
    """``Type: message (file:line in function)``, one line, truncated: a dead letter's detail.

    The place is the innermost frame of the traceback, usually the model's own
    code, so the user can find the line without a traceback in the log.
    """
    message = " ".join(str(error).split())
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ is not None else []
    if frames:
        last = frames[-1]
        text += f" ({last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name})"
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."


def is_model_error(error: Exception) -> bool:
    """True for an exception a sample may cause; False for running out of memory (never the sample's)."""
    return not isinstance(error, MemoryError | torch.OutOfMemoryError)


def probe_budget(n: int) -> int:
    """Probes allowed for a batch of ``n``: a few bad samples isolated, a broken model given up on soon.

    One bad sample costs two probes per halving (``2 * log2(n)``); the budget
    covers about four of them.
    """
    return 8 * max(1, int(n).bit_length())


def isolate(n: int, probe: Callable[[np.ndarray], None], budget: int, error: str) -> list[ModelErrorRows]:
    """The samples of a batch of ``n`` that fail on their own, found by halving.

    The whole batch failed with ``error``. ``probe(rows)`` runs the model on
    those rows and raises :class:`ModelRaisedError` if it fails. Returns the failing
    parts with the exception each raised; rows in no part trained in some
    probe. Parts still unresolved after ``budget`` probes are returned as
    failing, with the exception of the probe that last split them.
    """
    failed: list[ModelErrorRows] = []
    whole = np.arange(n, dtype=np.int64)
    if n == 1:
        return [ModelErrorRows(whole, error)]
    pending = [(half, error) for half in reversed(np.array_split(whole, 2))]
    probes = 0
    while pending:
        rows, error = pending.pop()
        if probes >= budget:
            failed.append(ModelErrorRows(rows, error))
            continue
        probes += 1
        try:
            probe(rows)
        except ModelRaisedError as exc:
            if len(rows) == 1:
                failed.append(ModelErrorRows(rows, str(exc)))
            else:
                pending += [(half, str(exc)) for half in reversed(np.array_split(rows, 2))]
    failed.sort(key=lambda part: int(part.rows[0]))
    return failed


def take_rows(batch: MicroBatch, rows: np.ndarray) -> MicroBatch:
    """The samples ``rows`` (sorted int64 indexes) of ``batch`` as a batch of their own (same sources)."""
    sparse: dict[str, JaggedIds] = {}
    for name, jag in batch.sparse.items():
        lengths = jag.lengths().astype(np.int64)
        picked = lengths[rows]
        starts = jag.offsets[:-1].astype(np.int64)[rows]
        new_starts = np.zeros(len(rows), dtype=np.int64)
        np.cumsum(picked[:-1], out=new_starts[1:])
        at = np.repeat(starts - new_starts, picked) + np.arange(int(picked.sum()), dtype=np.int64)
        sparse[name] = JaggedIds.from_lengths(jag.values[at], picked)
    return MicroBatch(
        labels=batch.labels[rows],
        dense=batch.dense[rows],
        event_ts=batch.event_ts[rows],
        sparse=sparse,
        table_features=batch.table_features,
        sources=list(batch.sources),
        extra_labels={task: column[rows] for task, column in batch.extra_labels.items()},
        weight=None if batch.weight is None else batch.weight[rows],
    )


@dataclass(frozen=True)
class Subset:
    """Pulled rows of the ids a sub-batch needs, cut from the whole batch's pull (``PulledRows``)."""

    rows: np.ndarray | torch.Tensor
    state: np.ndarray | torch.Tensor
    admitted: np.ndarray
    admitted_now: np.ndarray | None

    @classmethod
    def of(cls, got: Any, all_ids: np.ndarray, ids: np.ndarray) -> Subset:
        """``got`` (pulled for sorted unique ``all_ids``) restricted to ``ids``, a subset of them."""
        at = np.searchsorted(all_ids, ids)
        now = got.admitted_now
        return cls(
            rows=_take(got.rows, at),
            state=_take(got.state, at),
            admitted=np.asarray(got.admitted)[at],
            admitted_now=None if now is None else np.asarray(now)[at],
        )


def _take(values: np.ndarray | torch.Tensor, at: np.ndarray) -> np.ndarray | torch.Tensor:
    """``values[at]``, where they are (a working copy's rows are tensors on the trainer's device)."""
    if isinstance(values, torch.Tensor):
        return values.index_select(0, torch.from_numpy(at.astype(np.int64)).to(values.device))
    return np.asarray(values)[at]


def snapshot_buffers(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of the model's buffers (batch-norm statistics...): a failed forward may have moved them.

    Empty, and free, for a model without buffers (the built-ins).
    """
    return [(b, b.detach().clone()) for b in model.buffers()]


def restore_buffers(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Put back what :func:`snapshot_buffers` copied."""
    with torch.no_grad():
        for buffer, copy in saved:
            buffer.copy_(copy)


def subset_pulled(
    pulled: Mapping[str, Any], all_ids: Mapping[str, np.ndarray], ids: Mapping[str, np.ndarray]
) -> dict[str, Subset]:
    """Per table of ``ids``, the rows pulled for ``all_ids`` restricted to it."""
    return {table: Subset.of(pulled[table], all_ids[table], wanted) for table, wanted in ids.items()}
