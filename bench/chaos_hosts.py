"""``kelp bench chaos --hosts``: machines fail over under a steady load; the invariants after.

The rig (:mod:`kelp.bench.chaos_host_rig`, root only): a Redis Cluster of 3
primaries + 3 replicas with ``store.durability.replicas_ack: 1``, a 3-node
KRaft Kafka (replication factor 3, ``min.insync.replicas`` 2, ``acks=all``),
``kelp train`` and ``kelp serve`` each on its own host. The faults
(:mod:`kelp.bench.chaos_host_faults`), one after another, each followed by
its recovery: a Redis primary killed (its replica promoted), a Kafka broker
killed and restarted, the trainer's host partitioned for a few seconds, 5 %
packet loss on a Redis primary's host for 10 s. ``--quick`` runs each once,
the full run twice.

Invariants reported (each must be 0), as the single-host chaos suite counts them:

* ``lost_records``: records the cluster acknowledged (``acks=all``) that it
  no longer has, or that the group never committed past at the end;
* ``acked_updates_lost_replicas_ack``: row versions Redis acknowledged (after
  ``WAIT`` for one replica) before a primary's SIGKILL that the promoted
  replica lacks;
* ``offset_regressions``: reads of the group's committed offsets lower than an earlier read;
* ``trainer_crash_loops``: restarted trainers that never got ready, and
  ``trainer_unexpected_exits``: trainers that exited by themselves;
* ``serve_answers_not_200_or_503``: replica answers other than 200 and 503, hangs
  and refused connections included.

``faults_observed`` says that each fault bit: a replica was promoted, the
partition leaders left the killed broker and it came back, the trainer was
unreachable while cut off, the lossy link made TCP retransmit.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
from pathlib import Path
from typing import Any

from kelp.bench.chaos import record_books, settle_group, stop_rig
from kelp.bench.chaos_checks import account_records
from kelp.bench.chaos_faults import Health
from kelp.bench.chaos_host_faults import LOSS_PCT, LOSS_S, inject_host
from kelp.bench.chaos_host_rig import REPLICAS_ACK, HostChaosRig
from kelp.bench.chaos_rig import CLIENT_TIMEOUT_S
from kelp.bench.runner import progress
from kelp.errors import UserError
from kelp.harness.hosts import available
from kelp.harness.kafka_dist import java_available

__all__ = ["HOST_INVARIANTS", "host_schedule", "run_hosts"]

PRODUCE_RATE = 500.0
"""samples/s: under the trainer's speed with three JVMs and six redis-servers on the same cores."""
SCORE_RATE = 5.0

HOST_INVARIANTS = (
    "lost_records",
    "acked_updates_lost_replicas_ack",
    "offset_regressions",
    "trainer_crash_loops",
    "trainer_unexpected_exits",
    "serve_answers_not_200_or_503",
)
"""The keys ``invariants_ok`` wants at 0."""


def host_schedule(quick: bool) -> list[str]:
    """The faults in order; the full run repeats the quick one.

    >>> host_schedule(quick=True)
    ['redis_primary_kill', 'broker_kill', 'trainer_partition', 'packet_loss']
    """
    once = ["redis_primary_kill", "broker_kill", "trainer_partition", "packet_loss"]
    return once if quick else once * 2


def run_hosts(quick: bool) -> dict[str, Any]:
    """The host-mode run; stops with one line where network namespaces cannot be made or Apache
    Kafka cannot run."""
    ok, why = available()
    if not ok:
        raise UserError(f"kelp bench chaos --hosts needs root and network namespaces: {why}")
    if not java_available():
        raise UserError("kelp bench chaos --hosts runs Apache Kafka: java (and mvn or cached jars) not found")
    keep = os.environ.get("KELP_CHAOS_WORKDIR")  # keep the processes' logs there, for a post-mortem
    workdir = contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory(prefix="kelp-chaos-h-")
    with workdir as tmp, HostChaosRig(Path(tmp), PRODUCE_RATE, SCORE_RATE) as rig:
        return {"mode": "hosts", **_describe(rig), **_faults(rig, quick)}


def _describe(rig: HostChaosRig) -> dict[str, Any]:
    return {
        "workload": "criteo-synth (synthetic), dlrm-small, batch 1024",
        "broker": f"{rig.broker.label}: replication factor 3, min.insync.replicas 2, producer acks=all",
        "redis": f"Redis Cluster, 3 primaries + 3 replicas on six hosts, replicas_ack {REPLICAS_ACK}",
        "hosts": {name: host.address for name, host in rig.net.hosts.items()},
        "loss": f"{LOSS_PCT:g}% both ways for {LOSS_S:g}s",
        "produce_rate": rig.produce_rate,
        "score_rate": rig.score_rate,
        "client_timeout_s": CLIENT_TIMEOUT_S,
    }


def _observed(faults: list[dict[str, Any]]) -> dict[str, bool]:
    """Whether each kind of fault bit every time it ran."""

    def every(kind: str, bit: Any) -> bool:
        runs = [f for f in faults if f["fault"] == kind]
        return bool(runs) and all(bit(f) for f in runs)

    return {
        "redis_replica_promoted": every(
            "redis_primary_kill", lambda f: f["promoted_replica"] != f["killed_primary"]
        ),
        "broker_down_and_back": every(
            "broker_kill", lambda f: f["leaders_moved_after_s"] is not None and f["broker_back_after_s"]
        ),
        "trainer_cut_off": every("trainer_partition", lambda f: not f["trainer_reachable_while_cut"]),
        "packets_lost": every("packet_loss", lambda f: f["tcp_retransmits_during"] > 0),
    }


def _faults(rig: HostChaosRig, quick: bool) -> dict[str, Any]:
    rng = random.Random(47)
    health = Health()
    faults = []
    for kind in host_schedule(quick):
        record = inject_host(rig, health, kind, rng)
        record["offset_regressions_so_far"] = len(rig.watcher.regressions())
        faults.append(record)
        progress(f"  {kind}: {_brief(record)}")
    settle = settle_group(rig, health)
    final = stop_rig(rig)
    books = account_records(rig.broker.bootstrap, rig.topic, rig.producer.acked, final["committed"])
    answers = rig.client.counts()
    bad_5xx = sum(n for status, n in answers.items() if status >= 500 and status != 503)
    other = sum(n for status, n in answers.items() if 0 < status < 500 and status != 200)
    failures = bad_5xx + other + answers[rig.client.HANG] + answers[rig.client.TRANSPORT]
    regressions = rig.watcher.regressions()
    observed = _observed(faults)
    out: dict[str, Any] = {
        "faults_injected": len(faults),
        "lost_records": books.lost,
        "acked_updates_lost_replicas_ack": sum(
            f["acked_updates_lost"] for f in faults if f["fault"] == "redis_primary_kill"
        ),
        "offset_regressions": len(regressions),
        "trainer_crash_loops": health.crash_loops,
        "trainer_unexpected_exits": health.unexpected_exits,
        "serve_answers_not_200_or_503": failures,
        "faults_observed": observed,
        "fault_timings": _timings(faults),
        **record_books(rig, books),
        "trainer_incarnations": rig.trainer.incarnations,
        **settle,
        **final["summary"],
        "faults": faults,
    }
    out["invariants_ok"] = (
        out["faults_injected"] >= len(host_schedule(quick))
        and all(observed.values())
        and settle["settled"]
        and all(out[k] == 0 for k in HOST_INVARIANTS)
    )
    progress(
        "faults {faults_injected}, lost {lost_records}, "
        "acked updates lost {acked_updates_lost_replicas_ack}, "
        "regressions {offset_regressions}, crash loops {trainer_crash_loops}, "
        "unexpected trainer exits {trainer_unexpected_exits}, "
        "serve answers not 200 or 503 {serve_answers_not_200_or_503}, "
        "observed {faults_observed}".format(**out)
    )
    return out


_TIMING_KEYS = (
    "promotion_s",
    "first_push_after_kill_s",
    "leaders_moved_after_s",
    "broker_back_after_s",
    "in_sync_again_after_s",
    "partition_s",
    "loss_s",
    "tcp_retransmits_during",
    "trainer_training_again_s",
    "serve_200_again_s",
)


def _timings(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fault, in order: what it was and how long each part of it and its recovery took."""
    return [{"fault": f["fault"], **{k: f[k] for k in _TIMING_KEYS if k in f}} for f in faults]


def _brief(record: dict[str, Any]) -> str:
    parts = [f"{k}={record[k]}" for k in _TIMING_KEYS if k in record]
    if "acked_updates_lost" in record:
        parts.append(f"acked_updates_lost={record['acked_updates_lost']}")
    parts.append(f"serve during {record['serve_answers_during']}")
    return ", ".join(parts)
