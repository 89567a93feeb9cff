"""SIGTERM for commands that start their own services (``kelp bench``, ``kelp demo``).

Python's default SIGTERM kills the process without unwinding, so the
redis-server and Tansu children that ``kelp.harness`` started would outlive it
(found after a benchmark was stopped by ``timeout``). Raising ``SystemExit``
instead runs every ``with`` block's exit: the services stop, then the command
exits 143 (128 + SIGTERM).
"""

from __future__ import annotations

import signal
from types import FrameType

__all__ = ["exit_cleanly_on_sigterm"]


def exit_cleanly_on_sigterm() -> None:
    """From now on SIGTERM unwinds the stack (stopping started services) and exits 143."""

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
