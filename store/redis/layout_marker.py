"""A deployment's row layout, recorded in Redis, so a changed setting never hides stored rows silently.

``store.layout`` decides where every row lives (:mod:`kelp.store.redis.keys`): one key
per row, or a field of one of ``buckets_per_table`` hashes. A process started
with another layout, or another bucket count, than the one that wrote the rows
would find none of them and start every row from its init value: months of
training gone without an error. So the first writer records the layout in
``kelp:<deployment>:layout`` (a small JSON string) and every later process
compares its own with it and refuses a mismatch with one line naming the
setting. Deployments written before the marker existed have none: then the
store looks for rows of the *other* layout with a bounded ``SCAN`` (a best
effort on a large shared database) before it writes the marker.

A marker Kelp cannot read (not JSON, not the shape it records, or not a string
key at all) stops the store with one line naming the key
(:class:`~kelp.store.errors.LayoutMarkerError`): guessing could hide every row.
Deleting the key lets the next writer record it again, after the probe above.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kelp.errors import ConfigError
from kelp.store.errors import LayoutMarkerError

__all__ = ["check_layout_marker", "marker_key"]

_PROBE_ROUNDS = 10  # SCAN calls per shard, COUNT 1000 each


def marker_key(deployment: str) -> str:
    return f"kelp:{deployment}:layout"


def check_layout_marker(
    deployment: str,
    mine: Mapping[str, Any],
    clients: Sequence[Any],
    foreign_patterns: Sequence[str],
) -> None:
    """Compare ``mine`` (``{"kind": ..., "buckets": {table: n}}``) with the recorded layout, or record it.

    ``clients[0]`` holds the marker; every client is probed with ``foreign_patterns``
    (SCAN MATCH patterns of the other layout's keys of this deployment) when no
    marker exists. Raises :class:`~kelp.errors.ConfigError` on a mismatch.
    """
    key = marker_key(deployment)
    raw = _get(clients[0], key)
    if raw is not None:
        recorded = _parse(key, raw)
        _compare(deployment, recorded, mine)
        new_tables = set(mine.get("buckets", {})) - set(recorded.get("buckets", {}))
        if new_tables:  # tables added since: record their bucket counts too
            merged = {**recorded, "buckets": {**recorded.get("buckets", {}), **mine["buckets"]}}
            _record(clients[0], key, merged, only_new=False)
        return
    for client in clients:
        for pattern in foreign_patterns:
            if _exists(client, pattern):
                other = "buckets" if mine["kind"] == "keys" else "keys"
                raise ConfigError(
                    f"store.layout.kind: deployment {deployment!r} already has rows in the {other!r} layout "
                    f"(keys matching {pattern!r}); set store.layout.kind: {other} to keep using them"
                )
    _record(clients[0], key, mine, only_new=True)


_EXPECTED = 'a JSON object such as {"kind": "keys"} or {"kind": "buckets", "buckets": {"<table>": <count>}}'
_REMEDY = "delete the key (redis-cli DEL {key}) and restart: the next writer records the layout again"


def _get(client: Any, key: str) -> bytes | None:
    try:
        raw: bytes | None = client.get(key)
    except Exception as exc:  # redis-py's ResponseError; translated by the caller unless it is WRONGTYPE
        if "WRONGTYPE" not in str(exc):
            raise
        raise LayoutMarkerError(
            f"store layout marker {key!r} is not a string key, expected {_EXPECTED}; "
            + _REMEDY.format(key=key)
        ) from None
    return raw


def _parse(key: str, raw: bytes) -> dict[str, Any]:
    """The recorded layout, checked for the shape :func:`_record` writes."""
    shown = raw[:80].decode("utf-8", "replace") + ("..." if len(raw) > 80 else "")
    try:
        recorded = json.loads(raw)
    except ValueError:  # not JSON, or not UTF-8
        recorded = None
    buckets = recorded.get("buckets", {}) if isinstance(recorded, dict) else None
    if (
        not isinstance(recorded, dict)
        or recorded.get("kind") not in ("keys", "buckets")
        or not isinstance(buckets, dict)
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in buckets.values())
    ):
        raise LayoutMarkerError(
            f"store layout marker {key!r} holds {shown!r}, expected {_EXPECTED}; " + _REMEDY.format(key=key)
        )
    return recorded


def _record(client: Any, key: str, layout: Mapping[str, Any], only_new: bool) -> None:
    try:
        client.set(key, json.dumps(layout, sort_keys=True), nx=only_new)
    except Exception:  # a read-only ACL user, such as serving's: the trainer records it
        return


def _compare(deployment: str, recorded: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    if recorded.get("kind") != mine["kind"]:
        raise ConfigError(
            f"store.layout.kind: deployment {deployment!r} stores its rows in the {recorded.get('kind')!r} "
            f"layout, this config asks for {mine['kind']!r}; set store.layout.kind: {recorded.get('kind')}"
        )
    theirs = recorded.get("buckets", {})
    for table, n in mine.get("buckets", {}).items():
        if table in theirs and theirs[table] != n:
            raise ConfigError(
                f"store.layout.buckets_per_table: table {table!r} of deployment {deployment!r} was written "
                f"with {theirs[table]} buckets, this config has {n}; changing it would hide every stored row"
            )


def _exists(client: Any, pattern: str) -> bool:
    cursor = 0
    for _ in range(_PROBE_ROUNDS):
        cursor, keys = client.scan(cursor=cursor, match=pattern, count=1000)
        if keys:
            return True
        if cursor == 0:
            return False
    return False
