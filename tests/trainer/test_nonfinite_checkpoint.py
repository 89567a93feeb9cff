"""A checkpoint holding NaN or an infinity is refused before anything is written; the previous one stays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kelp.trainer.checkpoint import load_latest, save_checkpoint
from kelp.trainer.finite import NonFiniteError
from kelp.trainer.models import build_model
from kelp.trainer.optim import build_dense_optimizer

from .conftest import model_input, small_config, small_spec


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    spec, config = small_spec(), small_config(dense_optimizer={"kind": "adam", "lr": 0.01})
    model = build_model(spec, config)
    opt = build_dense_optimizer(model.parameters(), config.dense_optimizer)
    for _ in range(2):
        opt.zero_grad()
        model(model_input(torch.randn(4, 3), [torch.randn(4, d) for d in (4, 4, 8)])).sum().backward()
        opt.step()
    return model, opt


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("where", ["model", "optimizer"])
def test_nonfinite_checkpoint_is_refused_and_the_previous_one_stays(tmp_path: Path, where: str) -> None:
    model, opt = _trained()
    good = save_checkpoint(tmp_path, model, opt, step=1, config_hash="x")
    before = _files(tmp_path)
    with torch.no_grad():
        if where == "model":
            name, tensor = next(iter(model.state_dict().items()))
            expected = f"model.{name}"
        else:
            tensor = opt.state_dict()["state"][0]["exp_avg_sq"]
            expected = "optim.0.exp_avg_sq"
        tensor.view(-1)[0] = float("inf") if where == "optimizer" else float("nan")

    with pytest.raises(NonFiniteError, match=f"checkpoint at step 2 refused: tensor '{expected}'") as caught:
        save_checkpoint(tmp_path, model, opt, step=2, config_hash="x")

    assert caught.value.tensor == expected and not caught.value.retriable
    assert _files(tmp_path) == before  # nothing written, not even a temp file
    assert json.loads((tmp_path / "latest").read_text())["file"] == good.name
    restored_model, restored_opt = _trained()
    info = load_latest(tmp_path, restored_model, restored_opt)
    assert info is not None and info.step == 1
    assert all(bool(torch.isfinite(t).all()) for t in restored_model.state_dict().values())
