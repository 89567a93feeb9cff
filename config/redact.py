"""The effective config as plain data, with secrets redacted, for ``kelp config show``.

Two kinds of secret are hidden: secret fields (``store.password``..., see
:mod:`kelp.config.secrets`) and the passwords inside any URL (``store.urls``,
``publisher.redis_url``, ``source.bootstrap_servers``...): the user-info part
and secret query parameters, see :mod:`kelp.redaction`. A string value that
holds ``://`` is redacted as one URL, so a password with spaces or quotes in it
is hidden whole.
"""

from __future__ import annotations

from typing import Any

from kelp.config.root import KelpConfig
from kelp.config.secrets import is_secret_field
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
            if isinstance(attr, SecretStr) or (
                isinstance(value, str) and is_secret_field(type(model), (name,))
            ):
                out[name] = REDACTED
            else:
                out[name] = _redact(attr, value)
        return out
    if isinstance(model, list) and isinstance(data, list):
        return [_redact(m, d) for m, d in zip(model, data, strict=True)]
    if isinstance(data, str):
        return redact_url(data) if "://" in data else data
    if isinstance(data, list):
        return [_redact(None, d) for d in data]
    if isinstance(data, dict):
        return {k: _redact(None, v) for k, v in data.items()}
    return data
