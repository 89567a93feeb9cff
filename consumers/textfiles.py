"""Opening data files: plain or gzip (by the ``.gz`` suffix), with a one-line error when it fails."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import IO

from kelp.consumers.errors import SourceUserError

__all__ = ["open_binary", "open_text"]


def open_binary(path: Path) -> IO[bytes]:
    """The bytes of ``path``, gunzipped when it ends in ``.gz``."""
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as exc:
        raise SourceUserError(f"{path}: cannot open: {exc.strerror or exc}") from None


def open_text(path: Path, encoding: str = "utf-8") -> IO[str]:
    """A text stream of ``path`` (universal newlines left to the csv module), gunzipped for ``.gz``."""
    return io.TextIOWrapper(open_binary(path), encoding=encoding, newline="")
