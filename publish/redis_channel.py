"""The Redis snapshot channel (``publisher.channel: redis``, the default).

Keys (layout version ``k1``, one hash tag so that every key of a deployment's
snapshots lives in one Redis Cluster slot and the publish script can touch them
all atomically)::

    {k1:<deployment>:model}:seq               INCR counter handing out versions
    {k1:<deployment>:model}:v:<version, 12 digits>   hash {manifest, weights}
    {k1:<deployment>:model}:versions          sorted set of stored versions
    {k1:<deployment>:model}:latest            the newest complete version
    {k1:<deployment>:model}:notify            pub/sub channel; message = the version

One Lua script stores the hash, adds the version to the set, moves ``latest``
forward only (an older publisher can never move it back) and publishes the
notification: a replica that hears of a version can always read it whole.
Pub/sub is best-effort (a replica that was disconnected misses messages); the
replica's poll of ``latest`` every ``serving.poll_interval_s`` covers that.

Connections and error translation are the store's Redis boundary
(:mod:`kelp.store.connection`), with this channel's :data:`CHANNEL_ERRORS`: an
unreachable Redis is a retriable :class:`ChannelUnavailableError`, a wrong
password the same non-retriable :class:`~kelp.errors.RedisAuthError` the store
raises, naming ``publisher.redis_url`` or ``store.username / store.password``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from kelp.config import PublisherConfig, StoreConfig
from kelp.errors import KelpError, UserError
from kelp.publish.base import SnapshotChannel, Subscription
from kelp.publish.errors import ChannelError, ChannelUnavailableError, SnapshotMissingError
from kelp.publish.snapshot import Snapshot
from kelp.store.connection import (
    ErrorRoom,
    cluster_name,
    connect_cluster,
    connect_node,
    connection_options,
    node_name,
    translate_redis_errors,
)
from kelp.store.keys import KEY_LAYOUT_VERSION

__all__ = ["CHANNEL_ERRORS", "RedisChannel", "RedisSubscription", "channel_prefix"]


def _unavailable(where: str, reason: str) -> ChannelUnavailableError:
    return ChannelUnavailableError(f"snapshot channel {where} unavailable: {reason}")


CHANNEL_ERRORS = ErrorRoom("snapshot channel", _unavailable, ChannelError)
"""How the snapshot channel names Redis failures (see ``kelp.store.connection.translate_redis_errors``)."""

_PUBLISH = """
redis.call('HSET', KEYS[1], 'manifest', ARGV[2], 'weights', ARGV[3])
redis.call('ZADD', KEYS[2], tonumber(ARGV[1]), ARGV[1])
local current = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[1]) > current then
  redis.call('SET', KEYS[3], ARGV[1])
  redis.call('PUBLISH', KEYS[4], ARGV[1])
end
return current
"""


def channel_prefix(deployment: str) -> str:
    return f"{{k{KEY_LAYOUT_VERSION}:{deployment}:model}}"


class RedisSubscription(Subscription):
    """A pub/sub connection on the notify channel (reconnects on the next ``wait`` after an error)."""

    def __init__(self, client: Any, channel: str, where: str, errors: ErrorRoom = CHANNEL_ERRORS) -> None:
        self._client = client
        self._channel = channel
        self.where = where
        self._errors = errors
        self._pubsub: Any = None

    def _connect(self) -> Any:
        if self._pubsub is None:
            with translate_redis_errors(self.where, self._errors):
                pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self._channel)
            self._pubsub = pubsub
        return self._pubsub

    def wait(self, timeout_s: float) -> bool:
        pubsub = self._connect()
        try:
            with translate_redis_errors(self.where, self._errors):
                message = pubsub.get_message(timeout=timeout_s)
        except ChannelUnavailableError:
            self.close()  # the next wait resubscribes
            raise
        return message is not None

    def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(KelpError), translate_redis_errors(self.where, self._errors):
                self._pubsub.close()
            self._pubsub = None


class RedisChannel(SnapshotChannel):
    """Snapshots in Redis under ``{k1:<deployment>:model}``; see the module docstring."""

    name = "redis"

    def __init__(
        self, client: Any, deployment: str, where: str = "redis", errors: ErrorRoom = CHANNEL_ERRORS
    ) -> None:
        self._client = client
        self.deployment = deployment
        self.where = node_name(where) if "://" in where else where  # never a password in a message
        self._errors = errors
        self.prefix = channel_prefix(deployment)
        self._script = client.register_script(_PUBLISH)

    @classmethod
    def from_config(cls, pub: PublisherConfig, store: StoreConfig, deployment: str) -> RedisChannel:
        """``publisher.redis_url``, else the store's first url (with the store's credentials and TLS).

        With ``store.backend: redis-cluster`` and no ``redis_url``, a cluster client on the
        store's seed nodes is used (the hash tag keeps every snapshot key in one slot).
        """
        timeout = max(store.socket_timeout_s, 10.0)  # a snapshot is ~0.5 MB, not a row
        if pub.redis_url is not None:  # an explicit URL carries its own credentials
            options = connection_options(store, credentials=False, socket_timeout_s=timeout)
            errors = dataclasses.replace(CHANNEL_ERRORS, credentials="the credentials in publisher.redis_url")
            url = pub.redis_url
            return cls(connect_node(url, options), deployment, node_name(url), errors)
        if store.backend == "memory" or not store.urls:
            raise UserError(
                "publisher.channel is 'redis' but there is no Redis to use: the store is in memory and "
                "publisher.redis_url is not set (set publisher.redis_url, or publisher.channel: filesystem)"
            )
        options = connection_options(store, socket_timeout_s=timeout)
        if store.backend == "redis-cluster":
            client = connect_cluster(store.urls, options, CHANNEL_ERRORS)
            return cls(client, deployment, cluster_name(store.urls))
        return cls(connect_node(store.urls[0], options), deployment, node_name(store.urls[0]))

    # -- keys -----------------------------------------------------------------------------------

    def _key(self, suffix: str) -> str:
        return f"{self.prefix}:{suffix}"

    def _version_key(self, version: int) -> str:
        return self._key(f"v:{version:012d}")

    # -- the channel ----------------------------------------------------------------------------

    def next_version(self) -> int:
        with translate_redis_errors(self.where, self._errors):
            return int(self._client.incr(self._key("seq")))

    def write(self, snapshot: Snapshot) -> None:
        version = snapshot.manifest.version
        keys = [self._version_key(version), self._key("versions"), self._key("latest"), self._key("notify")]
        with translate_redis_errors(self.where, self._errors):
            self._script(keys=keys, args=[version, snapshot.manifest.to_json(), snapshot.weights])

    def versions(self) -> list[int]:
        with translate_redis_errors(self.where, self._errors):
            return sorted(int(v) for v in self._client.zrange(self._key("versions"), 0, -1))

    def latest_version(self) -> int | None:
        with translate_redis_errors(self.where, self._errors):
            raw = self._client.get(self._key("latest"))
        return None if raw is None else int(raw)

    def read_raw(self, version: int) -> tuple[bytes, bytes]:
        with translate_redis_errors(self.where, self._errors):
            manifest, weights = self._client.hmget(self._version_key(version), ["manifest", "weights"])
        if manifest is None or weights is None:
            raise SnapshotMissingError(f"snapshot v{version} is not in {self.where} (pruned?)")
        return manifest, weights

    def delete(self, versions: list[int]) -> None:
        if not versions:
            return
        with translate_redis_errors(self.where, self._errors):
            pipe = self._client.pipeline()
            pipe.delete(*[self._version_key(v) for v in versions])
            pipe.zrem(self._key("versions"), *[str(v) for v in versions])
            pipe.execute()

    def subscribe(self) -> RedisSubscription:
        return RedisSubscription(self._client, self._key("notify"), self.where, self._errors)

    def close(self) -> None:
        self._client.close()
