"""The Redis backends (``redis``, ``redis-cluster``): connections, key layouts, the stores and their scripts.

The wire code (:mod:`kelp.store.redis._wire`) is private to this package; the
import contract in ``pyproject.toml`` keeps it so. The benchmarks measure that
wire as the stores use it, so the few names they need are lent here, loaded on
first use: importing :mod:`kelp.store.redis.connection` (the publish channel
does) should not pull in the packed pipeline.
"""

from __future__ import annotations

_WIRE = {
    "PackedPipeline": "kelp.store.redis._wire.packed_pipeline",
    "pack_commands": "kelp.store.redis._wire.packing",
    "pack_runs": "kelp.store.redis._wire.packing",
}


def __getattr__(name: str) -> object:
    """The wire names in ``_WIRE``, imported when first asked for."""
    if name in _WIRE:
        import importlib

        return getattr(importlib.import_module(_WIRE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
