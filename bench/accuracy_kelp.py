"""Kelp's side of ``kelp bench accuracy``: the shipped example configs pointed at the data, the daemon run.

:func:`example_data` is the example config as a plain mapping (for a suite
that changes more than :func:`kelp_config`'s options, such as the two-task run
of :mod:`kelp.bench.accuracy_tasks`); :func:`train_daemon` runs ``kelp train``'s
daemon to the end of the file and keeps every sample's pre-update logits, per
task when there are several.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kelp.bench.streams import CRITEO_ATTRIBUTION, MOVIELENS, stream_folder
from kelp.config import KelpConfig, parse_config
from kelp.daemon.train import TrainDaemon
from kelp.examples import example_path
from kelp.trainer.evaluation import exact_auc, log_loss_from_logits

__all__ = ["EXAMPLES", "Trained", "default_data_dir", "example_data", "kelp_config", "train_daemon"]

EXAMPLES = {CRITEO_ATTRIBUTION: "criteo-attribution.yaml", MOVIELENS: "movielens-100k.yaml"}


@dataclass
class Trained:
    """One run's per-sample labels and pre-update logits, plus what the store held at the end.

    ``labels`` and ``logits`` are the first task's; with several tasks,
    ``task_labels`` and ``task_logits`` hold every task's (config order) and
    ``task_binned_auc`` the daemon's own progressive AUC of each (its summary).
    """

    labels: np.ndarray
    logits: np.ndarray
    validator_auc: float = math.nan
    rows_stored: int = 0
    rows_peak: int = 0
    counters: int = 0
    task_labels: dict[str, np.ndarray] = field(default_factory=dict)
    task_logits: dict[str, np.ndarray] = field(default_factory=dict)
    task_binned_auc: dict[str, float] = field(default_factory=dict)

    @property
    def auc(self) -> float:
        return exact_auc(self.labels, self.logits)

    @property
    def log_loss(self) -> float:
        return float(log_loss_from_logits(self.labels, self.logits).mean())


def default_data_dir() -> Path:
    """``$KELP_DATA_DIR``, else ``../shared/data`` beside this checkout (this repository's CI data)."""
    if os.environ.get("KELP_DATA_DIR"):
        return Path(os.environ["KELP_DATA_DIR"])
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def example_data(
    stream: str, data_dir: Path, work: Path, limit: int | None, **changes: Any
) -> dict[str, Any]:
    """The shipped example for ``stream`` as a mapping, on ``data_dir``, embedded (no HTTP, no publisher).

    ``changes``: ``model``, ``prefetch``, ``init_std`` and ``admission`` / ``eviction``
    (every table's), for the experiments and the sweep. Admission and eviction are
    off unless asked for, so the headline runs compare with a reference that has neither.
    """
    data = yaml.safe_load(example_path(EXAMPLES[stream]).read_text(encoding="utf-8"))
    source = data["source"]
    folder = stream_folder(stream, data_dir)
    source["path"] = str(folder / Path(source["path"]).name)
    for join in source.get("csv", {}).get("joins", []):
        join["path"] = str(folder / Path(join["path"]).name)
    if limit is not None:
        source["limit"] = limit
    defaults = data["features"]["table_defaults"]
    defaults["admission"] = changes.get("admission", {"min_count": 1})
    defaults["eviction"] = changes.get("eviction", {})
    if "init_std" in changes:
        defaults["init"] = {**defaults.get("init", {}), "std": changes["init_std"]}
    trainer = data["trainer"]
    trainer["model"] = changes.get("model", trainer["model"])
    trainer["checkpoint_dir"] = str(work / f"ckpt-{os.urandom(4).hex()}")
    trainer["prefetch_batches"] = changes.get("prefetch", 2)
    trainer["log_every_s"] = 3600.0
    data["publisher"] = {"enabled": False}
    data["metrics"] = {"enabled": False}
    data["logging"] = {"level": "warning", "format": "text"}
    return data


def kelp_config(stream: str, data_dir: Path, work: Path, limit: int | None, **changes: Any) -> KelpConfig:
    """:func:`example_data`, parsed."""
    return parse_config(
        example_data(stream, data_dir, work, limit, **changes), f"bench accuracy {stream}", environ={}
    )


def train_daemon(cfg: KelpConfig) -> Trained:
    """Kelp as a user runs it: the ``kelp train`` daemon (prefetch, write-behind, ledger), file to end."""
    tasks = cfg.features.task_names()
    labels: dict[str, list[np.ndarray]] = {t: [] for t in tasks}
    logits: dict[str, list[np.ndarray]] = {t: [] for t in tasks}

    def on_step(_step: int, batch: Any, result: Any) -> None:
        labels[tasks[0]].append(batch.labels)
        logits[tasks[0]].append(result.logits)
        for task in tasks[1:]:
            labels[task].append(batch.extra_labels[task])
            logits[task].append(result.task_logits[task])

    quiet = logging.getLogger("kelp")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # dozens of runs: the bench's own progress lines are enough
    try:
        report = TrainDaemon(cfg, http=False, publish=False, on_step=on_step, origin="bench").run()
    finally:
        quiet.setLevel(level)
    by_task = {t: np.concatenate(labels[t]) for t in tasks}
    logits_by_task = {t: np.concatenate(logits[t]) for t in tasks}
    several = len(tasks) > 1
    summary_tasks = report.summary.tasks if report.summary is not None else {}
    return Trained(
        by_task[tasks[0]],
        logits_by_task[tasks[0]],
        validator_auc=report.auc,
        task_labels=by_task if several else {},
        task_logits=logits_by_task if several else {},
        task_binned_auc={t: m["auc"] for t, m in summary_tasks.items()} if several else {},
    )
