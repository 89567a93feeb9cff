"""``kelp bench accuracy``'s two-task runs: Kelp vs the reference, per task, on each stream of :data:`RUNS`.

Two streams, one definition each (:class:`TaskStream`), through the same code:

* criteo-attribution: ``click`` and ``conversion``, where the file has a
  ``conversion`` column (the sample Kelp ships has none: skipped);
* Taobao UserBehavior: ``engaged`` (any behaviour beyond a page view) and
  ``buy``, one sample per event, features user, item and category, in time
  order (ESMM-style engagement and purchase); skipped where the data folder
  lacks the file (Kelp does not ship it).

Kelp's ``kelp train`` daemon trains both labels (``features.labels``) with the
plug-in model of :mod:`kelp.bench.two_heads`; the plain PyTorch reference
(:mod:`kelp.bench.reference` with ``tasks``) trains the same network on the
same rows in the same order, and both are scored exactly, per task, from every
sample's pre-update logits (progressive validation), as the one-task parity is.

Kelp reads the stream as JSON Lines written here from the raw CSV: the CSV's
values as they are (ids as digit strings, which the one id rule reads as their
integers), rows in the stream's replay order, each task's label as a number.
JSON rather than the CSV itself because Taobao's labels are derived from the
behaviour column, which a CSV mapping reads only as it is, and one path then
serves every stream.
No parsing is shared with the reference's loader (:mod:`kelp.bench.streams`),
and the labels both sides trained are compared sample by sample.

Keys, each prefixed with the run's ``prefix`` (``criteo_attribution_multitask_``,
``taobao_multitask_``): ``samples``, and per task ``<task>_auc``,
``<task>_reference_auc``, ``<task>_auc_gap`` (Kelp minus reference),
``<task>_log_loss``, ``<task>_reference_log_loss``, ``<task>_binned_auc`` (the
daemon's own binned progressive AUC, its summary's) and ``<task>_positive_rate``;
null where undefined (a task with one class in the slice has no AUC). A run
whose file or label columns are missing trains nothing and reports
``<prefix>_skipped``, the reason.
"""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kelp.bench.accuracy_kelp import example_data, train_daemon
from kelp.bench.reference import ReferenceOptions, train_reference
from kelp.bench.runner import progress
from kelp.bench.streams import (
    CRITEO_ATTRIBUTION,
    CRITEO_ATTRIBUTION_TASKS,
    TAOBAO,
    TAOBAO_COLUMNS,
    TAOBAO_FILE,
    TAOBAO_POSITIVE_BEHAVIORS,
    TAOBAO_TASKS,
    Stream,
    load_stream,
    stream_folder,
)
from kelp.config import KelpConfig, parse_config
from kelp.plots import Curve, curve_from_logits
from kelp.trainer.evaluation import exact_auc, log_loss_from_logits

__all__ = [
    "CRITEO_ATTRIBUTION_RUN",
    "MODEL",
    "RUNS",
    "TAOBAO_RUN",
    "TaskStream",
    "events_from_csv",
    "multitask_config",
    "multitask_parity",
]

MODEL = "kelp.bench.two_heads:two_heads"
TOP_MLP = (256, 64)
WINDOW = 50 * 256

Row = Mapping[str, str]


@dataclass(frozen=True)
class TaskStream:
    """One two-task run: the stream, its raw file, how Kelp's JSON Lines come from that file's rows.

    ``rows`` reads the raw file in replay order, each row by column name;
    ``labels`` gives a row's label per task. Both are Kelp's side only: the
    reference reads the stream through :func:`kelp.bench.streams.load_stream`.
    ``hint`` ends a skip reason: how to get the data the run needs.
    """

    stream: str
    file: str
    prefix: str
    tasks: tuple[str, ...]
    sparse_columns: Mapping[str, str]
    rows: Callable[[Path], Iterable[Row]]
    labels: Callable[[Row], dict[str, float]]
    hint: str

    @property
    def title(self) -> str:
        """The PNG panel's title and the progress lines' prefix."""
        return f"{self.stream}, two tasks"


def _criteo_attribution_rows(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows.sort(key=lambda r: int(r["orig_row"]))
    return rows


def _criteo_attribution_labels(row: Row) -> dict[str, float]:
    return {task: float(row[task]) for task in CRITEO_ATTRIBUTION_TASKS}


def _taobao_rows(path: Path) -> Iterable[Row]:
    """File order: the file is already in time order, and the reference keeps it too."""
    with open(path, encoding="utf-8", newline="") as fh:
        yield from csv.DictReader(fh, fieldnames=TAOBAO_COLUMNS)


def _taobao_labels(row: Row) -> dict[str, float]:
    return {task: float(row["behavior"] in TAOBAO_POSITIVE_BEHAVIORS[task]) for task in TAOBAO_TASKS}


CRITEO_ATTRIBUTION_RUN = TaskStream(
    stream=CRITEO_ATTRIBUTION,
    file="train.csv.gz",
    prefix="criteo_attribution_multitask",
    tasks=CRITEO_ATTRIBUTION_TASKS,
    sparse_columns={f: f for f in ("cat1", "cat4", "cat6", "cat8", "cat9")},
    rows=_criteo_attribution_rows,
    labels=_criteo_attribution_labels,
    hint="the sample Kelp ships has only click; pass --data DIR with a criteo-attribution/train.csv.gz "
    "that has it",
)
TAOBAO_RUN = TaskStream(
    stream=TAOBAO,
    file=TAOBAO_FILE,
    prefix="taobao_multitask",
    tasks=TAOBAO_TASKS,
    sparse_columns={f: f for f in ("user", "item", "category")},
    rows=_taobao_rows,
    labels=_taobao_labels,
    hint=f"Kelp does not ship it (Tianchi's terms); pass --data DIR holding {TAOBAO}/{TAOBAO_FILE}",
)
RUNS = (CRITEO_ATTRIBUTION_RUN, TAOBAO_RUN)
"""Every two-task run ``kelp bench accuracy`` makes, in order."""


def events_from_csv(run: TaskStream, csv_path: Path, out: Path, limit: int | None) -> Path:
    """JSON Lines from ``run``'s raw file: one object a row, in replay order, the first ``limit``.

    Each object holds the sparse features (by feature name, the CSV's value as
    it is) and each task's label as a number.
    """
    with out.open("w", encoding="utf-8") as f:
        for row in itertools.islice(run.rows(csv_path), limit):
            event: dict[str, Any] = {name: row[column] for name, column in run.sparse_columns.items()}
            event.update(run.labels(row))
            f.write(json.dumps(event) + "\n")
    return out


def multitask_config(run: TaskStream, data_dir: Path, work: Path, limit: int | None) -> KelpConfig:
    """The shipped criteo-attribution example's tables, optimizers and batching, on ``run``'s features and
    tasks, read from JSON Lines.

    Every stream takes the one example's settings (dim 16, normal(0, 0.01)
    init, row-wise Adagrad, Adam, batch 256): the benchmark contract's, which
    the reference uses too; Taobao has no example of its own, as Kelp does not
    ship its data.
    """
    data = example_data(CRITEO_ATTRIBUTION, data_dir, work, limit, model=MODEL)
    data["deployment"] = run.stream
    features = data["features"]
    features.pop("label", None)
    features["sparse"] = [{"name": name} for name in run.sparse_columns]
    features["labels"] = [{"name": task, "kind": "binary"} for task in run.tasks]
    path = stream_folder(run.stream, data_dir) / run.file
    events = events_from_csv(run, path, work / f"{run.stream}-tasks.jsonl", limit)
    data["source"] = {
        "kind": "file",
        "format": "json",
        "path": str(events),
        "json": {
            "label_field": run.tasks[0],
            "labels": {t: t for t in run.tasks[1:]},
            "sparse_fields": list(run.sparse_columns),
        },
    }
    data["trainer"]["model_args"] = {"top_mlp": list(TOP_MLP)}
    return parse_config(data, f"bench accuracy {run.title}", environ={})


def _stream_or_reason(run: TaskStream, data_dir: Path, limit: int | None) -> Stream | str:
    """The stream's first ``limit`` samples, or why the run cannot happen (file or label column missing)."""
    path = stream_folder(run.stream, data_dir) / run.file
    if not path.is_file():
        return f"{path} not found ({run.hint})"
    stream = load_stream(run.stream, data_dir).head(limit)
    missing = [t for t in run.tasks if not stream.has_labels([t])]
    if missing:
        return f"{path} has no {', '.join(missing)} column ({run.hint})"
    return stream


def multitask_parity(
    run: TaskStream, data_dir: Path, work: Path, limit: int | None
) -> tuple[dict[str, Any], list[Curve]]:
    """The keys of this module's docstring for ``run``, and each side's windowed AUC curve per task."""
    prefix, tasks = run.prefix, run.tasks
    stream = _stream_or_reason(run, data_dir, limit)
    if isinstance(stream, str):
        progress(f"{run.title}: skipped: {stream}")
        return {f"{prefix}_skipped": stream}, []
    progress(
        f"{run.title} ({', '.join(tasks)}): Kelp (kelp train daemon, {MODEL}) and the reference, "
        f"{len(stream.labels)} samples"
    )
    kelp = train_daemon(multitask_config(run, data_dir, work, limit))
    ref = train_reference(stream, ReferenceOptions(kind="concat", top_mlp=TOP_MLP, tasks=tasks))
    out: dict[str, Any] = {f"{prefix}_samples": len(kelp.labels)}
    curves: list[Curve] = []
    for t, task in enumerate(tasks):
        labels, logits = kelp.task_labels[task], kelp.task_logits[task]
        ref_labels, ref_logits = ref.labels[:, t], ref.logits[:, t]
        if len(labels) != len(ref_labels) or not np.array_equal(labels, ref_labels):
            raise RuntimeError(
                f"{run.title}: {task}: Kelp and the reference did not train the same labels in the same order"
            )
        auc, ref_auc = exact_auc(labels, logits), exact_auc(ref_labels, ref_logits)
        key = f"{prefix}_{task}"
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
    """Rounded, or None (JSON null) where undefined: a task with one class so far has no AUC.

    Adding 0.0 turns a gap that rounds to -0.0 into 0.0, so the JSON never says ``-0.0``.
    """
    return round(float(x), digits) + 0.0 if math.isfinite(x) else None
