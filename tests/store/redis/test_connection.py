"""The one Redis boundary: options, node names, the one translation of redis-py errors (no server needed)."""

from __future__ import annotations

import dataclasses

import pytest
import redis
from redis.exceptions import RedisClusterException

from kelp.config import StoreConfig
from kelp.errors import RedisAuthError, StoreError, UserError
from kelp.publish.errors import ChannelError, ChannelUnavailableError
from kelp.publish.redis_channel import CHANNEL_ERRORS
from kelp.retry import RetryPolicy
from kelp.store.errors import ShardUnavailableError, StoreAuthError, StoreCommandError
from kelp.store.redis.connection import (
    STORE_ERRORS,
    cluster_name,
    connection_options,
    node_name,
    translate_redis_errors,
)


def test_node_names_never_carry_the_password() -> None:
    assert node_name("redis://:pw@10.0.0.1:7000/2") == "10.0.0.1:7000"
    assert node_name("rediss://user:pw@cache.svc") == "cache.svc:6379"
    assert node_name("unix://user:pw@/tmp/redis.sock") == "/tmp/redis.sock"
    assert cluster_name(["redis://:pw@a:1", "redis://b:2"]) == "cluster(a:1,b:2)"


def test_connection_options_from_config() -> None:
    cfg = StoreConfig(
        backend="redis",
        urls=["redis://h:1"],
        username="kelp",
        password="s3cret",
        socket_timeout_s=1.5,
        tls={"enabled": True, "ca_file": "/ca.pem", "check_hostname": False},
    )
    kw = connection_options(cfg)
    assert kw["username"] == "kelp" and kw["password"] == "s3cret"
    assert kw["socket_timeout"] == 1.5 and kw["socket_connect_timeout"] == cfg.connect_timeout_s
    assert kw["retry"].get_retries() == 0  # Kelp's RetryPolicy is the one retry
    assert kw["ssl"] is True and kw["ssl_ca_certs"] == "/ca.pem" and kw["ssl_check_hostname"] is False
    assert "ssl_certfile" not in kw
    own = connection_options(cfg, credentials=False, socket_timeout_s=10.0)
    assert "username" not in own and "password" not in own and own["socket_timeout"] == 10.0


def _raised(exc: BaseException, room=STORE_ERRORS) -> BaseException:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as info, translate_redis_errors("10.0.0.1:7000", room):
        raise exc
    return info.value


AUTH_FAILURES = [
    redis.exceptions.AuthenticationError("invalid username-password pair or user is disabled."),
    redis.exceptions.AuthenticationError("Authentication required."),
    redis.exceptions.ResponseError("WRONGPASS invalid username-password pair"),
    redis.exceptions.NoPermissionError("NOPERM this user has no permissions to run the 'mget' command"),
]


@pytest.mark.parametrize("room", [STORE_ERRORS, CHANNEL_ERRORS], ids=["store", "channel"])
@pytest.mark.parametrize("exc", AUTH_FAILURES, ids=lambda e: type(e).__name__)
def test_auth_failures_are_one_user_error_in_every_room(exc: BaseException, room) -> None:  # type: ignore[no-untyped-def]
    err = _raised(exc, room)
    assert type(err) is RedisAuthError and StoreAuthError is RedisAuthError
    assert isinstance(err, UserError) and not err.retriable
    assert not RetryPolicy().retry_on(err)
    text = str(err)
    assert "\n" not in text and "10.0.0.1:7000" in text and room.credentials in text
    assert err.__cause__ is None and err.__suppress_context__  # a user error prints one line


def test_cluster_start_up_failing_on_auth_is_the_auth_error() -> None:
    cause = redis.exceptions.AuthenticationError("invalid username-password pair or user is disabled.")
    wrapped = RedisClusterException(
        "Redis Cluster cannot be connected. Please provide at least one reachable node"
    )
    wrapped.__cause__ = cause
    assert type(_raised(wrapped)) is RedisAuthError
    unreachable = RedisClusterException("Redis Cluster cannot be connected.")
    unreachable.__cause__ = redis.exceptions.ConnectionError("refused")
    err = _raised(unreachable)
    assert isinstance(err, ShardUnavailableError) and err.retriable


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ConnectionError("Connection refused"),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("LOADING Redis is loading the dataset in memory"),
        redis.exceptions.ResponseError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),  # TRYAGAIN, parsed
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.MovedError("3394 127.0.0.1:7001"),
        ConnectionResetError("reset by peer"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_unreachable_is_retriable_in_each_rooms_own_class(exc: BaseException) -> None:
    store_err = _raised(exc)
    assert isinstance(store_err, ShardUnavailableError) and store_err.retriable
    assert store_err.shard == "10.0.0.1:7000"
    channel_err = _raised(exc, CHANNEL_ERRORS)
    assert isinstance(channel_err, ChannelUnavailableError) and channel_err.retriable
    assert "snapshot channel 10.0.0.1:7000 unavailable" in str(channel_err)


def test_refused_commands_and_other_errors() -> None:
    oom = redis.exceptions.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'")
    assert type(_raised(oom)) is StoreCommandError and not _raised(oom).retriable
    assert type(_raised(oom, CHANNEL_ERRORS)) is ChannelError
    other = _raised(redis.exceptions.DataError("Invalid input of type: 'dict'"))
    assert type(other) is StoreError and "DataError" in str(other)


def test_credentials_hint_is_the_rooms() -> None:
    explicit = dataclasses.replace(CHANNEL_ERRORS, credentials="the credentials in publisher.redis_url")
    err = _raised(AUTH_FAILURES[0], explicit)
    assert "publisher.redis_url" in str(err) and str(err).startswith("snapshot channel 10.0.0.1:7000:")
