"""Optional bearer-token auth of the score endpoints, for clusters without a service mesh.

Off unless ``serving.auth_token_file`` names a file; then ``POST /v1/score``
and ``/v1/score/candidates`` need ``Authorization: Bearer <token>`` and answer
401 with a reason (``missing_token`` or ``wrong_token``) and
``WWW-Authenticate: Bearer`` otherwise, before the body is read. So do
``/v1/embeddings`` and the Open Inference Protocol's inference and metadata,
over REST and gRPC alike (:mod:`kelp.serving.oip.routes`). ``/healthz``,
``/readyz``, ``/metrics`` and the protocol's health checks stay open (probes and
scrapers carry no token).

The token is read from its file once at start (a Kubernetes Secret mounted as
a file), never from the config itself, so ``kelp config show`` cannot print
it. The comparison is :func:`hmac.compare_digest` on the whole header value,
so its time does not depend on how much of a guess was right.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

from kelp.errors import UserError

__all__ = ["BearerAuth", "load_token"]


def load_token(path: Path | None) -> bytes | None:
    """The token in ``serving.auth_token_file`` (surrounding whitespace dropped); None when auth is off."""
    if path is None:
        return None
    try:
        token = Path(path).read_bytes().strip()
    except OSError as exc:
        raise UserError(f"serving.auth_token_file: cannot read {path}: {exc.strerror}") from None
    if not token:
        raise UserError(f"serving.auth_token_file: {path} is empty")
    if any(b < 0x21 or b > 0x7E for b in token):
        raise UserError(f"serving.auth_token_file: {path} must hold one line of printable ASCII, no spaces")
    return token


class BearerAuth:
    """Checks a request's ``Authorization`` header value against the expected ``Bearer <token>``."""

    def __init__(self, token: bytes) -> None:
        self._expected = b"Bearer " + token

    def refusal(self, header: bytes | None) -> dict[str, Any] | None:
        """None when ``header`` carries the token, else the 401 body naming what was wrong."""
        if header is None or not header.startswith(b"Bearer "):
            return {
                "error": "missing_token",
                "detail": "this endpoint needs an 'Authorization: Bearer <token>' header",
            }
        if hmac.compare_digest(header, self._expected):
            return None
        return {"error": "wrong_token", "detail": "the bearer token is not the one this replica expects"}
