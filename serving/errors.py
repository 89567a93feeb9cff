"""Errors a serving request can end in, each with its HTTP status and a machine-readable reason.

Raised by the scoring path and turned into ``{"error": reason, "detail": message}``
by the app's exception handlers. Bad input is always 4xx; 503 means the replica
cannot answer right now (no model yet, store unreachable) and a retry elsewhere
may succeed.
"""

from __future__ import annotations

from typing import Any

from kelp.errors import KelpError

__all__ = ["BadRequestError", "NoModelError", "RequestError", "error_answer"]


class RequestError(KelpError):
    """A request that cannot be answered; ``status`` and ``reason`` go into the response."""

    status: int = 400

    def __init__(self, reason: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        if status is not None:
            self.status = status


class BadRequestError(RequestError):
    """The input is well-formed JSON but not acceptable (e.g. a dense value that transforms to NaN)."""

    status = 422


class NoModelError(RequestError):
    """No snapshot has been loaded yet."""

    status = 503
    retriable = True

    def __init__(self) -> None:
        super().__init__("no_model", "no model snapshot loaded yet")


def error_answer(exc: KelpError) -> tuple[int, dict[str, Any]]:
    """``(status, {"error": reason, "detail": message})`` for an error a score request ended in.

    A :class:`RequestError` carries its own status and reason. Any other
    :class:`KelpError` is operational (the store unreachable after the short
    serving retry...), not the client's: 503. One mapping for the FastAPI
    handlers and the score routes' dispatcher, so both answer alike.
    """
    if isinstance(exc, RequestError):
        return exc.status, {"error": exc.reason, "detail": str(exc)}
    return 503, {"error": "store_unavailable" if exc.retriable else "unavailable", "detail": str(exc)}
