"""The Redis snapshot channel (``publisher.channel: redis``, the default).

Keys (layout version ``k1``, one hash tag so that every key of a deployment's
snapshots lives in one Redis Cluster slot and the publish script can touch them
all atomically)::

    {k1:<deployment>:model}:seq               INCR counter handing out versions
    {k1:<deployment>:model}:v:<version, 12 digits>   hash {manifest, weights}
    {k1:<deployment>:model}:versions          sorted set of stored versions
    {k1:<deployment>:model}:latest            the newest complete version
    {k1:<deployment>:model}:pin               the version an operator pinned (absent: none)
    {k1:<deployment>:model}:notify            pub/sub channel; message = the version

One Lua script stores the hash, adds the version to the set, moves ``latest``
forward and publishes the notification: a replica that hears of a version can
always read it whole. Pub/sub is best-effort (a replica that was disconnected
misses messages); the replica's poll of ``latest`` every
``serving.poll_interval_s`` covers that.

Version numbers are never reused. ``seq`` is the record of every number handed
out, so each Lua script checks the keys against each other before it changes
anything, and refuses with :class:`~kelp.publish.errors.ChannelStateError`
(naming the key to repair) when they disagree in a way it cannot settle alone:

* allocating (``next_version``): ``seq`` must not be below ``latest`` or
  ``versions``, must hold a number, and must not be below the caller's
  ``floor`` (the highest version this publisher process wrote: a channel whose
  keys were *all* evicted or flushed looks new, and would start at 1). A
  ``seq`` that is *missing* while ``latest`` or ``versions`` exist is
  re-created, in the same script, at the highest version those keys, the
  ``floor`` and any version hash just above them name, with one warning: every
  number a replica can have been handed is among them, so none is reused. A
  ``seq`` that holds garbage or lags behind is not re-created: something wrote
  it (a hand edit, another tool, a restored backup), so it is wrong rather
  than lost, and which of it and the stored keys is right is an operator's
  call;
* writing: the version's hash must not exist (write-once), ``seq`` must have
  handed the number out, and it must be above ``latest`` and every listed version
  (a ``latest`` that is not a number is overwritten, with a warning: ``seq`` and
  ``versions`` are the record, so nothing it could have named is above ``seq``);
* pruning deletes only versions below ``latest``, never the pinned one;
* pinning: the version's hash must exist, in the same script that sets ``pin``
  and publishes the notification.

A write is only done when it reads back: right after the script, the
version's manifest, the length of its weights and ``latest`` are read again
(one round trip, no weights transferred). A Redis under an evicting
``maxmemory-policy`` that is full (the store's rows on the same server) evicts
before each command it runs, and the hash just written, never read yet, has
the lowest LFU count: the first write of another client after the script can
drop it. The publish then fails with
:class:`~kelp.publish.errors.SnapshotNotStoredError` (``reason="evicted"``)
instead of counting as published while replicas cannot load it. Eviction
later than the read-back is only prevented by ``noeviction``.

These keys must not be evicted: give the channel a Redis with
``maxmemory-policy noeviction`` (docs/deploy.md);
:meth:`RedisChannel.warn_about_eviction` (called when a publisher starts)
logs one warning when the policy may evict them. A channel found empty by a
publisher with no memory of its own (a new deployment, or every key lost while
the trainer was restarting) starts at 1 and says so in a warning.

Connections and error translation are the store's Redis boundary
(:mod:`kelp.store.redis.connection`), with this channel's :data:`CHANNEL_ERRORS`: an
unreachable Redis is a retriable :class:`ChannelUnavailableError`, a wrong
password the same non-retriable :class:`~kelp.errors.RedisAuthError` the store
raises, naming ``publisher.redis_url`` or ``store.username / store.password``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

import redis

from kelp.config import PublisherConfig, StoreConfig
from kelp.errors import KelpError, UserError
from kelp.publish.base import SnapshotChannel, Subscription
from kelp.publish.channel_check import evicts_channel_keys
from kelp.publish.errors import (
    ChannelError,
    ChannelStateError,
    ChannelUnavailableError,
    SnapshotMissingError,
    SnapshotNotStoredError,
)
from kelp.publish.snapshot import Snapshot
from kelp.store.redis.connection import (
    ErrorRoom,
    cluster_name,
    connect_cluster,
    connect_node,
    connection_options,
    node_name,
    translate_redis_errors,
)
from kelp.store.redis.keys import KEY_LAYOUT_VERSION

__all__ = ["CHANNEL_ERRORS", "RedisChannel", "RedisSubscription", "channel_prefix"]

log = logging.getLogger("kelp.publish")


def _unavailable(where: str, reason: str) -> ChannelUnavailableError:
    return ChannelUnavailableError(f"snapshot channel {where} unavailable: {reason}")


CHANNEL_ERRORS = ErrorRoom("snapshot channel", _unavailable, ChannelError)
"""How the snapshot channel names Redis failures.

See ``kelp.store.redis.connection.translate_redis_errors``."""

# Shared by the scripts: a key's value as a version number (nil: missing or not a plain integer),
# and the highest version `latest` and the `versions` set know of, with what `latest` holds when it
# is not a number (ignored: `seq` and `versions` are the record; a publish overwrites it).
_LUA_HELPERS = """
local function int(raw)
  if raw and string.match(raw, '^%d+$') then return tonumber(raw) end
  return nil
end
local function known(latest_key, versions_key)
  local raw = redis.call('GET', latest_key)
  local latest = int(raw) or 0
  local garbage = nil
  if raw and not int(raw) then garbage = raw end
  local top = redis.call('ZRANGE', versions_key, -1, -1, 'WITHSCORES')
  local stored = 0
  if top[2] then stored = tonumber(top[2]) end
  return math.max(latest, stored), garbage
end
"""

# KEYS: seq, latest, versions. ARGV: floor, the version hashes' key prefix. Returns {code, ...}; only
# 'ok', 'new' and 'healed' change anything. A missing `seq` beside stored versions is re-created at the
# highest number anything names (the keys, the caller's floor, a version hash just above them; the
# probe stays in the deployment's hash tag, so in the script's cluster slot).
_NEXT = (
    _LUA_HELPERS
    + """
local high = known(KEYS[2], KEYS[3])
local floor = tonumber(ARGV[1])
local raw = redis.call('GET', KEYS[1])
if not raw then
  if high > 0 then
    local top = math.max(high, floor)
    while redis.call('EXISTS', ARGV[2] .. string.format('%012d', top + 1)) == 1 do top = top + 1 end
    redis.call('SET', KEYS[1], string.format('%d', top))
    return {'healed', redis.call('INCR', KEYS[1]), top}
  end
  if floor > 0 then return {'lost', -1, floor} end
  return {'new', redis.call('INCR', KEYS[1])}
end
local seq = int(raw)
if not seq then return {'seq_garbage', raw} end
if seq < high then return {'seq_behind', seq, high} end
if seq < floor then return {'lost', seq, floor} end
return {'ok', redis.call('INCR', KEYS[1])}
"""
)

# KEYS: the version's hash, versions, latest, notify, seq. ARGV: version, manifest, weights.
_PUBLISH = (
    _LUA_HELPERS
    + """
local version = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local seq = int(redis.call('GET', KEYS[5]))
if not seq or seq < version then return {'unallocated', seq or -1} end
local high, garbage = known(KEYS[3], KEYS[2])
if version <= high then return {'stale', high} end
redis.call('HSET', KEYS[1], 'manifest', ARGV[2], 'weights', ARGV[3])
redis.call('ZADD', KEYS[2], version, ARGV[1])
redis.call('SET', KEYS[3], ARGV[1])
redis.call('PUBLISH', KEYS[4], ARGV[1])
if garbage then return {'repaired', garbage} end
return {'ok'}
"""
)

# KEYS: latest, versions, pin, then one hash per version. ARGV: those versions. Only versions below
# `latest` and not pinned go (none when `latest` is unreadable); returns how many were deleted.
_DELETE = (
    _LUA_HELPERS
    + """
local latest = int(redis.call('GET', KEYS[1]))
if not latest then return 0 end
local pin = int(redis.call('GET', KEYS[3]))
local n = 0
for i = 4, #KEYS do
  local version = tonumber(ARGV[i - 3])
  if version < latest and version ~= pin then
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', KEYS[2], ARGV[i - 3])
    n = n + 1
  end
end
return n
"""
)

# KEYS: the version's hash, pin, notify. ARGV: the version. 0 (nothing changed) when it is not stored.
_PIN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('PUBLISH', KEYS[3], ARGV[1])
return 1
"""

_REPAIR = "keep the channel's Redis on maxmemory-policy noeviction, docs/deploy.md"


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
        self._publish = client.register_script(_PUBLISH)
        self._next = client.register_script(_NEXT)
        self._delete = client.register_script(_DELETE)
        self._pin = client.register_script(_PIN)

    @classmethod
    def from_config(cls, pub: PublisherConfig, store: StoreConfig, deployment: str) -> RedisChannel:
        """``publisher.redis_url``, else the store's first url (with the store's credentials and TLS).

        With ``store.backend: redis-cluster`` and no ``redis_url``, a cluster client on the
        store's seed nodes is used (the hash tag keeps every snapshot key in one slot).
        """
        timeout = max(store.socket_timeout_s, 10.0)  # a snapshot is a whole model's weights, not a row
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

    def next_version(self, floor: int = 0) -> int:
        keys = [self._key("seq"), self._key("latest"), self._key("versions")]
        with translate_redis_errors(self.where, self._errors):
            code, *rest = self._next(keys=keys, args=[int(floor), self._key("v:")])
        code = _text(code)
        if code == "healed":
            log.warning(
                "snapshot channel %s: %s was missing (evicted or deleted?) while the channel holds "
                "snapshots; re-created it at v%d, the highest version stored or published, and handed out "
                "v%d (%s)",
                self.where,
                self._key("seq"),
                int(rest[1]),
                int(rest[0]),
                _REPAIR,
            )
            return int(rest[0])
        if code == "new":
            log.warning(
                "snapshot channel %s holds no snapshots under %s: numbering starts at v1 (a new deployment; "
                "if this deployment published before, its keys were evicted or deleted, and replicas keep "
                "serving their version until the new numbering passes it; %s)",
                self.where,
                self.prefix,
                _REPAIR,
            )
        if code not in ("ok", "new"):
            raise self._refusal(code, rest)
        return int(rest[0])

    def write(self, snapshot: Snapshot) -> None:
        version = snapshot.manifest.version
        keys = [
            self._version_key(version),
            self._key("versions"),
            self._key("latest"),
            self._key("notify"),
            self._key("seq"),
        ]
        with translate_redis_errors(self.where, self._errors):
            code, *rest = self._publish(
                keys=keys, args=[version, snapshot.manifest.to_json(), snapshot.weights]
            )
        code = _text(code)
        if code == "repaired":
            log.warning(
                "snapshot channel %s: %s held %s, not a version number; the publish of v%d replaced it",
                self.where,
                self._key("latest"),
                _shown(rest[0]),
                version,
            )
        elif code != "ok":
            raise self._refusal(code, rest, version)
        self._check_stored(version, snapshot.manifest.to_json(), len(snapshot.weights))

    def _check_stored(self, version: int, manifest: bytes | str, weights_bytes: int) -> None:
        """Read back what a replica reads: raises :class:`SnapshotNotStoredError` unless all of it is there.

        The script's own success is not enough: under an evicting
        ``maxmemory-policy`` a full Redis evicts before each command of any
        client, and a hash written but never read is the first candidate, so it
        can be gone before a replica looks. The manifest (which holds the
        weights' checksum) is compared whole and the weights by length, so no
        weights cross the network again.
        """
        key, latest_key = self._version_key(version), self._key("latest")
        with translate_redis_errors(self.where, self._errors):
            pipe = self._client.pipeline(transaction=False)
            pipe.hget(key, "manifest")
            pipe.hstrlen(key, "weights")
            pipe.get(latest_key)
            stored, stored_bytes, latest = pipe.execute()
        expected = manifest.encode() if isinstance(manifest, str) else manifest
        if stored is None or not stored_bytes:
            gone = f"{key} is gone" if stored is None else f"the weights of {key} are gone"
        elif latest is None:
            gone = f"{latest_key} is gone"
        else:
            gone = ""
        if gone:
            raise SnapshotNotStoredError(
                "evicted",
                version,
                f"snapshot channel {self.where}: v{version} was written but {gone} right after "
                f"(evicted: the Redis is over maxmemory with an evicting maxmemory-policy?); replicas "
                f"cannot load it and keep serving their version; {_REPAIR}",
            )
        latest_version = int(latest) if latest.isdigit() else -1
        if stored != expected or stored_bytes != weights_bytes or latest_version < version:
            raise SnapshotNotStoredError(
                "overwritten",
                version,
                f"snapshot channel {self.where}: v{version} was written but reads back different "
                f"(manifest {'same' if stored == expected else 'differs'}, weights {stored_bytes} bytes "
                f"of {weights_bytes}, {latest_key} {_shown(latest)}): another writer on these keys?",
            )

    def warn_about_eviction(self) -> None:
        """One WARNING when the channel's Redis may evict its keys; never raises.

        The channel's keys have no TTL, so only an ``allkeys-*`` policy (or one
        this code does not know) can evict them; ``volatile-*`` and
        ``noeviction`` cannot. ``CONFIG GET`` may be refused (an ACL user
        without ``+config``, a managed Redis): then one INFO line says the
        policy could not be checked.
        """
        try:
            with translate_redis_errors(self.where, self._errors):
                answer = self._client.config_get("maxmemory-policy")
        except (KelpError, redis.exceptions.RedisError) as exc:
            log.info(
                "snapshot channel %s: could not check its Redis maxmemory-policy (%s); it should be "
                "noeviction, or written snapshots may be evicted (docs/deploy.md)",
                self.where,
                " ".join(str(exc).split()),
            )
            return
        policy = _text(answer.get("maxmemory-policy", "")) if isinstance(answer, dict) else ""
        if policy and evicts_channel_keys(policy):
            log.warning(
                "snapshot channel %s: its Redis has maxmemory-policy %s, which may evict the channel's keys "
                "under memory pressure: a snapshot evicted right after its write fails the publish "
                '(kelp_publisher_failures_total{reason="evicted"}) and replicas stay on their version; '
                "set maxmemory-policy noeviction on it (docs/deploy.md)",
                self.where,
                policy,
            )

    def _refusal(self, code: str, rest: list[Any], version: int = 0) -> ChannelStateError:
        """The one-line error for a script's refusal: what is wrong, which key, how to repair it."""
        seq = self._key("seq")
        now = "missing" if rest and isinstance(rest[0], int) and rest[0] < 0 else (rest or ["?"])[0]
        fix = f"restore it with SET {seq} N, N at least the highest version any replica serves"
        match code:
            case "seq_behind":
                what = f"{seq} is {now}, below v{rest[1]} that the channel holds; {fix} and >= {rest[1]}"
            case "lost":
                what = (
                    f"this publisher already published v{rest[1]} but {seq} is {now} and nothing above it "
                    f"is stored (its keys were evicted, flushed or deleted?); {fix} and >= {rest[1]}"
                )
            case "seq_garbage":
                what = f"{seq} holds {_shown(rest[0])}, not a version counter; {fix}"
            case "exists":
                what = f"v{version} already exists and versions are written once ({seq} was lowered?); {fix}"
            case "unallocated":
                what = f"v{version} was not handed out by {seq} (it is {now}: evicted or deleted?); {fix}"
            case "stale":
                what = f"v{version} is not above v{rest[0]}, which the channel holds (a publisher is ahead)"
            case _:
                what = f"unexpected answer {code!r} from the publish script"
        return ChannelStateError(
            f"snapshot channel {self.where}: {what}; refusing to publish rather than reuse a version number; "
            + _REPAIR
        )

    def versions(self) -> list[int]:
        with translate_redis_errors(self.where, self._errors):
            return sorted(int(v) for v in self._client.zrange(self._key("versions"), 0, -1))

    def latest_version(self) -> int | None:
        with translate_redis_errors(self.where, self._errors):
            raw = self._client.get(self._key("latest"))
        if raw is None:
            return None
        if not raw.isdigit():
            raise ChannelStateError(
                f"snapshot channel {self.where}: {self._key('latest')} holds {_shown(raw)}, not a version "
                "number; the trainer's next publish rewrites it (or SET it to the newest stored version)"
            )
        return int(raw)

    def pinned_version(self) -> int | None:
        with translate_redis_errors(self.where, self._errors):
            raw = self._client.get(self._key("pin"))
        if raw is None:
            return None
        if not raw.isdigit() or int(raw) < 1:
            raise ChannelStateError(
                f"snapshot channel {self.where}: {self._key('pin')} holds {_shown(raw)}, not a version "
                "number; `kelp model pin N` or `kelp model unpin` rewrites it"
            )
        return int(raw)

    def set_pin(self, version: int | None) -> None:
        with translate_redis_errors(self.where, self._errors):
            if version is None:
                self._client.delete(self._key("pin"))
                self._client.publish(self._key("notify"), "unpin")
                return
            keys = [self._version_key(version), self._key("pin"), self._key("notify")]
            pinned = self._pin(keys=keys, args=[version])
        if not pinned:
            raise SnapshotMissingError(f"snapshot v{version} is not in {self.where}; nothing pinned")

    def read_manifest_raw(self, version: int) -> bytes:
        with translate_redis_errors(self.where, self._errors):
            manifest = self._client.hget(self._version_key(version), "manifest")
        if manifest is None:
            raise SnapshotMissingError(f"snapshot v{version} is not in {self.where} (pruned?)")
        return manifest

    def read_raw(self, version: int) -> tuple[bytes, bytes]:
        with translate_redis_errors(self.where, self._errors):
            manifest, weights = self._client.hmget(self._version_key(version), ["manifest", "weights"])
        if manifest is None or weights is None:
            raise SnapshotMissingError(f"snapshot v{version} is not in {self.where} (pruned?)")
        return manifest, weights

    def delete(self, versions: list[int]) -> None:
        if not versions:
            return
        keys = [
            self._key("latest"),
            self._key("versions"),
            self._key("pin"),
            *[self._version_key(v) for v in versions],
        ]
        with translate_redis_errors(self.where, self._errors):
            self._delete(keys=keys, args=[str(v) for v in versions])

    def subscribe(self) -> RedisSubscription:
        return RedisSubscription(self._client, self._key("notify"), self.where, self._errors)

    def close(self) -> None:
        self._client.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _shown(raw: Any) -> str:
    """A key's unexpected value for a one-line message: quoted, and cut short."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return repr(text[:40] + ("..." if len(text) > 40 else ""))
