"""The effective config as plain data, with secrets redacted, for ``kelp config show``."""

from __future__ import annotations

from typing import Any

from kelp.config.root import KelpConfig

__all__ = ["REDACTED", "effective_config"]

REDACTED = "**redacted**"


def effective_config(cfg: KelpConfig) -> dict[str, Any]:
    """Every field with its effective value; ``SecretStr`` values replaced by a marker.

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
    return data
