"""What frequency admission costs on a long-tail stream, Kelp beside the reference.

Taobao UserBehavior (label ``engaged``: any behaviour beyond a page view; user,
item and category; 84% of items seen once) is where admission matters: at
``min_count`` 3 a tenth of its ids earn a row. For each ``min_count`` the
sweep trains, one pass in time order with the accuracy suite's settings:

* Kelp's ``deepfm`` on the trainer's step and an in-memory store (the sweep's
  :func:`~kelp.bench.accuracy.train_on_event_time`) in both first-order forms:
  ``per_id`` (each row's last element; tables of dim 17 hold the same 16-wide
  vector as the reference's) and the default ``projection`` (dim 16), the
  latter also with trained fallback rows (``FALLBACK_BUCKETS`` per table);
* the reference FM + MLP (:mod:`kelp.bench.reference`) with the same
  admission: a zero row, never trained, until an id's ``min_count``-th
  occurrence (that batch included).

Rows stored, the bytes they and the admission counters take in Redis (costs
measured on a real redis-server in the same run), AUC and log loss, each
against ``min_count`` 1 of the same side. The memory–AUC summary names, per
stream, the smallest ``min_count`` that keeps at most ``ROWS_TARGET`` of the
rows, and what it costs each side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kelp.bench.accuracy_tasks import TAOBAO_RUN, multitask_config
from kelp.bench.reference import ReferenceOptions, train_reference
from kelp.bench.runner import progress
from kelp.bench.streams import Stream
from kelp.config import KelpConfig
from kelp.trainer.evaluation import exact_auc, log_loss_from_logits

__all__ = ["ROWS_TARGET", "admission_sweep", "memory_auc", "taobao_config"]

ROWS_TARGET = 0.34
"""Kraken's claim: the same AUC with about a third of the rows."""


FIRST_ORDERS = ("per_id", "projection")
"""Both forms of DeepFM's first-order term, each swept; ``kelp bench accuracy`` summarises the default."""


def taobao_config(
    data_dir: Path, work: Path, limit: int | None, admission: Mapping[str, Any], first_order: str = "per_id"
) -> KelpConfig:
    """Taobao with one label (``engaged``), Kelp's ``deepfm``, every table with ``admission``.

    ``per_id`` tables are one wider (dim 17): the field vector stays 16 wide, as the reference's.
    """
    cfg = multitask_config(dataclasses.replace(TAOBAO_RUN, tasks=("engaged",)), data_dir, work, limit)
    cfg.trainer.model = "deepfm"
    cfg.trainer.model_args = {"first_order": first_order}
    for table in cfg.features.tables:
        table.admission = type(table.admission)(**{**table.admission.model_dump(), **admission})
        if first_order == "per_id":
            table.dim += 1
    return cfg


def _rows_at(stream: Stream, min_count: int) -> int:
    """Ids with at least ``min_count`` occurrences over the stream, summed over its features."""
    total = 0
    for f in range(stream.ids.shape[1]):
        _, counts = np.unique(stream.ids[:, f], return_counts=True)
        total += int((counts >= min_count).sum())
    return total


def admission_sweep(
    stream: Stream,
    config: Callable[[Mapping[str, Any], str], KelpConfig],
    train: Callable[[KelpConfig], Any],
    *,
    min_counts: Sequence[int],
    fallback_buckets: int,
    counter_ttl_s: float,
    costs: Mapping[str, float],
) -> list[dict[str, Any]]:
    """One entry per (first-order form, ``min_count``, fallback) for Kelp, each with the reference."""
    out: list[dict[str, Any]] = []
    base: dict[str, float] = {}
    variants = [(form, 0) for form in FIRST_ORDERS] + [("projection", fallback_buckets)]
    for k in min_counts:
        ref = train_reference(stream, ReferenceOptions(kind="deepfm", min_count=k))
        ref_auc = exact_auc(ref.labels, ref.logits)
        base.setdefault("reference", ref_auc)
        for form, fallback in variants:
            if fallback and k == 1:
                continue  # at min_count 1 no id needs a fallback row
            admission: dict[str, Any] = {"min_count": k, "counter_ttl_s": counter_ttl_s}
            if fallback:
                admission["fallback_buckets"] = fallback
            run = train(config(admission, form))
            if not np.array_equal(run.labels, ref.labels):
                raise RuntimeError(f"{stream.name}: Kelp and the reference did not train the same labels")
            base.setdefault(form, run.auc)
            entry = {
                "first_order": form,
                "min_count": k,
                "fallback": fallback,
                "rows_stored": run.rows_stored,
                "bytes_stored": round(
                    run.rows_stored * costs["bytes_per_row"] + run.counters * costs["bytes_per_counter"]
                ),
                "auc": round(float(run.auc), 4),
                "log_loss": round(float(run.log_loss), 4),
                "auc_cost": round(float(base[form] - run.auc), 4),
                "reference_rows": _rows_at(stream, k),
                "reference_auc": round(float(ref_auc), 4),
                "reference_log_loss": round(float(log_loss_from_logits(ref.labels, ref.logits).mean()), 4),
                "reference_auc_cost": round(float(base["reference"] - ref_auc), 4),
            }
            progress(
                f"  {stream.name} {form} min_count {k}{' + fallback' if fallback else ''}: "
                f"{run.rows_stored} rows, "
                f"AUC {entry['auc']} (cost {entry['auc_cost']}), reference {entry['reference_auc']} "
                f"(cost {entry['reference_auc_cost']})"
            )
            out.append(entry)
    return out


def memory_auc(sweep: Sequence[Mapping[str, Any]], first_order: str = "per_id") -> dict[str, Any]:
    """The smallest ``min_count`` (no fallback) keeping at most ``ROWS_TARGET`` of ``min_count`` 1's rows."""
    plain = [e for e in sweep if not e["fallback"] and e.get("first_order", first_order) == first_order]
    full = plain[0]["rows_stored"] if plain else 0
    for entry in plain:
        ratio = entry["rows_stored"] / full if full else float("nan")
        if ratio <= ROWS_TARGET:
            return {
                "min_count": entry["min_count"],
                "rows_ratio": round(ratio, 3),
                "auc_cost": entry["auc_cost"],
                "reference_auc_cost": entry["reference_auc_cost"],
            }
    return {"min_count": None, "rows_ratio": None, "auc_cost": None, "reference_auc_cost": None}
