"""Samples the trainer's model raised on: dead letters for odd samples, a stop for a broken model.

The step finds the samples a model cannot train on (:mod:`kelp.trainer.isolate`)
and trains on the rest. :class:`ModelErrors` then decides, per batch:

* some samples failed, others trained: the failed ones go to the dead-letter
  topic as ``model_error`` (the exception as the detail), the sink is flushed,
  and the batch is committed like any other;
* every sample failed: the batch is *held*: neither dead-lettered nor committed.
  One such batch may be one odd sample arriving alone; the next batch that
  trains shows the model works, and the held batches are dead-lettered and
  committed with it. A step skipped for another reason (a non-finite loss)
  shows nothing, so they stay held; :meth:`ModelErrors.trained_through` keeps
  checkpoints from claiming them meanwhile;
* ``max_failed_batches`` such batches in a row: the model is broken, not the
  data. :class:`BrokenModelError` stops the trainer with one line; the held
  batches stay uncommitted and are read again once the model is fixed, so a
  broken model never dead-letters the stream.

A dead-lettered sample is re-encoded as a schema-v1 single-sample message (its
labels, weight, event time, dense values after transforms, and integer ids):
a micro-batch does not keep each sample's record, so the headers name the
batch's record ranges (``source_offsets``) rather than one offset.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kelp.config import FeatureSpec
from kelp.consumers.batch import MicroBatch
from kelp.consumers.codec import encode_sample
from kelp.consumers.deadletter import DeadLetterSink
from kelp.consumers.decode import Rejection
from kelp.errors import KelpError
from kelp.trainer.isolate import ModelErrorRows
from kelp.trainer.step import StepResult

__all__ = ["MAX_FAILED_BATCHES", "REASON", "BrokenModelError", "ModelErrors", "Verdict", "encode_row"]

log = logging.getLogger("kelp.train")

REASON = "model_error"
"""The dead-letter reason (``reason`` header, ``kelp_records_rejected_total{reason}``)."""

MAX_FAILED_BATCHES = 3
"""Batches in a row on which the model raised on every sample before the trainer stops."""


class BrokenModelError(KelpError):
    """The model raised on every sample of several batches in a row: it is broken, not the data."""


@dataclass(frozen=True)
class Verdict:
    """What to commit after a step: the batch itself unless ``hold``, and the ``released`` held batches."""

    hold: bool = False
    released: list[MicroBatch] = field(default_factory=list)


class ModelErrors:
    """Dead-letters the samples a model raised on, holds wholly failed batches, stops a broken model.

    ``sink`` builds the dead-letter sink on first use (a Kafka producer is made
    only if a model ever raises). Not thread-safe: the training thread calls it.
    """

    def __init__(
        self,
        spec: FeatureSpec,
        sink: Callable[[], DeadLetterSink],
        max_failed_batches: int = MAX_FAILED_BATCHES,
    ) -> None:
        if max_failed_batches < 1:
            raise ValueError(f"max_failed_batches must be >= 1, got {max_failed_batches}")
        self.spec = spec
        self.max_failed_batches = max_failed_batches
        self._make_sink = sink
        self._sink: DeadLetterSink | None = None
        self._held: list[tuple[MicroBatch, tuple[ModelErrorRows, ...]]] = []
        self.rejected = 0
        """Samples dead-lettered as ``model_error`` so far."""

    @property
    def held(self) -> int:
        """Batches held back: every sample failed, and no batch has trained since."""
        return len(self._held)

    def after(self, batch: MicroBatch, result: StepResult) -> Verdict:
        """Dead-letter what must be before the batch is committed; raises :class:`BrokenModelError`."""
        if result.skipped == REASON:
            return self._failed_whole(batch, result.model_errors)
        # This batch is committed, so the samples that failed in it are dead-lettered whatever the step
        # did with the rest; the held ones only once a step trains (a non-finite skip proves nothing).
        letters = [(batch, result.model_errors)] if result.model_errors else []
        released: list[MicroBatch] = []
        if result.skipped is None:
            letters += self._held
            released = [held for held, _ in self._held]
            self._held = []
        if letters:
            for failed_batch, parts in letters:
                self._dead_letter(failed_batch, parts)
            assert self._sink is not None
            self._sink.flush(30.0)  # before any commit that covers these records
        return Verdict(hold=False, released=released)

    def trained_through(self, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """``offsets`` (next record per partition) stopped at each partition's first held record.

        A held batch is neither trained nor dead-lettered, and the source commits
        nothing past it; a checkpoint or snapshot must not claim it either.
        """
        out = dict(offsets)
        for batch, _ in self._held:
            for r in batch.sources:
                key = (r.topic, r.partition)
                if key in out:
                    out[key] = min(out[key], r.first_offset)
        return out

    def _failed_whole(self, batch: MicroBatch, parts: tuple[ModelErrorRows, ...]) -> Verdict:
        error = parts[0].error if parts else "unknown error"
        if len(self._held) + 1 >= self.max_failed_batches:
            raise BrokenModelError(
                f"the model raised on every sample of {len(self._held) + 1} batch(es) in a row, "
                f"so it is broken, not the data: {error}. "
                "Those batches were neither dead-lettered nor committed: fix the model and restart"
            )
        self._held.append((batch, parts))
        log.warning(
            "the model raised on every sample of a %d-sample batch (%s); holding it uncommitted until a "
            "batch trains (then it is dead-lettered as %s), %d more such batch(es) in a row stop the trainer",
            batch.size,
            error,
            REASON,
            self.max_failed_batches - len(self._held) - 1,
        )
        return Verdict(hold=True)

    def _dead_letter(self, batch: MicroBatch, parts: Sequence[ModelErrorRows]) -> None:
        if self._sink is None:
            self._sink = self._make_sink()
        first = batch.sources[0] if batch.sources else None
        ranges = ",".join(f"{r.topic}:{r.partition}:{r.first_offset}-{r.last_offset}" for r in batch.sources)
        for part in parts:
            for row in part.rows.tolist():
                self._sink.reject(
                    Rejection(
                        REASON,
                        part.error,
                        first.topic if first is not None else "",
                        first.partition if first is not None else 0,
                        first.first_offset if first is not None else 0,
                        encode_row(batch, row, self.spec),
                        ranges=ranges,
                    )
                )
                self.rejected += 1

    def close(self) -> None:
        """Flush and close the sink, if one was made."""
        if self._sink is not None:
            self._sink.close()
            self._sink = None


def encode_row(batch: MicroBatch, row: int, spec: FeatureSpec) -> bytes:
    """Sample ``row`` of ``batch`` as a schema-v1 single-sample message (dense values as trained)."""
    tasks = spec.task_names()
    label = float(batch.labels[row])
    # Under each task's own name, so the message reads back under any config's label names.
    labels = {tasks[0]: label, **{t: float(batch.extra_labels[t][row]) for t in tasks[1:]}}
    sparse = {
        name: jag.values[int(jag.offsets[row]) : int(jag.offsets[row + 1])].tolist()
        for name, jag in batch.sparse.items()
    }
    ts = float(batch.event_ts[row])
    return encode_sample(
        label,
        dense=np.asarray(batch.dense[row], dtype=np.float64).tolist(),
        sparse=sparse,
        ts=None if math.isnan(ts) else ts,
        labels=labels,
        weight=None if batch.weight is None else float(batch.weight[row]),
    )
