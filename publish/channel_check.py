"""Whether the snapshot channel's Redis may evict the channel's keys: one line for ``kelp config validate``.

The channel's bookkeeping (``seq``, ``latest``, ``versions``, the version
hashes; :mod:`kelp.publish.redis_channel`) has no TTL, so only an
``allkeys-*`` ``maxmemory-policy`` can evict it. That is exactly the policy
``docs/store.md`` recommends for the *store's* Redis, to bound the rows' memory:
a channel on the store's Redis (no ``publisher.redis_url``) then loses keys when
the rows fill memory, and publishing refuses until an operator repairs them.
``noeviction`` and the ``volatile-*`` policies (which evict only keys with a
TTL) never touch them.

The check connects once, reads ``CONFIG GET maxmemory-policy`` and never
fails: an unreachable server or a refused ``CONFIG`` (a least-privilege ACL
user) is reported as a note. URLs in the lines have their password redacted.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from kelp.config import PublisherConfig, StoreConfig
from kelp.redaction import redact_text, redact_url
from kelp.store.redis.connection import connect_node, connection_options, node_name

__all__ = ["ChannelEvictionCheck", "check_channel_eviction", "evicts_channel_keys"]

CHECK_TIMEOUT_S = 2.0
"""Upper bound on the connect and the read of the check (``store`` timeouts apply when shorter)."""


def evicts_channel_keys(policy: str) -> bool:
    """True for a ``maxmemory-policy`` that may evict keys without a TTL (``allkeys-*``, or one unknown).

    >>> [evicts_channel_keys(p) for p in ("noeviction", "volatile-lru", "allkeys-lfu")]
    [False, False, True]
    """
    return policy != "noeviction" and not policy.startswith("volatile-")


@dataclass(frozen=True)
class ChannelEvictionCheck:
    """What the check found: ``level`` is ``warning`` (an evicting policy) or ``note`` (could not tell)."""

    level: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"


def check_channel_eviction(publisher: PublisherConfig, store: StoreConfig) -> ChannelEvictionCheck | None:
    """Read the channel's Redis ``maxmemory-policy``; None when there is nothing to say.

    Nothing to say: the channel is not Redis (or publishing is off), there is no
    Redis to check, or its policy never evicts the channel's keys.
    """
    if not publisher.enabled or publisher.channel != "redis":
        return None
    store_urls = list(store.urls) if store.backend != "memory" else []
    url = publisher.redis_url or (store_urls[0] if store_urls else None)
    if url is None:
        return None
    shared = publisher.redis_url is None or node_name(url) in {node_name(u) for u in store_urls}
    shown = redact_url(url)
    options = connection_options(
        store,
        credentials=publisher.redis_url is None,
        socket_timeout_s=min(store.socket_timeout_s, CHECK_TIMEOUT_S),
    )
    options["socket_connect_timeout"] = min(store.connect_timeout_s, CHECK_TIMEOUT_S)
    client = connect_node(url, options)
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.exceptions.RedisError as exc:
        refused = isinstance(exc, redis.exceptions.ResponseError)
        how = "CONFIG GET was refused" if refused else "could not reach it"
        reason = redact_text(" ".join(str(exc).split()))
        return ChannelEvictionCheck(
            "note",
            f"could not read the maxmemory-policy of the snapshot channel's Redis {shown} "
            f"({how}: {reason}); it should be noeviction, so the channel's keys are never evicted "
            "(docs/deploy.md)",
        )
    finally:
        client.close()
    if policy is None:
        return ChannelEvictionCheck(
            "note", f"the snapshot channel's Redis {shown} did not report a maxmemory-policy (docs/deploy.md)"
        )
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    if not evicts_channel_keys(policy):
        return None
    if shared:
        where = f"the snapshot channel shares the store's Redis {shown}, whose maxmemory-policy is {policy}"
        lost = "the channel's keys (seq, latest, versions) and the store's layout marker"
        fix = "point publisher.redis_url at a separate Redis with maxmemory-policy noeviction"
    else:
        where = f"the snapshot channel's Redis {shown} (publisher.redis_url) has maxmemory-policy {policy}"
        lost = "the channel's keys (seq, latest, versions)"
        fix = "set maxmemory-policy noeviction on it"
    return ChannelEvictionCheck(
        "warning",
        f"{where}: Redis may evict {lost}, and publishing then refuses until they are repaired; "
        f"{fix} (docs/deploy.md)",
    )
