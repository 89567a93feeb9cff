"""``kelp store import``: a TorchRec-style state_dict's rows land in Redis with sensible admission metadata;
bad input is one line naming what is wrong."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.numpy import save_file
from serving.helpers import small_config

from kelp.cli.main import main
from kelp.config import KelpConfig
from kelp.daemon.row_import import read_rows_file, to_stored
from kelp.errors import UserError
from kelp.store.factory import build_store


def _config_file(cfg: KelpConfig, tmp_path: Path) -> Path:
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    return path


def test_import_a_torch_state_dict_then_read_the_rows_back(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = small_config(redis_url, tmp_path, trainer={"sparse_optimizer": {"initial_accumulator": 0.1}})
    config = _config_file(cfg, tmp_path)
    ads = torch.arange(20, dtype=torch.float32).reshape(5, 4) / 10
    state_dict = {
        "embedding_bags.t_ads.weight": ads,
        "embedding_bags.t_C3.weight": torch.ones(3, 4),
        "over_arch.bias": torch.zeros(4),
    }
    saved = tmp_path / "torchrec.pt"
    torch.save(state_dict, saved)
    argv = ["store", "import", "--config", str(config), "--table", "ads", str(saved)]

    assert main([*argv, "--tensor", "embedding_bags.t_ads.weight"]) == 0
    assert "imported 5 rows into ads" in capsys.readouterr().out
    before = int(time.time())
    with build_store(cfg.store, cfg.features.store_tables(), cfg.deployment) as store:
        got = store.pull("ads", np.arange(5, dtype=np.uint64), count=False)
        np.testing.assert_array_equal(got.rows, ads.numpy())
        np.testing.assert_allclose(got.state, 0.1)  # the configured initial accumulator
        scanned = [b for part in range(store.row_scan_parts()) for b in store.scan_rows("ads", part)]
    assert sorted(int(i) for b in scanned for i in b.ids) == [0, 1, 2, 3, 4]
    assert all((b.access_count == 1).all() for b in scanned)  # seen once, as an admitted row
    assert all((np.abs(b.updated_s.astype(np.int64) - before) <= 60).all() for b in scanned)  # "now"

    assert main([*argv, "--tensor", "embedding_bags.t_ads.weight"]) == 2  # rows there: refused
    assert "already holds rows; --replace" in capsys.readouterr().err
    assert main([*argv, "--tensor", "embedding_bags.t_C3.weight", "--replace"]) == 0
    with build_store(cfg.store, cfg.features.store_tables(), cfg.deployment) as store:
        got = store.pull("ads", np.arange(5, dtype=np.uint64), count=False)
    np.testing.assert_array_equal(got.rows[:3], np.ones((3, 4), np.float32))
    assert got.updated_s is not None and (got.updated_s[3:] == 0).all()  # the earlier rows were deleted


def test_bad_files_are_one_line_naming_the_problem(tmp_path: Path) -> None:
    cfg = small_config("redis://127.0.0.1:1", tmp_path)
    spec = {t.name: t for t in cfg.features.tables}["ads"]
    wide = tmp_path / "wide.safetensors"
    save_file({"ids": np.arange(3, dtype=np.uint64), "rows": np.zeros((3, 8), np.float32)}, str(wide))
    with pytest.raises(UserError, match="rows have dim 8, table 'ads' has dim 4"):
        to_stored(read_rows_file(wide), spec, cfg, wide)

    two = tmp_path / "two.pt"
    torch.save({"a.weight": torch.zeros(2, 4), "b.weight": torch.zeros(2, 4)}, two)
    with pytest.raises(
        UserError, match=r"2 2-D tensors; name the table's with --tensor \(a.weight, b.weight\)"
    ):
        read_rows_file(two)

    class Payload:  # a pickle that would run code: torch.load(weights_only=True) refuses it
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("unpickled",))

    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps(Payload(), protocol=2))
    with pytest.raises(UserError, match=r"neither safetensors nor a torch\.save file of tensors"):
        read_rows_file(evil)

    dup = tmp_path / "dup.safetensors"
    save_file({"ids": np.array([7, 7], np.uint64), "rows": np.zeros((2, 4), np.float32)}, str(dup))
    with pytest.raises(UserError, match="id 7 appears more than once"):
        to_stored(read_rows_file(dup), spec, cfg, dup)

    given = tmp_path / "given.safetensors"
    save_file(
        {
            "ids": np.array([3, 9], np.uint64),
            "rows": np.ones((2, 4), np.float64),
            "state": np.array([0.5, 2.0], np.float32),
        },
        str(given),
    )
    stored = to_stored(read_rows_file(given), spec, cfg, given)
    assert stored.rows.dtype == np.float32 and stored.state.tolist() == [0.5, 2.0]
