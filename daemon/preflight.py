"""What a process refuses before it starts, in one place, so ``kelp config validate`` refuses the same.

The config model checks what the config alone can tell (types, ranges,
cross-section rules). Some promises need a room's own knowledge: that a file
exists and its CSV header has the mapped columns (``kelp.consumers``), that the
chosen store backend can enforce every table's eviction settings
(``kelp.store``). :func:`preflight` gathers those checks; ``kelp train``,
``kelp serve`` and ``kelp config validate`` all call it, so validate can never
pass a config that train would refuse.
"""

from __future__ import annotations

import re
from typing import Literal

from kelp.config import KafkaSourceConfig, KelpConfig
from kelp.consumers.checks import check_source
from kelp.errors import ConfigError
from kelp.store import check_store_config

__all__ = ["Role", "preflight", "problems"]

Role = Literal["train", "serve", "join"]
"""Which process the config is for: a trainer reads the source; a serving replica does not, and talks to
Kafka only with ``serving.request_log`` on (so only then does it need the Kafka credentials); a joiner
reads and writes Kafka topics and keeps its waiting impressions in Redis."""


_TABLE_FIELD = re.compile(r"^features\.tables\[(\d+)\](.*)$")


def problems(cfg: KelpConfig, role: Role = "train") -> list[tuple[str, str]]:
    """``(field, message)`` for everything the given process would refuse (empty: good to go)."""
    found = list(check_source(cfg.source, cfg.features)) if role == "train" else []
    if role == "join":
        found += _join_problems(cfg)
    connects_to_kafka = role in ("train", "join") or cfg.serving.request_log.enabled
    if connects_to_kafka and isinstance(cfg.source, KafkaSourceConfig):
        missing = cfg.source.security.missing_credentials()
        if missing is not None:
            found.append(("source.security", missing))
    found += _as_written(cfg, check_store_config(cfg.store, list(cfg.features.tables)))
    return found


def _join_problems(cfg: KelpConfig) -> list[tuple[str, str]]:
    found = []
    if not isinstance(cfg.source, KafkaSourceConfig):
        found.append(
            ("source.kind", f"kelp join reads and writes Kafka topics; source.kind is {cfg.source.kind!r}")
        )
    if not cfg.join.actions:
        found.append(("join.actions", "no action topic: a join needs at least one (topic, task, window_s)"))
    if cfg.join.redis_url is None and cfg.store.backend != "redis":
        found.append(
            (
                "join.redis_url",
                f"the waiting impressions need a standalone Redis; store.backend is {cfg.store.backend!r}, "
                "so set join.redis_url",
            )
        )
    return found


def _as_written(cfg: KelpConfig, found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Problems of tables built from ``table_defaults`` point at ``table_defaults``, once for all of them.

    Those tables are appended to ``features.tables`` at load; the person wrote
    ``table_defaults``, so that is the field to name, in one line.
    """
    defaulted = cfg.features.defaulted_tables()
    out: list[tuple[str, str]] = []
    shared: dict[tuple[str, str], list[str]] = {}
    for field, message in found:
        match = _TABLE_FIELD.match(field)
        name = cfg.features.tables[int(match.group(1))].name if match else None
        if match is None or name not in defaulted:
            out.append((field, message))
            continue
        shared.setdefault((f"features.table_defaults{match.group(2)}", message), []).append(repr(name))
    for (field, message), names in shared.items():
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        out.append((field, f"{message} (tables {shown} take table_defaults)"))
    return out


def preflight(cfg: KelpConfig, origin: str = "config", role: Role = "train") -> None:
    """Raise one :class:`~kelp.errors.ConfigError` with a line per problem (``origin: field: message``)."""
    found = problems(cfg, role)
    if found:
        raise ConfigError("\n".join(f"{origin}: {field}: {message}" for field, message in found))
