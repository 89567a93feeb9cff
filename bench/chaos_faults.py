"""The chaos bench's fault injectors, and the recovery each fault is followed by.

Every injector takes the running :class:`~kelp.bench.chaos_rig.Rig`, does one
thing to one real process, and returns what it saw. :func:`inject` wraps it:
the trainer's and the replica's metrics before and after (store errors and
retries, trainer retries, readiness, commits, 503s), the scoring client's
answers during the fault, and the recovery: the trainer ready and training
again, the replica answering 200 again, by themselves.

* ``trainer_kill9``: SIGKILL of ``kelp train`` at a random point, then a
  restart (as Kubernetes would); a restart that never gets ready counts as a
  crash loop;
* ``redis_restart``: SIGKILL of redis-server while a writer pushes rows
  through Kelp's store, then a start on the same data directory
  (``acked_updates_lost`` from :mod:`kelp.bench.chaos_durability`);
* ``redis_stall``: SIGSTOP for longer than the store's socket timeout, then SIGCONT;
* ``broker_restart``: SIGKILL of the broker, then a start on the same storage
  (Apache Kafka's log directories, or Tansu's S3 bucket);
* ``replica_store_away``: redis-server down for a few seconds while the
  replica answers (it must answer 503, never hang), then back;
* ``poisoned_rows``: NaN rows and wrong-length values written over rows both
  processes read (:mod:`kelp.bench.chaos_poison`); they must be quarantined;
* ``join_future_action``: the joiner's impressions pause until their
  partition is idle (``idle_partition_s``, short in the rig), then a click
  dated 2100 for an unknown request. Were it to move the watermark, every
  window would close at once and every later click would find its
  impression gone: orphaned;
* ``join_nonfinite_impression``: two impressions whose ``ts`` is NaN and
  infinity (msgpack floats, as a hostile producer would send them). Were the
  joiner to take them, it would crash-loop on them or close every window.

A fault that takes Redis away also takes the joiner's waiting store away: the
joiner's exit then is expected (:meth:`~kelp.bench.chaos_procs.JoinWatch.store_outage`).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from kelp.bench.chaos_durability import probe_acked_updates
from kelp.bench.chaos_load import click_record, impression_record, send_now
from kelp.bench.chaos_poison import poisoned_rows
from kelp.bench.chaos_procs import Metrics, total
from kelp.bench.chaos_rig import IDLE_PARTITION_S, STORE_SOCKET_TIMEOUT_S, WINDOW_S, JoinSide, Rig, RigParts
from kelp.bench.runner import progress

__all__ = ["FAULTS", "STORE_FAULTS", "Health", "inject", "join_future_action", "join_nonfinite_impression"]

READY_TIMEOUT_S = 90.0
RECOVERY_TIMEOUT_S = 90.0
RESTART_ATTEMPTS = 3
STORE_FAULTS = frozenset({"redis_restart", "redis_stall", "replica_store_away"})
"""Faults that take the joiner's Redis away: its exit (1, one line) is then expected."""
FUTURE_TS = 4_102_444_800.0
"""2100-01-01T00:00:00Z: the event time of the hostile click."""
JOIN_EFFECT_TIMEOUT_S = 10.0
"""How long a join fault waits for the joiner to have read its hostile records."""


class Health:
    """Counts across the run: trainer restarts that never got ready, exits nobody asked for."""

    def __init__(self) -> None:
        self.crash_loops = 0
        self.unexpected_exits = 0
        self.kill_points_s: list[float] = []

    def restart_trainer(self, rig: RigParts) -> float | None:
        """Start ``kelp train`` until one incarnation is ready; seconds to ready, None if none was."""
        for _ in range(RESTART_ATTEMPTS):
            rig.trainer.start()
            took = rig.trainer.wait_ready(READY_TIMEOUT_S)
            if took is not None:
                return took
            self.crash_loops += 1
            progress(f"trainer restart {rig.trainer.incarnations} not ready:\n{rig.trainer.log_tail(800)}")
            rig.trainer.kill9()
        return None

    def check_trainer(self, rig: RigParts) -> None:
        """A trainer that exited by itself is restarted (and counted)."""
        if not rig.trainer.alive():
            self.unexpected_exits += 1
            progress(f"trainer exited by itself ({rig.trainer.exit_code()}):\n{rig.trainer.log_tail(800)}")
            self.restart_trainer(rig)


def trainer_view(m: Metrics) -> dict[str, float]:
    """The trainer's counters that show a fault (this incarnation's: a restart starts them at 0)."""
    return {
        "ready": total(m, "kelp_trainer_ready"),
        "steps": total(m, "kelp_trainer_steps_total"),
        "errors_retried": total(m, "kelp_trainer_errors_total", kind="retried"),
        "errors_fatal": total(m, "kelp_trainer_errors_total", kind="fatal"),
        "store_retries": total(m, "kelp_store_retries_total"),
        "store_errors": total(m, "kelp_store_errors_total"),
        "commits_ok": total(m, "kelp_consumer_commits_total", result="ok"),
        "commits_failed": total(m, "kelp_consumer_commits_total", result="failed"),
        "rows_quarantined": total(m, "kelp_store_rows_quarantined_total"),
        "steps_skipped": total(m, "kelp_trainer_steps_skipped_total"),
    }


def serve_view(m: Metrics) -> dict[str, float]:
    """The replica's counters that show a fault."""
    return {
        "ready": total(m, "kelp_serving_ready"),
        "answered_200": total(m, "kelp_serving_requests_total", status="200"),
        "answered_503": total(m, "kelp_serving_requests_total", status="503"),
        "store_retries": total(m, "kelp_store_retries_total"),
        "store_errors": total(m, "kelp_store_errors_total"),
        "rows_quarantined": total(m, "kelp_store_rows_quarantined_total"),
    }


def process_views(rig: RigParts) -> dict[str, dict[str, float]]:
    """Both processes' counters, and whether each one's /readyz answers 200 now (the ``ready``
    gauges only change when something probes /readyz)."""
    return {
        "trainer": {**trainer_view(rig.trainer.metrics()), "readyz_200": float(rig.trainer.ready())},
        "serve": {**serve_view(rig.serve.metrics()), "readyz_200": float(rig.serve.ready())},
    }


def answers_delta(after: Counter[int], before: Counter[int]) -> dict[str, int]:
    names = {200: "200", 503: "503", 0: "transport_error", -1: "hang"}
    return {names.get(k, str(k)): after[k] - before[k] for k in after if after[k] - before[k]}


def wait_recovered(rig: RigParts, health: Health, ok_before: int) -> dict[str, Any]:
    """Wait for the trainer to train and the replica to answer 200 again; how long each took."""
    started = time.monotonic()
    health.check_trainer(rig)
    steps_at = trainer_view(rig.trainer.metrics())["steps"]
    trainer_s = serve_s = None
    while time.monotonic() - started < RECOVERY_TIMEOUT_S and (trainer_s is None or serve_s is None):
        if trainer_s is None:
            health.check_trainer(rig)
            view = trainer_view(rig.trainer.metrics())
            if view["ready"] == 1 and view["steps"] > steps_at:
                trainer_s = round(time.monotonic() - started, 2)
        if serve_s is None and rig.client.counts()[200] > ok_before:
            serve_s = round(time.monotonic() - started, 2)
        time.sleep(0.2)
    return {"trainer_training_again_s": trainer_s, "serve_200_again_s": serve_s}


def inject(rig: Rig, health: Health, kind: str, rng: random.Random) -> dict[str, Any]:
    """Run fault ``kind`` (a key of :data:`FAULTS`) with its evidence and recovery."""
    outage: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if rig.join is not None and kind in STORE_FAULTS:
        outage = rig.join.watch.store_outage()

    def act() -> dict[str, Any]:
        with outage:
            return FAULTS[kind](rig, health, rng)

    return with_evidence(rig, health, kind, act)


def with_evidence(
    rig: RigParts, health: Health, kind: str, act: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``act`` (one fault) with what shows it: both processes' counters before and after, the
    scoring answers during it, and the recovery (training and answering 200 again)."""
    before = process_views(rig)
    answers = rig.client.counts()
    at = rig.clock()
    progress(f"fault {kind} at {at:.1f}s")
    seen = act()
    during = answers_delta(rig.client.counts(), answers)
    recovery = wait_recovered(rig, health, rig.client.counts()[200])
    return {
        "fault": kind,
        "at_s": at,
        **seen,
        "serve_answers_during": during,
        **recovery,
        "metrics_before": before,
        "metrics_after": process_views(rig),
    }


def trainer_kill9(rig: Rig, health: Health, rng: random.Random) -> dict[str, Any]:
    time.sleep(rng.uniform(*rig.kill_window_s))  # a random point of the stream: mid-step, -push, -commit
    steps = trainer_view(rig.trainer.metrics())["steps"]
    health.kill_points_s.append(rig.clock())
    rig.trainer.kill9()
    ready_s = health.restart_trainer(rig)
    return {"killed_after_steps": steps, "restart_ready_s": None if ready_s is None else round(ready_s, 2)}


def redis_restart(rig: Rig, health: Health, rng: random.Random) -> dict[str, Any]:
    probe = probe_acked_updates(rig.redis, seed=rng.randrange(1 << 30))
    d = probe.durability[0] if probe.durability else None
    return {
        "acked_pushes": probe.pushes_acked,
        "acked_rows": probe.acked_rows,
        "acked_updates_lost": probe.lost,
        "appendonly": d.appendonly if d else None,
        "appendfsync": d.appendfsync if d else None,
    }


def redis_stall(rig: Rig, health: Health, rng: random.Random) -> dict[str, Any]:
    stall_s = round(3 * STORE_SOCKET_TIMEOUT_S + rng.uniform(0.0, 1.0), 2)
    rig.redis.pause()
    try:
        time.sleep(stall_s)
        replica_ready = rig.serve.ready()
    finally:
        rig.redis.resume()
    return {"stall_s": stall_s, "replica_ready_while_stalled": replica_ready}


def broker_restart(rig: Rig, health: Health, rng: random.Random) -> dict[str, Any]:
    committed = rig.watcher.latest()
    rig.broker.kill()
    down_s = round(rng.uniform(1.0, 3.0), 2)
    time.sleep(down_s)
    started = time.monotonic()
    rig.broker.start()
    restart_s = time.monotonic() - started
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline and not _advanced(rig.watcher.latest(), committed):
        time.sleep(0.2)
    advanced = _advanced(rig.watcher.latest(), committed)
    return {
        "storage": rig.broker.storage,
        "down_s": down_s,
        "broker_restart_s": round(restart_s, 2),
        "committed_before": committed,
        "commits_advanced_after_s": round(time.monotonic() - started, 2) if advanced else None,
    }


def _advanced(now: list[int], before: list[int]) -> bool:
    return any(n > b for n, b in zip(now, before, strict=True))


def replica_store_away(rig: Rig, health: Health, rng: random.Random) -> dict[str, Any]:
    away_s = round(rng.uniform(3.0, 5.0), 2)
    rig.redis.kill()
    time.sleep(away_s)
    readyz_while_away = rig.serve.ready()
    rig.redis.start()  # same port, same append-only file
    return {"away_s": away_s, "replica_ready_while_away": readyz_while_away}


def _rejected(side: JoinSide, reason: str) -> float:
    return total(side.process.metrics(), "kelp_join_rejected_total", reason=reason)


def _watermark(side: JoinSide) -> float | None:
    m = side.process.metrics()
    return total(m, "kelp_join_watermark_seconds") if m else None


def _await_until(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def _ahead_of_wall(watermark: float | None) -> float | str | None:
    """How far the joiner's watermark runs ahead of the wall clock (it should trail it); JSON-safe."""
    if watermark is None:
        return None
    if not math.isfinite(watermark):
        return str(watermark)  # JSON has no NaN or infinity
    return round(watermark - time.time(), 1)


def join_future_action(rig: Rig, health: Any, rng: random.Random) -> dict[str, Any]:
    """While the impressions pause (their partition idle), a click dated 2100 for an unknown request."""
    side = _side(rig)
    live_s = side.joined_again_s(time.time())  # a joiner restarting after the last fault would miss it
    exits = len(side.watch.exits)
    pause_s = round(2 * IDLE_PARTITION_S + 1.0 + rng.uniform(0.0, 1.0), 2)
    with side.load.paused():
        time.sleep(pause_s)  # the impressions partition idle and caught up: it no longer holds the watermark
        before = _rejected(side, "future_ts")
        rid = f"chaos-future-{uuid.uuid4().hex[:8]}"
        send_now(side.broker.bootstrap, side.topics.clicks, rid, click_record(rid, 1, FUTURE_TS))
        sent = time.time()

        def seen() -> bool:
            wm = _watermark(side)
            return _rejected(side, "future_ts") > before or (wm is not None and wm > sent + WINDOW_S)

        _await_until(seen, JOIN_EFFECT_TIMEOUT_S)
        watermark = _watermark(side)
    return {
        "join_live_before_s": live_s,
        "impressions_paused_s": pause_s,
        "future_ts": FUTURE_TS,
        "join_rejected_future_ts": _rejected(side, "future_ts") - before,
        "join_watermark_ahead_of_wall_s": _ahead_of_wall(watermark),
        "join_exits_during": len(side.watch.exits) - exits,
        "join_positive_again_s": side.joined_again_s(sent),
    }


def join_nonfinite_impression(rig: Rig, health: Any, rng: random.Random) -> dict[str, Any]:
    """An impression whose ``ts`` is NaN and one whose ``ts`` is infinity, as raw msgpack floats."""
    side = _side(rig)
    live_s = side.joined_again_s(time.time())
    exits = len(side.watch.exits)
    before = _rejected(side, "bad_type")
    items = np.arange(3, dtype=np.uint64) + np.uint64(rng.randrange(1 << 40))
    for name, ts in (("nan", float("nan")), ("inf", float("inf"))):
        rid = f"chaos-{name}-{uuid.uuid4().hex[:8]}"
        send_now(side.broker.bootstrap, side.topics.impressions, rid, impression_record(rid, ts, items))
    sent = time.time()
    _await_until(
        lambda: _rejected(side, "bad_type") - before >= 2 or len(side.watch.exits) > exits,
        JOIN_EFFECT_TIMEOUT_S,
    )
    return {
        "join_live_before_s": live_s,
        "impressions_sent": ["nan", "inf"],
        "join_rejected_bad_type": _rejected(side, "bad_type") - before,
        "join_watermark_ahead_of_wall_s": _ahead_of_wall(_watermark(side)),
        "join_exits_during": len(side.watch.exits) - exits,
        "join_positive_again_s": side.joined_again_s(sent),
    }


def _side(rig: Rig) -> JoinSide:
    if rig.join is None:
        raise RuntimeError("this rig runs no kelp join")
    return rig.join


FAULTS: dict[str, Callable[[Rig, Health, random.Random], dict[str, Any]]] = {
    "trainer_kill9": trainer_kill9,
    "redis_restart": redis_restart,
    "redis_stall": redis_stall,
    "broker_restart": broker_restart,
    "replica_store_away": replica_store_away,
    "poisoned_rows": poisoned_rows,
    "join_future_action": join_future_action,
    "join_nonfinite_impression": join_nonfinite_impression,
}
