"""Fail fast at start-up: every endpoint a process needs must answer within a short budget.

``trainer.max_store_outage_s`` (60 s) is for a store that goes away *during* a
run. At start-up a store or broker that does not answer is far more often a
wrong address, so ``kelp train`` and ``kelp serve`` first check each endpoint,
retrying only until ``trainer.startup_timeout_s`` / ``serving.startup_timeout_s``
(10 s by default), and then exit with one line that names the setting, the
endpoint (its password hidden) and the budget::

    kelp: error: store.urls[0]: redis://:**redacted**@10.0.0.9:6379 did not answer within 10s
      (trainer.startup_timeout_s): ConnectionError: Error 111 connecting to 10.0.0.9:6379. Connection refused.

Each room offers the probe for its own endpoints
(:func:`kelp.store.redis.connection.ping_probe`,
:func:`kelp.consumers.kafka_client.bootstrap_probe`); this module only walks the
config and the budget. Checked: each Redis node of ``store.urls`` (not the memory backend), the
snapshot channel's ``publisher.redis_url`` (the trainer only when it publishes),
and, for the trainer, the Kafka bootstrap servers. Wrong credentials are not
retried: they fail at once as :class:`~kelp.errors.RedisAuthError` or
:class:`~kelp.consumers.errors.SourceUserError` (exit 2). Kafka reports a refused
SASL login or certificate only as a bootstrap that never completes, so those
fail when the budget is spent, as :class:`~kelp.consumers.errors.SourceAuthError`
(exit 2), naming the listener and the ``source.security`` setting to check. ``kelp config validate`` does
not contact anything; this runs only where a process starts.

Once the store answers, :func:`check_no_restore` refuses to start a trainer or
a replica while ``kelp store restore`` (or ``kelp model rollback --rows``) is
rewriting the deployment's rows, or one was killed half-way: one line naming
the snapshot and the command that finishes it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator

from kelp.config import KafkaSourceConfig, KelpConfig
from kelp.daemon.preflight import Role
from kelp.errors import KelpError, UserError
from kelp.redaction import redact_url
from kelp.retry import RetryPolicy

__all__ = ["RestoreInProgressError", "StartupUnreachableError", "check_endpoints", "check_no_restore"]


class StartupUnreachableError(KelpError):
    """An endpoint did not answer within the start-up budget (exit 1: the process never started)."""


class RestoreInProgressError(UserError):
    """A row restore is rewriting the deployment's store: a trainer or replica would read half of it."""


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
    check_no_restore(cfg, role)


def check_no_restore(cfg: KelpConfig, role: Role) -> None:
    """Refuse to start while ``kelp store restore`` rewrites the store (its marker is in the store's Redis).

    A trainer started then would train on, and write over, a mix of old and
    restored rows, and would consume from offsets the restore is about to
    move; a replica would serve that mix. A memory store lives in one process,
    so no restore can be running on it.
    """
    if cfg.store.backend == "memory":
        return
    from kelp.daemon.row_snapshots import restore_in_progress

    running = restore_in_progress(cfg)
    if running is None:
        return
    named = re.search(r"snapshot (\S+)", running)
    snapshot = named.group(1) if named else "ID"
    raise RestoreInProgressError(
        f"kelp {role} refused: {running} has not finished on deployment {cfg.deployment!r}; let it "
        f"finish, or finish an interrupted one with `kelp store restore --config F --snapshot {snapshot} "
        "--replace`, then start again"
    )


def _reason(exc: BaseException) -> str:
    """The underlying failure without the room's own prefix (the message names the endpoint already)."""
    reason = getattr(exc, "reason", None)
    return " ".join(str(reason if reason is not None else exc).split())


def _endpoints(cfg: KelpConfig, role: Role, budget: float) -> Iterator[_Endpoint]:
    from kelp.consumers.kafka_client import bootstrap_probe
    from kelp.publish.redis_channel import CHANNEL_ERRORS
    from kelp.store.redis.connection import STORE_ERRORS, connection_options, ping_probe

    store = cfg.store
    if store.backend != "memory":
        options = connection_options(store)
        for i, url in enumerate(store.urls):
            yield _Endpoint(f"store.urls[{i}]", redact_url(url), ping_probe(url, options, STORE_ERRORS))
    publishes = cfg.publisher.enabled or role == "serve"  # a replica reads snapshots either way
    if publishes and cfg.publisher.channel == "redis" and cfg.publisher.redis_url is not None:
        url = cfg.publisher.redis_url
        room = dataclasses.replace(CHANNEL_ERRORS, credentials="the credentials in publisher.redis_url")
        options = connection_options(store, credentials=False)
        yield _Endpoint("publisher.redis_url", redact_url(url), ping_probe(url, options, room))
    if role == "train" and isinstance(cfg.source, KafkaSourceConfig):
        shown = ",".join(redact_url(s) for s in cfg.source.bootstrap_servers)
        probe = bootstrap_probe(cfg.source, budget, "trainer.startup_timeout_s")
        yield _Endpoint("source.bootstrap_servers", shown, probe)
