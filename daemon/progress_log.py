"""The run's own record of learning: one JSON line per progress point, for ``kelp report``.

A user replaying a file for a few seconds has no Prometheus to look at; this
file is what ``kelp report RUN_DIR`` draws (windowed and cumulative AUC and log
loss over samples). It lives in the checkpoint directory (always writable by
the trainer), is appended to, and each line names its run (a resumed trainer
starts a new run: its progressive metrics start again)::

    {"run": "20261124T130501Z-4821", "t": 1764.., "step": 120, "samples": 30720,
     "fraction": 0.31, "auc_window": 0.71, "auc": 0.69, "log_loss_window": 0.60, "log_loss": 0.62,
     "samples_per_s": 25000.0}

With several labels (``features.labels``) a point also carries each task's
metrics under ``tasks``; the top-level metrics stay the first task's, so a
reader that knows nothing of tasks draws the first task as before, and a
one-task point is exactly the line above::

    {..., "auc": 0.69, ..., "tasks": {"click": {"auc_window": 0.71, "auc": 0.69,
     "log_loss_window": 0.60, "log_loss": 0.62}, "buy": {"auc_window": 0.83, ...}}}

Points are written at every 1% of a file source, every
``trainer.progress_every_s`` in which samples were trained (on a topic gone
quiet, one more point covers the last batch, then none until samples arrive),
and by samples (``trainer.progress_every_samples``; unset, whenever the samples
trained have grown by 5%, so a replay over in seconds still draws a curve); a
write that fails (full disk, read-only volume) is logged once and the record
stops, training does not.

A resumed trainer sets its AUC and log-loss gauges from the record's last point
(:func:`last_point`) before it trains, so they are there from the first scrape.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # typing only: kelp report reads records without importing the trainer (torch)
    from kelp.trainer.evaluation import AucResult

__all__ = [
    "METRICS",
    "PROGRESS_FILE",
    "ProgressLog",
    "last_point",
    "point_tasks",
    "read_progress",
    "task_fields",
]

PROGRESS_FILE = "progress.jsonl"
METRICS: tuple[str, ...] = ("auc_window", "auc", "log_loss_window", "log_loss")
"""The metrics of a point (top level: the first task's) and of each entry of its ``tasks``."""
log = logging.getLogger("kelp.train")


class ProgressLog:
    """Appends progress points to ``directory/progress.jsonl``; ``None`` directory: records nothing."""

    def __init__(self, directory: Path | None) -> None:
        self.path = Path(directory) / PROGRESS_FILE if directory is not None else None
        self.run = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"
        self.points = 0

    def write(self, **point: Any) -> None:
        if self.path is None:
            return
        doc = {"run": self.run, "t": round(time.time(), 3), **_finite(point)}
        # Top-level keys sorted (as always); ``tasks`` keeps config order, the order its curves are drawn in.
        line = json.dumps(dict(sorted(doc.items())))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError as exc:
            log.warning("progress record %s not written (%s); training goes on without it", self.path, exc)
            self.path = None
            return
        self.points += 1


def _finite(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Non-finite floats become null (JSON has no NaN), in nested maps too (``tasks``)."""
    return {
        k: _finite(v)
        if isinstance(v, Mapping)
        else (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in doc.items()
    }


def task_fields(results: Mapping[str, tuple[AucResult, AucResult]]) -> dict[str, dict[str, float]]:
    """A point's ``tasks``: task -> its metrics, from ``TaskValidators.results()`` (cumulative, windowed)."""
    return {
        task: {
            "auc_window": window.auc,
            "auc": total.auc,
            "log_loss_window": window.log_loss,
            "log_loss": total.log_loss,
        }
        for task, (total, window) in results.items()
    }


def point_tasks(point: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """task -> its :data:`METRICS` at ``point`` (NaN where null or missing); ``{}`` for a one-task point."""
    tasks = point.get("tasks")
    if not isinstance(tasks, Mapping):
        return {}
    return {
        str(task): {k: _number(m.get(k) if isinstance(m, Mapping) else None) for k in METRICS}
        for task, m in tasks.items()
    }


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def read_progress(path: Path) -> dict[str, list[dict[str, Any]]]:
    """``{run: [points...]}`` in file order from a progress file; unreadable lines are skipped."""
    runs: dict[str, list[dict[str, Any]]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                point = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if isinstance(point, dict) and "run" in point and "samples" in point:
                runs.setdefault(str(point["run"]), []).append(point)
    return runs


_TAIL_BYTES = 1 << 16  # many points: the last one is never longer (a point per task, a few dozen tasks)


def last_point(path: Path | None) -> dict[str, Any] | None:
    """The last readable point of a progress file; None without one (no file, empty, unreadable).

    Reads only the file's tail: a long-lived trainer's record grows by a point
    every ``progress_every_s`` and is read at every start.
    """
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - _TAIL_BYTES))
            tail = fh.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            point = json.loads(line)
        except ValueError:
            continue  # cut short by a crash, or the partial first line of the tail
        if isinstance(point, dict) and "run" in point and "samples" in point:
            return point
    return None
