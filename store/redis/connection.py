"""The one Redis boundary: connection options, clients, node names and the error translation.

Every room that talks to Redis goes through this module: the store backends
(:mod:`kelp.store.redis.standalone`, :mod:`kelp.store.redis.cluster`), the publish Redis
channel (:mod:`kelp.publish.redis_channel`), and serving, which builds both
through :func:`~kelp.store.factory.build_store` and
:func:`~kelp.publish.publisher.build_channel`. So there is one way to

* turn :class:`~kelp.config.StoreConfig` into redis-py options: timeouts, ACL
  user, password, TLS files, and redis-py's own retry switched off, because
  Kelp's :class:`~kelp.retry.RetryPolicy` is the one retry;
* connect a standalone node or read replica (:func:`connect_node`) or a Redis
  Cluster from seed nodes (:func:`connect_cluster`);
* name a node in errors and metric labels: ``host:port`` or
  ``cluster(host:port,...)``, never the password (:func:`node_name`);
* translate redis-py exceptions into Kelp errors (:func:`translate_redis_errors`).

Translation, in this order (redis-py's ``AuthenticationError`` subclasses its
``ConnectionError``: a wrong password must never look like a retriable outage)::

    redis-py raised                                       Kelp raises                       retriable
    AuthenticationError, AuthorizationError, NOPERM,      RedisAuthError (a UserError),     no
      NOAUTH/WRONGPASS replies, cluster start-up            the same class in every room
      failing on auth
    TLS: the server's certificate not trusted, or a       RedisAuthError, naming store.tls  no
      plain-text server behind a TLS client
    ConnectionError, TimeoutError, socket errors,         room.unavailable(where, reason)   yes
      CLUSTERDOWN/TRYAGAIN/MOVED/ASK/LOADING/MASTERDOWN,    (a TLS session the server closed,
      cluster start-up failing otherwise                   a refused client certificate: with
                                                           a hint naming store.tls.cert_file)
    any other error reply (OOM, WRONGTYPE...)             room.refused(message)             no
    any other redis-py error                              room.failed(message)              no

A room (:class:`ErrorRoom`) only chooses its own class names for the last
three rows: the store raises :class:`~kelp.store.errors.ShardUnavailableError`,
the snapshot channel :class:`~kelp.publish.errors.ChannelUnavailableError`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from kelp.config import StoreConfig
from kelp.errors import KelpError, RedisAuthError, StoreError
from kelp.store.errors import ShardUnavailableError, StoreCommandError

__all__ = [
    "STORE_ERRORS",
    "ErrorRoom",
    "cluster_name",
    "connect_cluster",
    "connect_node",
    "connection_options",
    "node_name",
    "ping_probe",
    "translate_redis_errors",
]

_AUTH_REPLIES = ("NOAUTH", "WRONGPASS", "invalid password", "invalid username")
_RETRY_REPLIES = ("CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "LOADING", "MASTERDOWN")
_SLOT_MOVING = (
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.AskError,
)
"""Cluster replies that heal on retry; redis-py strips their first word (``TRYAGAIN`` ...) from the text,
so :data:`_RETRY_REPLIES` never matched them (``MovedError`` is an ``AskError``)."""
_AUTH_ERRORS = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
)
_TLS_UNTRUSTED = ("CERTIFICATE_VERIFY_FAILED", "WRONG_VERSION_NUMBER")
"""TLS failures that never heal on retry: the server's certificate is untrusted, or it speaks no TLS."""
_TLS_CLOSED = (
    "EOF occurred in violation of protocol",
    "ALERT_UNKNOWN_CA",
    "ALERT_CERTIFICATE_REQUIRED",
    "ALERT_BAD_CERTIFICATE",
)
"""What a client sees when the server drops its TLS session, usually over the client's certificate. Left
retriable: a server that dies mid-handshake looks the same."""
_UNAVAILABLE_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    builtins.ConnectionError,
    OSError,
)


@dataclass(frozen=True)
class ErrorRoom:
    """How one room names its Redis failures; the auth case is :class:`~kelp.errors.RedisAuthError` in all.

    * ``what``: the noun before the node in messages (``"store shard"``, ``"snapshot channel"``);
    * ``unavailable(where, reason)``: the room's retriable "could not reach it" error;
    * ``refused(message)``: an error reply; ``failed(message)``: any other redis-py error
      (``refused`` when not given);
    * ``credentials``: the settings a person should check when Redis refuses the credentials.
    """

    what: str
    unavailable: Callable[[str, str], KelpError]
    refused: Callable[[str], KelpError]
    failed: Callable[[str], KelpError] | None = None
    credentials: str = "store.username / store.password"


STORE_ERRORS = ErrorRoom("store shard", ShardUnavailableError, StoreCommandError, failed=StoreError)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _auth_error(room: ErrorRoom, where: str, exc: BaseException) -> RedisAuthError:
    reason = _one_line(exc)
    if isinstance(exc, redis.exceptions.NoPermissionError) or reason.startswith("NOPERM"):
        return RedisAuthError(
            f"{room.what} {where}: the ACL user lacks a permission ({reason}); "
            f"check {room.credentials} and that user's ACL rules"
        )
    return RedisAuthError(f"{room.what} {where}: authentication failed ({reason}); check {room.credentials}")


@contextmanager
def translate_redis_errors(where: str, room: ErrorRoom = STORE_ERRORS) -> Iterator[None]:
    """Turn redis-py exceptions raised inside the block into Kelp errors (see the module docstring).

    ``where`` must be a password-free name (:func:`node_name`); it appears in every message.
    """
    try:
        yield
    except (*_AUTH_ERRORS, redis.exceptions.NoPermissionError) as exc:
        raise _auth_error(room, where, exc) from None
    except _SLOT_MOVING as exc:
        raise room.unavailable(where, f"{type(exc).__name__}: {_one_line(exc)}") from exc
    except redis.exceptions.ResponseError as exc:
        text = _one_line(exc)
        if text.startswith(_AUTH_REPLIES):
            raise _auth_error(room, where, exc) from None
        if text.startswith(_RETRY_REPLIES):
            raise room.unavailable(where, text) from exc
        raise room.refused(f"{room.what} {where}: {text}") from exc
    except RedisClusterException as exc:
        # redis-py wraps a start-up failure of every seed node; its cause says whether it was auth.
        if isinstance(exc.__cause__, _AUTH_ERRORS):
            raise _auth_error(room, where, exc.__cause__) from None
        raise room.unavailable(where, f"{type(exc).__name__}: {_one_line(exc)}") from exc
    except _UNAVAILABLE_ERRORS as exc:
        reason = f"{type(exc).__name__}: {_one_line(exc)}"
        if any(marker in reason for marker in _TLS_UNTRUSTED):
            raise RedisAuthError(
                f"{room.what} {where}: TLS: this client does not trust the server's certificate ({reason}); "
                "check store.tls.ca_file (the CA that signed the server's certificate) and "
                "store.tls.check_hostname (the certificate must name the host in the URL)"
            ) from None
        if any(marker in reason for marker in _TLS_CLOSED):
            reason += (
                " (the server closed the TLS connection: it may refuse this client's certificate, or want "
                "one; check store.tls.cert_file / store.tls.key_file and the server's tls-ca-cert-file)"
            )
        raise room.unavailable(where, reason) from exc
    except redis.exceptions.RedisError as exc:
        raise (room.failed or room.refused)(f"{room.what} {where}: {type(exc).__name__}: {exc}") from exc


def node_name(url: str) -> str:
    """``host:port`` of a ``redis://[user:password@]host:port[/db]`` URL: safe for logs, errors and labels.

    Only what follows the URL's last ``@`` is read, and never its query, so no
    part of a password (one holding an unencoded ``/`` included, or a
    ``?password=`` parameter) can be named as the host or port.
    """
    scheme, sep, rest = url.partition("://")
    tail = rest.rsplit("@", maxsplit=1)[-1].split("?", 1)[0].split("#", 1)[0]
    try:
        parts = urlsplit(f"{scheme}{sep}{tail}")
        if parts.hostname:
            return f"{parts.hostname}:{parts.port or 6379}"
    except ValueError:  # a port that is not a number
        pass
    return tail if "@" in rest else f"{scheme}{sep}{tail}"


def cluster_name(urls: Sequence[str]) -> str:
    """``cluster(host:port,...)`` of a cluster's seed nodes."""
    return "cluster(" + ",".join(node_name(u) for u in urls) + ")"


def connection_options(
    cfg: StoreConfig, *, credentials: bool = True, socket_timeout_s: float | None = None
) -> dict[str, Any]:
    """redis-py keyword options from ``store.*``; the same for every client Kelp opens.

    ``credentials=False`` leaves out ``store.username``/``store.password`` (a
    client whose URL carries its own, like ``publisher.redis_url``);
    ``socket_timeout_s`` overrides ``store.socket_timeout_s`` (a snapshot is
    a whole model's weights, not a row). redis-py's own retry is off: Kelp's RetryPolicy is the
    one retry, and a blind reconnect loop would hide outages from it.
    """
    kw: dict[str, Any] = {
        "socket_timeout": cfg.socket_timeout_s if socket_timeout_s is None else socket_timeout_s,
        "socket_connect_timeout": cfg.connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
    }
    if credentials and cfg.username is not None:
        kw["username"] = cfg.username
    if credentials and cfg.password is not None:
        kw["password"] = cfg.password.get_secret_value()
    if cfg.tls.enabled:
        kw["ssl"] = True
        kw["ssl_check_hostname"] = cfg.tls.check_hostname
        for option, path in (
            ("ssl_ca_certs", cfg.tls.ca_file),
            ("ssl_certfile", cfg.tls.cert_file),
            ("ssl_keyfile", cfg.tls.key_file),
        ):
            if path is not None:
                kw[option] = str(path)
    return kw


def connect_node(url: str, options: Mapping[str, Any]) -> redis.Redis:
    """A client of one standalone node or read replica; it connects on its first command.

    ``ssl`` (``store.tls.enabled``) picks redis-py's TLS connection class: ``from_url`` hands
    its keywords to the connection itself, which takes the ``ssl_*`` files but not ``ssl``.
    """
    kw = dict(options)
    if kw.pop("ssl", False) and not url.startswith("unix://"):
        kw["connection_class"] = redis.SSLConnection
    return redis.Redis.from_url(url, **kw)


def connect_cluster(
    urls: Sequence[str], options: Mapping[str, Any], room: ErrorRoom = STORE_ERRORS
) -> RedisCluster:
    """A Redis Cluster client from seed-node URLs (only their host and port are used).

    It connects at once (redis-py reads the slot map), so a wrong password or
    unreachable seeds raise here, translated for ``room``.
    """
    nodes = [ClusterNode(p.hostname or "127.0.0.1", p.port or 6379) for p in map(urlsplit, urls)]
    with translate_redis_errors(cluster_name(urls), room):
        return RedisCluster(startup_nodes=nodes, **options)


def ping_probe(url: str, options: dict[str, Any], room: ErrorRoom) -> Callable[[], None]:
    """A check that PINGs one node (a cluster's seed nodes answer it too) through the one error translation.

    The start-up check retries it until its budget is spent; ``room`` names the
    setting and the credentials a failure points at (the store's or the channel's).
    """

    def probe() -> None:
        client = connect_node(url, options)
        try:
            with translate_redis_errors(node_name(url), room):
                client.ping()
        finally:
            client.close()

    return probe
