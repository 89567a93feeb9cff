"""Least-privilege Redis ACL users for one deployment: a trainer that may only touch its own keys, a
serving replica that may only read them, and a joiner that may only touch its waiting state.

Every key Kelp writes for a deployment ``D`` (``D`` is 1-64 of ``[a-z0-9-]``,
so it can hold neither ``:`` nor a glob character, and ``k1:a:*`` can never
match deployment ``a-b``'s keys) starts with one of::

    k1:D:       rows and admission counters, ``keys`` layout (kelp.store.redis.keys.KeyLayout)
    {k1:D:      the same on Redis Cluster (hash-tagged buckets), and the snapshot channel's
                ``{k1:D:model}:...`` keys (kelp.publish.redis_channel)
    k2:D:       rows of the ``buckets`` layout (kelp.store.redis.keys.BucketLayout)
    kelp:D:     the layout marker (kelp.store.redis.layout_marker)

plus one pub/sub channel, ``{k1:D:model}:notify``. The rules name commands one
by one rather than whole categories, so neither user can ``FLUSHALL``,
``CONFIG SET``, ``KEYS`` or run a ``FUNCTION``. Lua scripts (conditional row
writes, the ``buckets`` TTL sweep, Adagrad ``compose``, the snapshot publish)
need ``EVAL``/``EVALSHA``/``SCRIPT LOAD``; Redis checks both the script's
declared ``KEYS`` and every command the script calls against the same user, so
a script cannot reach past these patterns either.

* ``trainer``: read and write on the patterns; ``INFO``/``DBSIZE`` for
  ``kelp store stats`` and the run summary. No ``CONFIG``: the ``buckets``
  layout's listpack limits are then logged as redis.conf lines to set instead
  (``store.layout.configure_server``).
* ``serving``: read-only key selectors (``%R~``) and read commands only; a row
  or snapshot write is refused with ``NOPERM``, which Kelp reports as
  :class:`~kelp.errors.RedisAuthError` naming the ACL rules.
* ``join``: ``kelp join``'s waiting state only, every key under the hash tag
  ``{kelp:D:join}`` (kelp.join.state), with the commands one step's ``MULTI``
  and reads use. It sees no row, counter or snapshot key.

A password is given as its SHA-256 (``#<hex>``) so the printed line never
holds the secret; without one the line carries the placeholder ``><password>``.
"""

from __future__ import annotations

import hashlib
from typing import Literal

__all__ = ["ROLES", "Role", "acl_rules", "default_user", "key_patterns", "setuser_line"]

Role = Literal["trainer", "serving", "join"]
ROLES: tuple[Role, ...] = ("trainer", "serving", "join")

_CONNECTION = (
    "ping",
    "hello",
    "auth",
    "select",
    "readonly",
    "client|setname",
    "client|getname",
    "client|id",
    "command",
    "cluster|slots",
    "cluster|shards",
    "cluster|nodes",
    "cluster|info",
)
"""Connection set-up of redis-py (standalone and cluster): handshake, client name, slot map. Not
CLIENT SETINFO: Redis 7.0 does not know it (redis-py ignores its refusal on 7.2+)."""

_READ = (
    "get",
    "mget",
    "exists",
    "type",
    "pttl",
    "hget",
    "hmget",
    "hlen",
    "hgetall",
    "zrange",
    "scan",
    "subscribe",
    "unsubscribe",
)
"""What serving reads: rows (MGET, HGET), the layout marker, snapshots (GET latest, HMGET, ZRANGE),
the notify channel, and the bounded SCAN of the layout probe."""

_WRITE = (
    "set",
    "mset",
    "del",
    "unlink",
    "incr",
    "incrby",
    "pexpire",
    "hset",
    "hdel",
    "hstrlen",
    "zadd",
    "zrem",
    "publish",
    "eval",
    "evalsha",
    "script|load",
    "script|exists",
    "info",
    "dbsize",
    "wait",
)
"""The trainer's extra commands: row and counter writes, the Lua scripts, snapshot publish and its
read-back (HSTRLEN of the weights), stats, and ``WAIT`` for ``store.durability.replicas_ack``."""

_JOIN = (
    "get",
    "mget",
    "set",
    "del",
    "zadd",
    "zrem",
    "zrangebyscore",
    "zcard",
    "hget",
    "hincrby",
    "multi",
    "exec",
    "discard",
)
"""The joiner's commands: impressions and early actions (GET, MGET, SET with PX, DEL), the deadline
sets (ZADD, ZREM, ZRANGEBYSCORE, ZCARD), the watermark and byte count, and one MULTI per step."""


def key_patterns(deployment: str) -> tuple[str, ...]:
    """The glob patterns covering every key of ``deployment`` (see the module docstring)."""
    return (f"k1:{deployment}:*", f"{{k1:{deployment}:*", f"k2:{deployment}:*", f"kelp:{deployment}:*")


def default_user(deployment: str, role: Role) -> str:
    return f"kelp-{deployment}-{role}"


def acl_rules(deployment: str, role: Role) -> list[str]:
    """The ACL rules (after ``reset on`` and the password) of ``role`` for ``deployment``."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if role == "join":
        return [f"~{{kelp:{deployment}:join}}:*", *("+" + c for c in _CONNECTION + _JOIN)]
    selector = "~" if role == "trainer" else "%R~"
    rules = [selector + p for p in key_patterns(deployment)]
    rules.append(f"&{{k1:{deployment}:model}}:notify")
    commands = _CONNECTION + _READ + (_WRITE if role == "trainer" else ())
    rules += ["+" + c for c in commands]
    return rules


def setuser_line(deployment: str, role: Role, user: str | None = None, password: str | None = None) -> str:
    """One ``ACL SETUSER`` command (redis-cli syntax) that (re)defines the user from scratch.

    ``reset`` first, so running it again after an upgrade drops rights Kelp no longer needs.
    """
    secret = "><password>" if password is None else "#" + hashlib.sha256(password.encode()).hexdigest()
    name = user or default_user(deployment, role)
    return " ".join(["ACL", "SETUSER", name, "reset", "on", secret, *acl_rules(deployment, role)])
