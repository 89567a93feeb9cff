"""``kelp config validate`` imports ``trainer.model`` and runs it once: a broken model is one line, exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from validate_run import run_validate

PLUGINS = Path(__file__).resolve().parents[1] / "trainer" / "plugin_models"
DATA = Path(__file__).resolve().parents[1] / "consumers" / "data"
CONFIG = (
    f"source: {{kind: file, path: {DATA / 'criteo_sample.tsv'}, format: criteo_tsv}}\n"
    "features:\n"
    "  dense: [" + ", ".join(f"{{name: I{i}}}" for i in range(1, 14)) + "]\n"
    "  sparse: [" + ", ".join(f"{{name: C{i}}}" for i in range(1, 27)) + "]\n"
    "publisher: {channel: filesystem, path: snapshots}\n"
)


def _validate(tmp_path: Path, model: str, args: str = "{}") -> subprocess.CompletedProcess[str]:
    text = CONFIG + f"trainer: {{model: '{model}', model_args: {args}}}\n"
    return run_validate(tmp_path, text, pythonpath=PLUGINS)


def test_a_user_model_on_pythonpath_validates(tmp_path: Path) -> None:
    result = _validate(tmp_path, "tiny_models:TwoTower", "{user_features: [C1], width: 4}")
    assert result.returncode == 0, result.stderr
    assert "model tiny_models:TwoTower ok (" in result.stdout and "source sha256:" in result.stdout


def test_a_built_in_name_still_validates(tmp_path: Path) -> None:
    result = _validate(tmp_path, "dcn-v2")
    assert result.returncode == 0, result.stderr
    assert "model kelp.trainer.models:dcn_v2 ok" in result.stdout


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("no_such_module_xyz:model", "cannot import module 'no_such_module_xyz'"),
        ("tiny_models:missing", "has no attribute 'missing'"),
        ("tiny_models:raising", "the factory raised RuntimeError: this factory always fails"),
        ("tiny_models:wrong_shape", "float32[2, 1], expected float32[2] logits"),
        ("tiny_models:TwoTower", "the factory raised TypeError"),  # user_features missing: wrong signature
    ],
)
def test_a_broken_model_is_one_line_naming_the_reference(tmp_path: Path, model: str, expected: str) -> None:
    result = _validate(tmp_path, model)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"trainer.model '{model}'" in lines[0] and expected in lines[0], lines[0]


def test_a_name_that_is_no_reference_is_refused_at_load(tmp_path: Path) -> None:
    result = _validate(tmp_path, "two-tower")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "trainer.model" in lines[0] and "package.module:attr" in lines[0], lines
