"""The example configs shipped with Kelp, found the same way in a checkout and in an installed wheel.

The YAML files sit next to this module and travel as package data, so
``kelp demo`` and ``kelp bench`` never search parent folders for them::

    >>> example_path("criteo-synth.yaml").name
    'criteo-synth.yaml'

Relative paths inside an example (the Criteo samples under ``data/``)
are relative to the file; in an installed wheel point them elsewhere with an
env override, for example ``KELP_SOURCE__PATH=/data/train.tsv``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from kelp.errors import UserError

__all__ = ["data_dir", "example_names", "example_path"]


def example_names() -> list[str]:
    """File names of the shipped example configs."""
    return sorted(p.name for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def example_path(name: str) -> Path:
    """The path of one shipped example config; a :class:`UserError` naming the choices if unknown."""
    candidate = resources.files(__name__) / name
    if not candidate.is_file():
        raise UserError(f"no example config {name!r}; shipped: {', '.join(example_names())}")
    return Path(str(candidate))


def data_dir() -> Path:
    """The folder of the data samples shipped beside the examples (``data/``, see its README)."""
    return Path(str(resources.files(__name__) / "data"))
