"""Errors a serving request can end in, each with its HTTP status and a machine-readable reason.

Raised by the scoring path and turned into ``{"error": reason, "detail": message}``
by the app's exception handlers. Bad input is always 4xx; 503 means the replica
cannot answer right now (no model yet, store unreachable) and a retry elsewhere
may succeed.
"""

from __future__ import annotations

from kelp.errors import KelpError

__all__ = ["BadRequestError", "NoModelError", "RequestError"]


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
