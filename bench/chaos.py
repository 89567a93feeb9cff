"""``kelp bench chaos``: faults injected into real processes under a steady load; the invariants after.

The rig (:mod:`kelp.bench.chaos_rig`): Apache Kafka on its own log
directories (``--broker tansu``: Tansu on durable ``s3://`` storage, moto's S3
server, since that Tansu build has no postgres or sqlite engine), a
redis-server with ``appendonly yes`` + ``appendfsync always``, ``kelp train``
and ``kelp serve`` as child processes, a steady criteo-synth producer and a
light scoring client, and ``kelp join`` on its own topics with a click load
(:class:`~kelp.bench.chaos_rig.JoinSide`). The faults
(:mod:`kelp.bench.chaos_faults`), one after another, each followed by its
recovery:

* ``--quick``: 3 trainer kill -9s, a Redis restart, poisoned rows, a Redis
  stall, a broker restart, the replica's store going away, a click dated
  2100 and impressions timed NaN and infinity for the joiner (10 faults; each
  trainer restart costs a Python start, a torch import and a consumer-group
  join, which can take a quick run past the contract's 60 s on a small shared
  machine, docs/performance.md);
* the full run: 10 trainer kill -9s and each other fault twice (24 faults).

Poisoned rows come just before a trainer kill, so the next incarnation, whose
hot tier starts empty, reads them from Redis too.

Invariants reported (each must be 0):

* ``lost_records``: records the broker acknowledged to the producer that the
  broker no longer has, or that the group never committed past at the end
  (:func:`~kelp.bench.chaos_checks.account_records`);
* ``offset_regressions``: reads of the group's committed offsets lower than an
  earlier read, polled every 0.5 s through every fault;
* ``serve_5xx_other_than_503``: replica answers 5xx other than 503, plus
  client timeouts (``CLIENT_TIMEOUT_S``, a hang) and refused connections,
  which count as failures too (broken down in ``serve_answers``);
* ``trainer_crash_loops``: restarted trainers that never reached readiness
  (and ``trainer_unexpected_exits``: trainers that exited without being
  killed, e.g. on an error a fault provoked; ``invariants_ok`` wants 0 too);
* ``acked_updates_lost_fsync_always``: row updates Redis acknowledged before
  its SIGKILL and did not have after the restart;
* ``nonfinite_published``: published snapshots holding a non-finite tensor,
  read straight from the channel (:class:`~kelp.bench.chaos_poison.SnapshotAuditor`);
* ``serve_nonfinite_scores``: answers 200 holding a null (non-finite) score;
* ``join_orphaned_true_clicks``: clicks the bench sent (and the broker
  acknowledged) for acknowledged impressions that ``kelp join`` never emitted
  as a positive (:func:`~kelp.bench.chaos_checks.account_true_clicks`);
* ``join_crash_loops``: exits of ``kelp join`` the bench did not cause (an
  exit while the bench had its Redis away is expected, and counted apart in
  ``join_exits_during_store_outage``).

``join_dead_letters`` counts the joiner's dead letters by reason
(``future_ts`` and ``bad_type`` from the two join faults).

``--soak-minutes M`` runs the rig M minutes without faults instead
(:mod:`kelp.bench.chaos_soak`); ``--hosts`` runs the host mode instead: machines
that fail over, on network-namespace hosts (:mod:`kelp.bench.chaos_hosts`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from kelp.bench.chaos_checks import RecordBooks, account_records, committed_offsets
from kelp.bench.chaos_faults import Health, inject
from kelp.bench.chaos_load import CANDIDATES
from kelp.bench.chaos_poison import SnapshotAuditor
from kelp.bench.chaos_rig import CLIENT_TIMEOUT_S, IMPRESSION_RATE, PARTITIONS, Rig, RigParts
from kelp.bench.chaos_soak import soak
from kelp.bench.runner import progress
from kelp.errors import UserError

__all__ = ["run", "schedule"]

PRODUCE_RATE = 1000.0  # samples/s: steady, and under the trainer's speed even on a small busy machine
SCORE_RATE = 10.0  # requests/s: light load
SETTLE_TIMEOUT_S = 120.0

INVARIANTS = (
    "lost_records",
    "offset_regressions",
    "serve_5xx_other_than_503",
    "trainer_crash_loops",
    "trainer_unexpected_exits",
    "acked_updates_lost_fsync_always",
    "nonfinite_published",
    "serve_nonfinite_scores",
    "join_orphaned_true_clicks",
    "join_crash_loops",
)
"""The keys ``invariants_ok`` wants at 0."""


def schedule(quick: bool) -> list[str]:
    """The faults in order: trainer kills spread between the others.

    >>> schedule(quick=True)  # doctest: +NORMALIZE_WHITESPACE
    ['trainer_kill9', 'join_future_action', 'redis_restart', 'poisoned_rows', 'trainer_kill9', 'redis_stall',
     'join_nonfinite_impression', 'broker_restart', 'trainer_kill9', 'replica_store_away']
    >>> len(schedule(quick=False)), schedule(quick=False).count("poisoned_rows")
    (24, 2)
    """
    others = [
        "join_future_action",  # early: were the watermark to jump, every later click would show it
        "redis_restart",
        "poisoned_rows",
        "redis_stall",
        "join_nonfinite_impression",
        "broker_restart",
        "replica_store_away",
    ]
    if quick:
        return [
            "trainer_kill9",
            *others[0:3],
            "trainer_kill9",
            *others[3:6],
            "trainer_kill9",
            others[6],
        ]
    out: list[str] = []
    extra = others * 2
    for _ in range(10):
        if extra and extra[0] == "poisoned_rows":
            out.append(extra.pop(0))
        out.append("trainer_kill9")
        if extra:
            out.append(extra.pop(0))
    return out + extra


def run(
    quick: bool, soak_minutes: float | None = None, broker: str | None = None, hosts: str | None = None
) -> dict[str, Any]:
    if hosts is not None:
        return _run_hosts(quick, hosts, soak_minutes, broker)
    if soak_minutes is not None and soak_minutes <= 0:
        raise UserError("--soak-minutes must be > 0")
    keep = os.environ.get("KELP_CHAOS_WORKDIR")  # keep the processes' logs there, for a post-mortem
    workdir = contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory(prefix="kelp-chaos-")
    with (
        workdir as tmp,
        Rig(Path(tmp), PRODUCE_RATE, SCORE_RATE, broker, with_join=soak_minutes is None) as rig,
    ):
        if soak_minutes is not None:
            return {"mode": "soak", **_describe(rig), **soak(rig, soak_minutes)}
        if quick:  # a step at this rate is long enough that 0.5-2 s lands mid-step, mid-push or mid-commit
            rig.kill_window_s = (0.5, 2.0)
        return {"mode": "faults", **_describe(rig), **_faults(rig, quick)}


def _run_hosts(quick: bool, hosts: str, soak_minutes: float | None, broker: str | None) -> dict[str, Any]:
    """``--hosts`` (no value): the host mode, which starts its own Kafka cluster and runs no soak."""
    if hosts:
        raise UserError(f"kelp bench chaos --hosts takes no value, got {hosts!r}")
    if soak_minutes is not None or broker is not None:
        raise UserError(
            "kelp bench chaos --hosts runs its own 3-node Apache Kafka and no soak: "
            "drop --soak-minutes and --broker"
        )
    from kelp.bench.chaos_hosts import run_hosts

    return run_hosts(quick)


def _describe(rig: Rig) -> dict[str, Any]:
    return {
        "workload": "criteo-synth (synthetic), dlrm-small, batch 1024",
        "broker": rig.broker.label,
        "broker_storage": rig.broker.storage,
        "redis_persistence": "appendonly yes, appendfsync always",
        "produce_rate": rig.produce_rate,
        "score_rate": rig.score_rate,
        "client_timeout_s": CLIENT_TIMEOUT_S,
        **(
            {
                "join": f"kelp join: {IMPRESSION_RATE:g} impressions/s of {CANDIDATES} candidates, "
                "about half clicked 1-3 s later, a 60 s window"
            }
            if rig.join is not None
            else {}
        ),
    }


def _faults(rig: Rig, quick: bool) -> dict[str, Any]:
    rng = random.Random(15)
    health = Health()
    auditor = SnapshotAuditor(rig.cfg)
    auditor.start()
    faults = []
    for kind in schedule(quick):
        record = inject(rig, health, kind, rng)
        record["offset_regressions_so_far"] = len(rig.watcher.regressions())
        faults.append(record)
        progress(f"  {kind}: {_brief(record)}")
    joined = rig.join.settle() if rig.join is not None else {}
    settle = settle_group(rig, health)
    audit = auditor.finish()
    final = stop_rig(rig)
    books = account_records(rig.broker.bootstrap, rig.topic, rig.producer.acked, final["committed"])
    answers = rig.client.counts()
    bad_5xx = sum(n for status, n in answers.items() if status >= 500 and status != 503)
    failures = bad_5xx + answers[rig.client.HANG] + answers[rig.client.TRANSPORT]
    regressions = rig.watcher.regressions()
    probes = [f["acked_updates_lost"] for f in faults if f["fault"] == "redis_restart"]
    out: dict[str, Any] = {
        "faults_injected": len(faults),
        "lost_records": books.lost,
        "offset_regressions": len(regressions),
        "serve_5xx_other_than_503": failures,
        "trainer_crash_loops": health.crash_loops,
        "acked_updates_lost_fsync_always": sum(probes),
        "nonfinite_published": audit["nonfinite_published"],
        "serve_nonfinite_scores": rig.client.nonfinite_scores,
        **joined,
        "faults_by_kind": {
            k: sum(1 for f in faults if f["fault"] == k) for k in dict.fromkeys(schedule(quick))
        },
        **record_books(rig, books),
        "serve_hangs": answers[rig.client.HANG],
        "serve_transport_errors": answers[rig.client.TRANSPORT],
        "serve_strict_5xx_other_than_503": bad_5xx,
        "trainer_unexpected_exits": health.unexpected_exits,
        "trainer_incarnations": rig.trainer.incarnations,
        "acked_rows_probed": sum(f["acked_rows"] for f in faults if f["fault"] == "redis_restart"),
        **{k: v for k, v in audit.items() if k != "nonfinite_published"},
        **settle,
        **final["summary"],
        "faults": faults,
    }
    out["invariants_ok"] = (
        out["faults_injected"] >= len(schedule(quick))
        and out.get("join_true_clicks", 0) > 0  # a join check over no click would prove nothing
        and all(out[k] == 0 for k in INVARIANTS)
    )
    progress(
        f"faults {out['faults_injected']}, lost {out['lost_records']}, "
        f"regressions {out['offset_regressions']}, "
        f"bad serve answers {failures}, crash loops {health.crash_loops}, "
        f"acked updates lost {out['acked_updates_lost_fsync_always']}, "
        f"non-finite snapshots {out['nonfinite_published']}, null scores {out['serve_nonfinite_scores']}, "
        f"orphaned true clicks {out.get('join_orphaned_true_clicks')} of {out.get('join_true_clicks')}, "
        f"join crash loops {out.get('join_crash_loops')}, join dead letters {out.get('join_dead_letters')}"
    )
    return out


def record_books(rig: RigParts, books: RecordBooks) -> dict[str, Any]:
    """The records' accounting, the offset reads and the scoring answers of a settled run, the keys
    every chaos mode reports beside its invariants."""
    answers = rig.client.counts()
    return {
        "records_acked": books.acked,
        "records_committed": sum(max(c, 0) for c in books.committed),
        "records_missing_from_broker": books.missing_from_broker,
        "records_not_committed": books.not_committed,
        "producer_failed_sends": rig.producer.failed,
        "offset_reads": rig.watcher.reads,
        "offset_reads_failed": rig.watcher.failed_reads,
        "offset_regression_details": rig.watcher.regressions()[:10],
        "serve_answers": {status_name(k): v for k, v in sorted(answers.items())},
    }


def status_name(status: int) -> str:
    return {-1: "hang", 0: "transport_error"}.get(status, str(status))


def _brief(record: dict[str, Any]) -> str:
    keys = (
        "restart_ready_s",
        "acked_updates_lost",
        "stall_s",
        "away_s",
        "commits_advanced_after_s",
        "join_live_before_s",
        "join_rejected_future_ts",
        "join_rejected_bad_type",
        "join_watermark_ahead_of_wall_s",
        "join_exits_during",
        "join_positive_again_s",
    )
    parts = [f"{k}={record[k]}" for k in keys if k in record]
    parts.append(f"serve during {record['serve_answers_during']}")
    parts.append(
        f"trainer again {record['trainer_training_again_s']}s, serve 200 again {record['serve_200_again_s']}s"
    )
    return ", ".join(parts)


def settle_group(rig: RigParts, health: Health) -> dict[str, Any]:
    """Stop producing; wait until the group committed every acknowledged record (or the timeout)."""
    progress("stopping the producer; waiting for the trainer to commit every acknowledged record")
    rig.producer.finish()
    if rig.producer.error is not None:
        raise RuntimeError(f"the producer failed: {rig.producer.error}")
    ends = rig.producer.acked_end()
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_TIMEOUT_S:
        health.check_trainer(rig)
        if all(c >= e for c, e in zip(rig.watcher.latest(), ends, strict=True)):
            break
        time.sleep(0.5)
    settled = all(c >= e for c, e in zip(rig.watcher.latest(), ends, strict=True))
    if not settled:
        progress(f"the group had not committed every acknowledged record after {SETTLE_TIMEOUT_S:.0f}s")
    return {"settle_s": round(time.monotonic() - started, 2), "settled": settled, "acked_end_offsets": ends}


def stop_rig(rig: RigParts) -> dict[str, Any]:
    """SIGTERM the trainer (it drains and prints its summary), stop the rest; the final committed offsets."""
    from kafka import KafkaAdminClient

    rig.watcher.finish()
    rig.client.finish()
    if rig.join is not None:
        rig.join.process.stop(30)
    code = rig.trainer.stop(60)
    rig.serve.stop(10)
    admin = KafkaAdminClient(bootstrap_servers=rig.broker.bootstrap, request_timeout_ms=10_000)
    try:
        committed = committed_offsets(admin, rig.cfg.source.group_id, rig.topic, PARTITIONS)
    finally:
        admin.close()
    summary: dict[str, Any] = {"trainer_exit_code": code}
    for line in (rig.trainer.log_tail(200_000) or "").splitlines():
        if '"train_summary"' in line:
            s = json.loads(line[line.index("{") :])
            summary["final_trainer_samples"] = s.get("samples")
            summary["final_trainer_auc"] = s.get("auc")
    return {"committed": committed, "summary": summary}
