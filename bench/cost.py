"""What a trained sample costs the trainer's CPU and Redis, over the steady steps of a stream run.

``kelp bench train`` and ``kelp bench pipeline`` take a :class:`CostSnapshot`
when the steady window opens (after the first quarter of the run's steps, so
the warm-up, the first sightings of the hottest ids and the tier's first fill
stay out) and one after the drain, and report the difference per sample of
the window. The second snapshot comes after the drain, not at the last step,
because the hot tier writes its dirty rows back on its own schedule: a window
that closed before the last write-back would leave out writes its steps
caused, and the longer the write-back period, the more it would flatter the tier.

* ``trainer_cpu_us_per_sample``: the trainer process's CPU time (every
  thread) minus its model time (the step's ``forward_backward``,
  ``dense_update`` and ``sparse_update`` stages) and the drain's final
  checkpoint, i.e. what Kelp itself spends to feed the model. The stages
  are wall times; with one intra-op thread on the CPU that is the model's
  CPU time too.
* ``redis_cpu_us_per_sample``: ``used_cpu_user + used_cpu_sys`` of every
  redis-server (``INFO CPU``).
* ``redis_row_ops_per_sample``: rows the store's backend read, counted for
  admission or wrote (``kelp_store_backend_row_ops_total``), split into
  ``redis_row_reads_per_sample``, ``redis_row_counts_per_sample`` and
  ``redis_row_writes_per_sample``.
* ``cold_row_ops_per_sample``: the floor no cache can beat: each id the run
  had never seen before (so never stored) is read once and written once.
* ``flush_floor_row_ops_per_sample``: the floor for the write-back period in
  force: each first sighting read once, and every distinct id a period's
  steps trained written once per period (``flush_period_steps``: the
  configured steps, or fewer where ``writeback_interval_s`` ran out first at
  the window's step rate; periods aligned to the window's start). Split into
  ``flush_floor_reads_per_sample`` and ``flush_floor_writes_per_sample``.
* ``hot_tier_hit_rate``: the tier's hits over its lookups of rows that are
  already stored (lookups that reached the store and found a row, plus hits);
  first sightings and not-yet-admitted ids are left out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis
from prometheus_client import CollectorRegistry

from kelp.consumers.batch import MicroBatch
from kelp.store.metrics import counter_totals

__all__ = ["CostSnapshot", "cost_per_sample", "distinct_per_period", "first_sightings", "steady_start"]

_MODEL_STAGES = ("forward_backward", "dense_update", "sparse_update")
_ROW_OPS = ("read", "count", "write")


def steady_start(expected_steps: int) -> int:
    """The step after which the steady window opens: a quarter into the run (at least step 2)."""
    return max(2, expected_steps // 4)


def _sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    return registry.get_sample_value(name, labels or {}) or 0.0


def _redis_cpu_s(urls: Sequence[str]) -> float:
    total = 0.0
    for url in urls:
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            info: dict[str, Any] = client.info("cpu")  # type: ignore[assignment]
        finally:
            client.close()
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


@dataclass(frozen=True)
class CostSnapshot:
    """Cumulative counters at one moment of a run; two of them make a window."""

    step: int
    samples: int
    process_cpu_s: float
    model_s: float
    checkpoint_s: float
    redis_cpu_s: float
    row_ops: dict[str, float]
    """Backend rows by operation: ``read``, ``count``, ``write``."""
    hot_hits: float
    stored_reads: float
    """Rows the backend read and found (read minus misses): the tier's misses of stored rows."""
    hot_rows: float
    hot_bytes: float
    wall_s: float = 0.0
    """``time.perf_counter()`` when taken."""

    @classmethod
    def take(
        cls, registry: CollectorRegistry, redis_urls: Sequence[str], *, step: int, samples: int
    ) -> CostSnapshot:
        store = counter_totals(registry)
        return cls(
            step=step,
            samples=samples,
            process_cpu_s=time.process_time(),
            model_s=sum(
                _sample(registry, "kelp_trainer_stage_seconds_sum", {"stage": s}) for s in _MODEL_STAGES
            ),
            checkpoint_s=_sample(registry, "kelp_trainer_stage_seconds_sum", {"stage": "checkpoint"}),
            redis_cpu_s=_redis_cpu_s(redis_urls),
            row_ops={
                op: _sample(registry, "kelp_store_backend_row_ops_total", {"op": op}) for op in _ROW_OPS
            },
            hot_hits=store.get("hot_cache_hits", 0.0),
            stored_reads=store.get("rows_pulled", 0.0) - store.get("misses", 0.0),
            hot_rows=_sample(registry, "kelp_store_hot_cache_rows"),
            hot_bytes=_sample(registry, "kelp_store_hot_cache_bytes"),
            wall_s=time.perf_counter(),
        )


def first_sightings(batches: Sequence[MicroBatch]) -> np.ndarray:
    """int64[len(batches)]: per batch, its unique ids (all tables) that no earlier batch held."""
    counts = np.zeros(len(batches), dtype=np.int64)
    tables = {name for b in batches for name in b.tables}
    for name in sorted(tables):
        ids = [b.tables[name].unique_ids if name in b.tables else np.zeros(0, np.uint64) for b in batches]
        which = np.repeat(np.arange(len(batches)), [len(i) for i in ids])
        _, first = np.unique(np.concatenate(ids), return_index=True)
        counts += np.bincount(which[first], minlength=len(batches))
    return counts


def distinct_per_period(batches: Sequence[MicroBatch], period: int) -> int:
    """Distinct (table, id) pairs of each run of ``period`` consecutive batches, summed over the runs."""
    total = 0
    for at in range(0, len(batches), period):
        chunk = batches[at : at + period]
        for name in {n for b in chunk for n in b.tables}:
            ids = [b.tables[name].unique_ids for b in chunk if name in b.tables]
            total += len(np.unique(np.concatenate(ids)))
    return total


def cost_per_sample(
    start: CostSnapshot,
    end: CostSnapshot,
    batches: Sequence[MicroBatch],
    writeback: tuple[int, float] | None = None,
) -> dict[str, float | int]:
    """The window's figures per sample; ``batches``: every trained batch of the run, in order
    (step ``n`` trained ``batches[n - 1]``); ``writeback``: the hot tier's ``(every_steps,
    interval_s)``, for the flush floor (None: no tier, no floor)."""
    samples = end.samples - start.samples
    if samples <= 0:
        raise ValueError("the steady window holds no samples: the run was too short")
    cold = int(first_sightings(batches)[start.step : end.step].sum())
    hits = end.hot_hits - start.hot_hits
    stored_lookups = hits + (end.stored_reads - start.stored_reads)
    us = 1e6 / samples
    row_ops = {op: end.row_ops.get(op, 0.0) - start.row_ops.get(op, 0.0) for op in _ROW_OPS}
    out: dict[str, float | int] = {
        "steady_steps": end.step - start.step,
        "steady_samples": samples,
        "trainer_cpu_us_per_sample": round(
            (
                (end.process_cpu_s - start.process_cpu_s)
                - (end.model_s - start.model_s)
                - (end.checkpoint_s - start.checkpoint_s)
            )
            * us,
            2,
        ),
        "trainer_model_us_per_sample": round((end.model_s - start.model_s) * us, 2),
        "redis_cpu_us_per_sample": round((end.redis_cpu_s - start.redis_cpu_s) * us, 2),
        "redis_row_ops_per_sample": round(sum(row_ops.values()) / samples, 3),
        **{f"redis_row_{op}s_per_sample": round(n / samples, 3) for op, n in row_ops.items()},
        "cold_row_ops_per_sample": round(2 * cold / samples, 3),
    }
    steps = end.step - start.step
    if writeback is not None and steps > 0 and end.wall_s > start.wall_s:
        every, interval_s = writeback
        period = max(1, min(every, int(interval_s * steps / (end.wall_s - start.wall_s))))
        writes = distinct_per_period(batches[start.step : end.step], period)
        out["flush_period_steps"] = period
        out["flush_floor_reads_per_sample"] = round(cold / samples, 3)
        out["flush_floor_writes_per_sample"] = round(writes / samples, 3)
        out["flush_floor_row_ops_per_sample"] = round((cold + writes) / samples, 3)
    if stored_lookups > 0 and end.hot_rows > 0:
        out["hot_tier_hit_rate"] = round(hits / stored_lookups, 4)
        out["hot_tier_rows"] = int(end.hot_rows)
        out["hot_tier_bytes"] = int(end.hot_bytes)
    return out
