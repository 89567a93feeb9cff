"""Fail fast at start-up: every endpoint a process needs must answer within a short budget.

``trainer.max_store_outage_s`` (60 s) is for a store that goes away *during* a
run. At start-up a store or broker that does not answer is far more often a
wrong address, so ``kelp train`` and ``kelp serve`` first check each endpoint,
retrying only until ``trainer.startup_timeout_s`` / ``serving.startup_timeout_s``
(10 s by default), and then exit with one line that names the setting, the
endpoint (its password hidden) and the budget::

    kelp: error: store.urls[0]: redis://:**redacted**@10.0.0.9:6379 did not answer within 10s
      (trainer.startup_timeout_s): ConnectionError: Error 111 connecting to 10.0.0.9:6379. Connection refused.

Checked: each Redis node of ``store.urls`` (not the memory backend), the
snapshot channel's ``publisher.redis_url`` (the trainer only when it publishes),
and, for the trainer, the Kafka bootstrap servers. Wrong credentials are not
retried: they fail at once as :class:`~kelp.errors.RedisAuthError` or
:class:`~kelp.consumers.errors.SourceUserError` (exit 2). Kafka reports a refused
SASL login or certificate only as a bootstrap that never completes, so those
fail when the budget is spent, as :class:`~kelp.consumers.errors.SourceAuthError`
(exit 2), naming the listener and the ``source.security`` setting to check. ``kelp config validate`` does
not contact anything; this runs only where a process starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from kelp.config import KafkaSourceConfig, KelpConfig
from kelp.daemon.preflight import Role
from kelp.errors import KelpError
from kelp.redaction import redact_url
from kelp.retry import RetryPolicy

__all__ = ["StartupUnreachableError", "check_endpoints"]


class StartupUnreachableError(KelpError):
    """An endpoint did not answer within the start-up budget (exit 1: the process never started)."""


@dataclasses.dataclass(frozen=True)
class _Endpoint:
    setting: str  # the config field that names it, e.g. store.urls[0]
    shown: str  # the address with its password hidden
    probe: Callable[[], None]  # raises a retriable KelpError while it does not answer


def check_endpoints(cfg: KelpConfig, role: Role, *, sleep: Callable[[float], None] | None = None) -> None:
    """Raise :class:`StartupUnreachableError` naming the first endpoint that stays silent past the budget."""
    budget_setting = "trainer.startup_timeout_s" if role == "train" else "serving.startup_timeout_s"
    budget = cfg.trainer.startup_timeout_s if role == "train" else cfg.serving.startup_timeout_s
    extra = {"sleep": sleep} if sleep is not None else {}
    policy = RetryPolicy(attempts=None, base_delay_s=0.1, max_delay_s=1.0, deadline_s=budget, **extra)
    for endpoint in _endpoints(cfg, role, budget):
        try:
            policy.call(endpoint.probe)
        except KelpError as exc:
            if not exc.retriable:
                raise  # wrong credentials, a refused command: already one line naming the setting
            raise StartupUnreachableError(
                f"{endpoint.setting}: {endpoint.shown} did not answer within {budget:g}s "
                f"({budget_setting}): {_reason(exc)}"
            ) from None


def _reason(exc: BaseException) -> str:
    """The underlying failure without the room's own prefix (the message names the endpoint already)."""
    reason = getattr(exc, "reason", None)
    return " ".join(str(reason if reason is not None else exc).split())


def _endpoints(cfg: KelpConfig, role: Role, budget: float) -> Iterator[_Endpoint]:
    from kelp.publish.redis_channel import CHANNEL_ERRORS
    from kelp.store.redis.connection import STORE_ERRORS, connection_options

    store = cfg.store
    if store.backend != "memory":
        options = connection_options(store)
        for i, url in enumerate(store.urls):
            yield _Endpoint(f"store.urls[{i}]", redact_url(url), _redis_ping(url, options, STORE_ERRORS))
    publishes = cfg.publisher.enabled or role == "serve"  # a replica reads snapshots either way
    if publishes and cfg.publisher.channel == "redis" and cfg.publisher.redis_url is not None:
        url = cfg.publisher.redis_url
        room = dataclasses.replace(CHANNEL_ERRORS, credentials="the credentials in publisher.redis_url")
        options = connection_options(store, credentials=False)
        yield _Endpoint("publisher.redis_url", redact_url(url), _redis_ping(url, options, room))
    if role == "train" and isinstance(cfg.source, KafkaSourceConfig):
        shown = ",".join(redact_url(s) for s in cfg.source.bootstrap_servers)
        yield _Endpoint("source.bootstrap_servers", shown, _kafka_bootstrap(cfg.source, budget))


def _redis_ping(url: str, options: dict[str, Any], room: Any) -> Callable[[], None]:
    """PING one node (a cluster's seed nodes answer it too) through the one Redis error translation."""
    from kelp.store.redis.connection import connect_node, node_name, translate_redis_errors

    def probe() -> None:
        client = connect_node(url, options)
        try:
            with translate_redis_errors(node_name(url), room):
                client.ping()
        finally:
            client.close()

    return probe


def _kafka_bootstrap(source: KafkaSourceConfig, budget: float) -> Callable[[], None]:
    """Bootstrap a throw-away consumer (metadata from any one broker), bounded by the budget itself.

    kafka-python retries the bootstrap on its own until ``bootstrap_timeout_ms``,
    so one attempt covers the budget; its per-attempt error logs are kept off the
    output (the one line below says it all). An attempt refused for credentials
    or TLS trust makes the failure a :class:`~kelp.consumers.errors.SourceAuthError`
    (exit 2) rather than "no broker answered": waiting cannot fix those.
    """
    from kafka import KafkaConsumer

    from kelp.consumers.bootstrap_check import watch_bootstrap
    from kelp.consumers.errors import SourceUserError, translate_kafka_error
    from kelp.consumers.kafka_settings import client_settings

    def probe() -> None:
        settings = client_settings(source)
        try:
            with watch_bootstrap(settings):
                consumer = KafkaConsumer(**settings, bootstrap_timeout_ms=int(budget * 1000))
                consumer.close()
        except Exception as exc:
            err = translate_kafka_error(exc, "bootstrap")
            if isinstance(err, SourceUserError):
                raise err from None  # bad credentials or settings: not a matter of waiting
            # Not retriable here: kafka-python has waited out the whole budget already.
            raise StartupUnreachableError(
                f"source.bootstrap_servers: no broker of {', '.join(source.bootstrap_servers)} answered "
                f"within {budget:g}s (trainer.startup_timeout_s): {_reason_of(exc)}"
            ) from None

    return probe


def _reason_of(exc: BaseException) -> str:
    """``Type: message``, once (kafka-python's messages often start with their type already)."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"
