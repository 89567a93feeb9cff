"""The effective config as plain data, with secrets redacted, for ``kelp config show``.

Two kinds of secret are hidden: ``SecretStr`` fields (``store.password``...)
and the user-info part of any URL (``store.urls``, ``publisher.redis_url``,
``source.bootstrap_servers``...), see :mod:`kelp.redaction`.
"""

from __future__ import annotations

from typing import Any

from kelp.config.root import KelpConfig
from kelp.redaction import REDACTED, redact_text, redact_url

__all__ = ["REDACTED", "effective_config", "redact_text", "redact_url"]


def effective_config(cfg: KelpConfig) -> dict[str, Any]:
    """Every field with its effective value; ``SecretStr`` values and URL passwords replaced by a marker.

    Secrets set to ``None`` stay ``None`` so an operator can see a secret is
    *missing*, which is the usual question.
    """
    data = cfg.model_dump(mode="json")
    return _redact(cfg, data)


def _redact(model: Any, data: Any) -> Any:
    from pydantic import BaseModel, SecretStr

    if isinstance(model, BaseModel) and isinstance(data, dict):
        out: dict[str, Any] = {}
        for name, value in data.items():
            attr = getattr(model, name, None)
            if isinstance(attr, SecretStr):
                out[name] = REDACTED
            else:
                out[name] = _redact(attr, value)
        return out
    if isinstance(model, list) and isinstance(data, list):
        return [_redact(m, d) for m, d in zip(model, data, strict=True)]
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, list):
        return [_redact(None, d) for d in data]
    if isinstance(data, dict):
        return {k: _redact(None, v) for k, v in data.items()}
    return data
