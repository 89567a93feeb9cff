"""The trainer daemon on two labels: the summary and /metrics report each task's progressive AUC."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import generate_latest

from kelp.config import FeatureSpec, FileSourceConfig
from kelp.daemon.train import TrainDaemon

from .conftest import base_config

MODELS = Path(__file__).parent / "multitask_models"
ROWS = 3000


def write_events(path: Path) -> Path:
    """click follows d0 and buy follows d1, so both tasks are learnable; half the samples weigh 2."""
    rng = np.random.default_rng(11)
    with path.open("wb") as f:
        for i in range(ROWS):
            d0, d1 = (float(x) for x in rng.normal(size=2))
            event = {
                "d0": d0,
                "d1": d1,
                "user": int(rng.integers(0, 50)),
                "click": int(d0 + 0.3 * rng.normal() > 0),
                "buy": int(d1 + 0.3 * rng.normal() > 0),
                "w": 2.0 if i % 2 else 1.0,
            }
            f.write(orjson.dumps(event) + b"\n")
    return path


def test_summary_and_metrics_report_each_tasks_auc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(MODELS))
    cfg = base_config(tmp_path, model="two_heads:TwoHeads", model_args={})
    cfg.trainer.dense_optimizer.lr = 0.05
    cfg.features = FeatureSpec(
        labels=[{"name": "click"}, {"name": "buy", "loss_weight": 0.5}],
        dense=[{"name": "d0"}, {"name": "d1"}],
        sparse=[{"name": "user"}],
    )
    cfg.source = FileSourceConfig(
        path=write_events(tmp_path / "events.jsonl"),
        format="json",
        json={
            "label_field": "click",
            "labels": {"buy": "buy"},
            "weight_field": "w",
            "dense_fields": ["d0", "d1"],
            "sparse_fields": ["user"],
        },
    )

    def on_step(_step: int, batch: Any, _result: Any) -> None:
        assert set(batch.extra_labels) == {"buy"} and batch.weight is not None

    daemon = TrainDaemon(cfg, on_step=on_step)
    report = daemon.run()
    assert report.samples == ROWS
    summary = report.summary
    assert summary is not None and list(summary.tasks) == ["click", "buy"]
    for task, m in summary.tasks.items():
        assert m["auc"] > 0.8, (task, m)
    assert summary.tasks["click"]["auc"] == summary.auc  # the headline stays the first task's
    assert any(line.strip().startswith("task buy: AUC") for line in summary.lines())
    assert json.loads(summary.as_json())["tasks"]["buy"]["auc"] == pytest.approx(summary.tasks["buy"]["auc"])

    text = generate_latest(daemon.registry).decode()  # what /metrics serves (plus the rank label)
    for task in ("click", "buy"):
        line = next(
            ln
            for ln in text.splitlines()
            if ln.startswith(f'kelp_trainer_task_auc{{task="{task}",window="cumulative"}}')
        )
        assert math.isclose(float(line.rsplit(" ", 1)[1]), summary.tasks[task]["auc"], rel_tol=1e-9)
    assert 'kelp_trainer_auc{window="cumulative"}' in text  # the first task's, as before
