from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open

from kelp.config import AdmissionSpec
from kelp.errors import UserError
from kelp.trainer.checkpoint import FORMAT_VERSION, config_hash, load_latest, save_checkpoint
from kelp.trainer.models import build_model
from kelp.trainer.optim import build_dense_optimizer

from .conftest import model_input, small_config, small_spec


def _trained(kind: str = "adam", seed: int = 0):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    spec, config = small_spec(), small_config(dense_optimizer={"kind": kind, "lr": 0.01})
    model = build_model(spec, config)
    opt = build_dense_optimizer(model.parameters(), config.dense_optimizer)
    for _ in range(3):
        opt.zero_grad()
        model(model_input(torch.randn(4, 3), [torch.randn(4, d) for d in (4, 4, 8)])).sum().backward()
        opt.step()
    return spec, config, model, opt


def _inputs():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(5)
    return torch.randn(6, 3, generator=g), [torch.randn(6, d, generator=g) for d in (4, 4, 8)]


@pytest.mark.parametrize("kind", ["adam", "adagrad", "sgd"])
def test_round_trip(tmp_path, kind: str) -> None:  # type: ignore[no-untyped-def]
    spec, config, model, opt = _trained(kind)
    digest = config_hash(spec, config)
    offsets = {("events", 0): 120, ("events", 3): 81}
    path = save_checkpoint(tmp_path, model, opt, step=7, config_hash=digest, offsets=offsets)

    _, _, fresh, fresh_opt = _trained(kind, seed=1)
    info = load_latest(tmp_path, fresh, fresh_opt, expected_config_hash=digest)
    assert info is not None and info.path == path
    assert info.step == 7 and info.offsets == offsets and info.format_version == FORMAT_VERSION
    dense, pooled = _inputs()
    torch.testing.assert_close(
        fresh(model_input(dense, pooled)), model(model_input(dense, pooled)), rtol=0, atol=0
    )
    want, got = opt.state_dict(), fresh_opt.state_dict()
    assert json.dumps(want["param_groups"]) == json.dumps(got["param_groups"])
    assert want["state"].keys() == got["state"].keys()
    for pid, entry in want["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(got["state"][pid][key], value, rtol=0, atol=0)
    # One more identical step keeps them identical (optimizer state really restored).
    for m, o in ((model, opt), (fresh, fresh_opt)):
        o.zero_grad()
        m(model_input(dense, pooled)).sum().backward()
        o.step()
    torch.testing.assert_close(
        fresh(model_input(dense, pooled)), model(model_input(dense, pooled)), rtol=0, atol=0
    )


def test_file_is_safetensors_not_pickle(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _spec, _config, model, opt = _trained()
    path = save_checkpoint(tmp_path, model, opt, step=1, config_hash="x")
    assert not path.read_bytes().startswith(b"\x80")  # pickle protocol marker
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["kelp"])
        assert meta["format_version"] == FORMAT_VERSION and meta["step"] == 1
        keys = list(f.keys())
        assert "model.top.0.weight" in keys
        assert any(k.startswith("optim.") and k.endswith(".exp_avg") for k in keys)


def test_keeps_last_k_and_ignores_leftover_temp_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec, config, model, opt = _trained()
    for step in range(1, 6):
        save_checkpoint(tmp_path, model, opt, step=step, config_hash="x", keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-000000000004.safetensors", "ckpt-000000000005.safetensors", "latest"]
    # A crash mid-write leaves a temp file; it must never become what `latest` names.
    (tmp_path / ".ckpt-000000000009.safetensors.abc.tmp").write_bytes(b"partial")
    (tmp_path / ".latest.abc.tmp").write_bytes(b'{"file": ".ckpt-000000000009.safetensors.abc.tmp"}')
    info = load_latest(tmp_path, build_model(spec, config))
    assert info is not None and info.step == 5
    save_checkpoint(tmp_path, model, opt, step=6, config_hash="x", keep=2)
    assert not list(tmp_path.glob(".*.tmp"))


def test_failed_write_keeps_previous_latest(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    spec, config, model, opt = _trained()
    save_checkpoint(tmp_path, model, opt, step=1, config_hash="x")
    real_replace = os.replace

    def crash(src, dst):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, model, opt, step=2, config_hash="x")
    monkeypatch.setattr(os, "replace", real_replace)
    assert not list(tmp_path.glob(".*.tmp"))
    info = load_latest(tmp_path, build_model(spec, config))
    assert info is not None and info.step == 1


def test_mismatches_are_user_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _spec, _config, model, opt = _trained()
    assert load_latest(tmp_path, model) is None
    path = save_checkpoint(tmp_path, model, opt, step=1, config_hash="abc")
    with pytest.raises(UserError, match=r"to start fresh, set another trainer\.checkpoint_dir"):
        load_latest(tmp_path, model, expected_config_hash="def")
    sgd = build_dense_optimizer(
        model.parameters(), small_config().dense_optimizer.model_copy(update={"kind": "sgd"})
    )
    with pytest.raises(UserError, match="Adam"):
        load_latest(tmp_path, model, sgd)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="checksum"):
        load_latest(tmp_path, model)


def test_config_hash_tracks_model_shape() -> None:
    spec = small_spec()
    assert config_hash(spec, small_config()) == config_hash(spec, small_config(device="cpu"))
    assert config_hash(spec, small_config()) != config_hash(spec, small_config(top_mlp=[32]))
    assert np.char.isalnum(config_hash(spec, small_config()))


def test_the_fingerprint_covers_what_gives_stored_state_its_meaning() -> None:
    """Admission, dims, tables and the model change the fingerprint; a log interval does not."""
    spec, config, _model, _opt = _trained()
    base = config_hash(spec, config)
    table = spec.tables[0]
    for changed in (
        spec.model_copy(
            update={"tables": [table.model_copy(update={"dim": table.dim * 2}), *spec.tables[1:]]}
        ),
        spec.model_copy(
            update={
                "tables": [
                    table.model_copy(update={"admission": AdmissionSpec(min_count=3)}),
                    *spec.tables[1:],
                ]
            }
        ),
    ):
        assert config_hash(changed, config) != base
    assert config_hash(spec, config.model_copy(update={"model": "dcn-v2"})) != base
    assert config_hash(spec, config.model_copy(update={"log_every_s": 99.0})) == base
