"""The model a replica serves, and the slot that swaps it atomically.

A request reads :attr:`ModelSlot.current` *once* and uses that
:class:`ServedModel` for its whole forward pass and for the version it reports.
A swap assigns a new object to the slot (one reference assignment, atomic in
CPython); requests already running keep the old model alive until they finish,
so no request fails or mixes two versions during a swap, and there is no lock
on the request path.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from torch import nn

from kelp.publish.snapshot import SnapshotManifest

__all__ = ["ModelSlot", "ServedModel"]


@dataclass(frozen=True)
class ServedModel:
    """A loaded, verified snapshot: the module (eval mode, no grads) and its manifest."""

    module: nn.Module
    manifest: SnapshotManifest

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def created_at(self) -> float:
        return self.manifest.created_at

    def age_s(self) -> float:
        return max(0.0, time.time() - self.manifest.created_at)

    def info(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "version": m.version,
            "created_at": m.created_at,
            "step": m.step,
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(m.offsets.items())],
            "checksum": m.checksum,
            "config_hash": m.config_hash,
            "model": dict(m.model),
        }


class ModelSlot:
    """Holds the current :class:`ServedModel`; ``set`` swaps, readers just read ``current``."""

    def __init__(self) -> None:
        self.current: ServedModel | None = None
        self._loaded = threading.Event()

    def set(self, model: ServedModel) -> ServedModel | None:
        """Swap in ``model``; returns the previous one."""
        previous, self.current = self.current, model
        self._loaded.set()
        return previous

    def wait(self, timeout_s: float) -> bool:
        """Block until a model is loaded (or the timeout); True if one is."""
        return self._loaded.wait(timeout_s)
