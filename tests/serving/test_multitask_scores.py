"""A two-task snapshot: the replica answers a score per task, and ``scores`` stays the first task's."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import torch

from kelp.trainer import build_model

from .helpers import serving, small_config

pytestmark = pytest.mark.integration

SOURCE = '''
import torch
from torch import nn


class Heads(nn.Module):
    """One linear head per task; with zero weights each task's logit is its head's bias."""

    def __init__(self, spec):
        super().__init__()
        self.tasks = spec.tasks
        width = len(spec.dense) + sum(spec.sparse.values())
        self.heads = nn.ModuleDict({t: nn.Linear(width, 1) for t in spec.tasks})

    def forward(self, batch):
        x = torch.cat([batch.dense, *batch.sparse.values()], dim=1)
        return {t: self.heads[t](x).squeeze(1) for t in self.tasks}
'''

BIAS = {"click": -1.0, "buy": 0.5}


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"heads_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    yield name
    sys.modules.pop(name, None)


def _sigmoid(x: float) -> float:
    return float(torch.sigmoid(torch.tensor(x)))


def test_a_two_task_snapshot_is_served_with_a_score_per_task(
    redis_url: str, tmp_path: Path, plugin: str
) -> None:
    cfg = small_config(
        redis_url,
        tmp_path,
        trainer={"model": f"{plugin}:Heads"},
        features={"labels": [{"name": "click"}, {"name": "buy", "loss_weight": 0.5}]},
    )
    model = build_model(cfg.features, cfg.trainer)
    with torch.no_grad():
        for task, head in model.heads.items():
            head.weight.zero_()
            head.bias.fill_(BIAS[task])
    with serving(cfg, model) as client:
        resp = client.post("/v1/score", json={"samples": [{}, {"sparse": {"C1": 3}}]})
        assert resp.status_code == 200, resp.text
        got = resp.json()
        assert got["scores"] == pytest.approx([_sigmoid(BIAS["click"])] * 2)
        assert got["scores_by_task"] == {
            "click": pytest.approx([_sigmoid(BIAS["click"])] * 2),
            "buy": pytest.approx([_sigmoid(BIAS["buy"])] * 2),
        }
        packed = client.post("/v1/score", json={"samples": [{}]}, headers={"accept": "application/msgpack"})
        assert msgpack.unpackb(packed.content)["scores_by_task"]["buy"] == pytest.approx(
            [_sigmoid(BIAS["buy"])]
        )


def test_a_one_task_response_has_no_scores_by_task(redis_url: str, tmp_path: Path) -> None:
    cfg = small_config(redis_url, tmp_path)
    with serving(cfg, build_model(cfg.features, cfg.trainer)) as client:
        got = client.post("/v1/score", json={"samples": [{}]}).json()
        assert len(got["scores"]) == 1 and "scores_by_task" not in got
