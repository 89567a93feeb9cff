"""``kelp bench accuracy``'s two-task run: click and conversion on criteo-attribution, Kelp vs the reference.

Kelp's ``kelp train`` daemon trains both labels (``features.labels``) with the
plug-in model of :mod:`kelp.bench.two_heads`; the plain PyTorch reference
(:mod:`kelp.bench.reference` with ``tasks``) trains the same network on the
same rows in the same order, and both are scored exactly, per task, from every
sample's pre-update logits (progressive validation), as the one-task parity is.

Kelp reads the stream as JSON Lines written here from the raw CSV: its CSV
source keeps one label (docs/consumers.md), its JSON source maps several. The
file holds the CSV's values as they are (ids as digit strings, which the one id
rule reads as their integers), rows sorted by ``orig_row``; no parsing is shared
with the reference's loader, and the labels both sides trained are compared
sample by sample.

Keys, each prefixed ``criteo_attribution_multitask_``: ``samples``, and per task
(``click``, ``conversion``) ``<task>_auc``, ``<task>_reference_auc``,
``<task>_auc_gap`` (Kelp minus reference), ``<task>_log_loss``,
``<task>_reference_log_loss``, ``<task>_binned_auc`` (the daemon's own binned
progressive AUC, its summary's) and ``<task>_positive_rate``; null where
undefined (a task with one class in the slice has no AUC). A stream without
a ``conversion`` column (the sample Kelp ships has none) trains nothing and
reports ``criteo_attribution_multitask_skipped``, the reason.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from kelp.bench.accuracy_kelp import example_data, train_daemon
from kelp.bench.reference import ReferenceOptions, train_reference
from kelp.bench.runner import progress
from kelp.bench.streams import CRITEO_ATTRIBUTION, CRITEO_ATTRIBUTION_TASKS, Stream, stream_folder
from kelp.config import KelpConfig, parse_config
from kelp.plots import Curve, curve_from_logits
from kelp.trainer.evaluation import exact_auc, log_loss_from_logits

__all__ = ["MODEL", "PREFIX", "events_from_csv", "multitask_config", "multitask_parity"]

PREFIX = "criteo_attribution_multitask"
MODEL = "kelp.bench.two_heads:two_heads"
TOP_MLP = (256, 64)
WINDOW = 50 * 256


def events_from_csv(
    csv_path: Path, out: Path, sparse_columns: dict[str, str], tasks: tuple[str, ...], limit: int | None
) -> Path:
    """JSON Lines from criteo-attribution's CSV: one object a row, in ``orig_row`` order, the first ``limit``.

    Each object holds the sparse features (by feature name, the CSV's value as
    it is) and each task's label as a number.
    """
    with gzip.open(csv_path, "rt", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows.sort(key=lambda r: int(r["orig_row"]))
    with out.open("w", encoding="utf-8") as f:
        for row in rows[:limit]:
            event: dict[str, Any] = {name: row[column] for name, column in sparse_columns.items()}
            event.update({task: float(row[task]) for task in tasks})
            f.write(json.dumps(event) + "\n")
    return out


def multitask_config(data_dir: Path, work: Path, limit: int | None) -> KelpConfig:
    """The shipped criteo-attribution example with its labels as two tasks, read from JSON Lines."""
    tasks = CRITEO_ATTRIBUTION_TASKS
    data = example_data(CRITEO_ATTRIBUTION, data_dir, work, limit, model=MODEL)
    features = data["features"]
    features.pop("label", None)
    features["labels"] = [{"name": task, "kind": "binary"} for task in tasks]
    sparse_columns = dict(data["source"]["csv"]["sparse_columns"])
    events = events_from_csv(
        Path(data["source"]["path"]), work / "criteo-attribution-tasks.jsonl", sparse_columns, tasks, limit
    )
    data["source"] = {
        "kind": "file",
        "format": "json",
        "path": str(events),
        "json": {
            "label_field": tasks[0],
            "labels": {t: t for t in tasks[1:]},
            "sparse_fields": list(sparse_columns),
        },
    }
    data["trainer"]["model_args"] = {"top_mlp": list(TOP_MLP)}
    return parse_config(data, f"bench accuracy {CRITEO_ATTRIBUTION} two tasks", environ={})


def multitask_parity(
    stream: Stream, data_dir: Path, work: Path, limit: int | None
) -> tuple[dict[str, Any], list[Curve]]:
    """The keys of this module's docstring, and each side's windowed AUC curve per task for the PNG."""
    tasks = CRITEO_ATTRIBUTION_TASKS
    if not stream.has_labels(tasks):
        missing = [t for t in tasks if not stream.has_labels([t])]
        reason = (
            f"{stream_folder(CRITEO_ATTRIBUTION, data_dir) / 'train.csv.gz'} has no {', '.join(missing)} "
            f"column (the sample Kelp ships has only click); pass --data DIR with a criteo-attribution/ "
            f"train.csv.gz that has it"
        )
        progress(f"{CRITEO_ATTRIBUTION}: two-task run skipped: {reason}")
        return {f"{PREFIX}_skipped": reason}, []
    progress(
        f"{CRITEO_ATTRIBUTION}: two tasks ({', '.join(tasks)}), Kelp (kelp train daemon, {MODEL}) "
        f"and the reference, {len(stream.labels)} samples"
    )
    kelp = train_daemon(multitask_config(data_dir, work, limit))
    ref = train_reference(stream, ReferenceOptions(kind="concat", top_mlp=TOP_MLP, tasks=tasks))
    out: dict[str, Any] = {f"{PREFIX}_samples": len(kelp.labels)}
    curves: list[Curve] = []
    for t, task in enumerate(tasks):
        labels, logits = kelp.task_labels[task], kelp.task_logits[task]
        ref_labels, ref_logits = ref.labels[:, t], ref.logits[:, t]
        if len(labels) != len(ref_labels) or not np.array_equal(labels, ref_labels):
            raise RuntimeError(
                f"{task}: Kelp and the reference did not train the same labels in the same order"
            )
        auc, ref_auc = exact_auc(labels, logits), exact_auc(ref_labels, ref_logits)
        key = f"{PREFIX}_{task}"
        out[f"{key}_auc"] = _round(auc)
        out[f"{key}_reference_auc"] = _round(ref_auc)
        out[f"{key}_auc_gap"] = _round(auc - ref_auc)  # NaN - anything: null
        out[f"{key}_log_loss"] = _round(log_loss_from_logits(labels, logits).mean())
        out[f"{key}_reference_log_loss"] = _round(log_loss_from_logits(ref_labels, ref_logits).mean())
        out[f"{key}_binned_auc"] = _round(kelp.task_binned_auc.get(task, float("nan")))
        out[f"{key}_positive_rate"] = _round(float(labels.mean()), 5)
        curves += [
            curve_from_logits(f"Kelp {task}", labels, logits, WINDOW),
            curve_from_logits(f"reference {task}", ref_labels, ref_logits, WINDOW),
        ]
        progress(f"  {task}: AUC Kelp {out[f'{key}_auc']}, reference {out[f'{key}_reference_auc']}")
    return out, curves


def _round(x: float, digits: int = 4) -> float | None:
    """Rounded, or None (JSON null) where undefined: a task with one class so far has no AUC."""
    return round(float(x), digits) if math.isfinite(x) else None
