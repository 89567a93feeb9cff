"""Which config fields hold secrets, so no code path parses, echoes or prints their values.

A secret field is one typed ``SecretStr`` (``store.password``,
``source.security.sasl_password``, ``source.security.ssl_password``), or one
whose name says it is a secret (``password``, ``secret``, ``token``), wherever
it sits. The loader takes their ``KELP_...`` values verbatim (a password may
start with ``[`` or ``{``) and never shows their value in an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, SecretStr

__all__ = ["is_secret_field"]

_SECRET_NAME = re.compile(r"password|passwd|secret|token", re.IGNORECASE)


def is_secret_field(root: type[BaseModel], loc: Sequence[str | int]) -> bool:
    """Whether ``loc`` (field names and list indexes below ``root``) names a secret field.

    >>> from kelp.config import KelpConfig
    >>> is_secret_field(KelpConfig, ("store", "password"))
    True
    >>> is_secret_field(KelpConfig, ("source", "security", "sasl_password"))
    True
    >>> is_secret_field(KelpConfig, ("store", "username"))
    False
    """
    names = [part for part in loc if isinstance(part, str) and not part.isdigit()]
    if not names:
        return False
    if _SECRET_NAME.search(names[-1]) and not names[-1].endswith("_file"):
        return True
    models: list[type[BaseModel]] = [root]
    for i, name in enumerate(names):
        annotations = [m.model_fields[name].annotation for m in models if name in m.model_fields]
        if not annotations:
            return False
        if i == len(names) - 1:
            return any(_holds(a, SecretStr) for a in annotations)
        models = [m for a in annotations for m in _models_in(a)]
    return False


def _holds(annotation: Any, kind: type) -> bool:
    """Whether ``annotation`` is ``kind`` or a union or container of it."""
    if annotation is kind:
        return True
    return any(_holds(arg, kind) for arg in getattr(annotation, "__args__", ()) or ())


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation can hold (several for a union, the item model for a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) or () for m in _models_in(arg)]
