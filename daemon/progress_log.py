"""The run's own record of learning: one JSON line per progress point, for ``kelp report``.

A user replaying a file for a few seconds has no Prometheus to look at; this
file is what ``kelp report RUN_DIR`` draws (windowed and cumulative AUC and log
loss over samples). It lives in the checkpoint directory (always writable by
the trainer), is appended to, and each line names its run (a resumed trainer
starts a new run: its progressive metrics start again)::

    {"run": "20261124T130501Z-4821", "t": 1764.., "step": 120, "samples": 30720,
     "fraction": 0.31, "auc_window": 0.71, "auc": 0.69, "log_loss_window": 0.60, "log_loss": 0.62,
     "samples_per_s": 25000.0}

Points are written at every 1% of a file source and every
``trainer.progress_every_s`` in which samples were trained (on a topic gone
quiet, one more point covers the last batch, then none until samples arrive);
a write that fails (full disk, read-only volume) is logged once and the record
stops, training does not.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["PROGRESS_FILE", "ProgressLog", "read_progress"]

PROGRESS_FILE = "progress.jsonl"
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
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in point.items()}
        line = json.dumps({"run": self.run, "t": round(time.time(), 3), **clean}, sort_keys=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError as exc:
            log.warning("progress record %s not written (%s); training goes on without it", self.path, exc)
            self.path = None
            return
        self.points += 1


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
