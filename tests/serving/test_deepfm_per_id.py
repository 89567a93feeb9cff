"""A ``deepfm`` with per-id first-order weights is served from its rows' last element, as it trained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kelp.store import build_store
from kelp.trainer import build_model

from .helpers import DEPLOYMENT, serving, small_config

pytestmark = pytest.mark.integration


def test_the_stored_rows_last_element_is_the_ids_first_order_weight(redis_url: str, tmp_path: Path) -> None:
    cfg = small_config(
        redis_url,
        tmp_path,
        trainer={"model": "deepfm", "model_args": {"first_order": "per_id"}},
        features={"tables": [{"name": "ads", "dim": 5}, {"name": "C3", "dim": 5}]},
    )
    model = build_model(cfg.features, cfg.trainer)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # every score is then sigmoid(the ids' first-order weights)
    store = build_store(cfg.store, cfg.features.store_tables(), DEPLOYMENT)
    try:
        row = np.zeros((1, 5), dtype=np.float32)
        row[0, 4] = 2.0
        store.push("C3", np.array([7], dtype=np.uint64), row, np.zeros(1, dtype=np.float32))
    finally:
        store.close()
    with serving(cfg, model) as client:
        got = client.post("/v1/score", json={"samples": [{"sparse": {"C3": 7}}, {"sparse": {"C3": 8}}]})
        assert got.status_code == 200, got.text
        assert got.json()["scores"] == pytest.approx([float(torch.sigmoid(torch.tensor(2.0))), 0.5])
