"""``kelp bench scale``: the same criteo-synth records trained by 1 and by 2 ranks of one trainer group.

Starts a broker (Apache Kafka by default, ``--broker tansu`` for Tansu) and
redis-server, produces criteo-synth once (2 partitions), then
trains it twice, each run in its own consumer group and its own Redis key space
(so both start from an empty store):

* **N=1**: one ``kelp train`` process (:mod:`kelp.bench.scale_rank`);
* **N=2**: the same under ``torch.distributed.run --standalone
  --nproc-per-node 2`` (gloo on CPU): two ranks, one dense model.

Each run ends once the group committed every record (then SIGTERM: the ranks
drain). Reported:

* the store as ``hot_cache.enabled: auto`` makes it: the hot tier on for
  ``overwrite`` (in a group each rank keeps the rows it owns), off for ``compose``;
* ``redis_row_ops_per_sample_N``: rows read, counted and written by the
  store's backend (``kelp_store_backend_row_ops_total``, every rank) per
  trained sample, the drain's write-back included;
* ``owned_rows_updated_per_sample_2`` / ``owned_rows_read_per_sample_2``:
  rows the ranks stepped as their owners, and of those the rows only another
  rank trained, which the owner read from the store first (per sample);
* ``samples_per_s_N``: samples trained after each rank's first (warm-up)
  batch, over the wall time from the first rank's first step to the last
  rank's last step. On 2 cores, 2 ranks share the cores that 1 rank used:
  this run proves correctness, not speed-up (``docs/scaling.md`` models that);
* ``dense_max_abs_diff``: max |a - b| over every dense parameter of rank 0
  and rank 1 after the drain (synchronous all-reduce: must be 0.0);
* ``records_produced`` / ``records_committed`` (N=2's group): Kafka records,
  each a columnar message of 256 samples (``samples_produced``, ``samples_trained_N``);
* ``lost_update_fraction``: of all row updates pushed at N=2 (to the store
  the trainer sees: the hot tier where it is on), the fraction
  that a concurrent writer overwrote: rank a wrote row x at P_a, and rank b's
  next write of x came later (P_b > P_a) from a read made before P_a
  (R_b < P_a), so b's row does not contain a's update (last-writer-wins on
  whole rows). Read and write times are the end of the pull and push calls
  (one host clock for both ranks), so a race inside one round trip can be missed;
* ``auc_1``, ``auc_2``: progressive AUC over every trained sample (each
  sample scored before the update that used it), all ranks together;
* ``allreduce_seconds_per_step``: mean seconds in the dense all-reduce per group step at N=2;
* ``--hosts 0,1,10`` (``run(hosts=...)``): instead of the above, the two ranks on two hosts of
  a network-namespace rig with that one-way delay between hosts (below);
* ``*_2_compose``: N=2 again with ``store.sparse_updates: compose`` (gradients
  applied to the stored row inside Redis, so concurrent updates add up);
* ``push_rows_per_s`` / ``compose_rows_per_s``: one shard, 50k dim-16 rows,
  a plain push against the in-store Adagrad script (median of 3 each);
* ``bare_allreduce_ms_*``: the group step's all-reduce alone (2 processes,
  gloo, median of 30) for dlrm-small's dense size and 10x it: the network
  term of ``docs/scaling.md``, without the waiting that a training step adds.

**Trainers on separate hosts** (``run(hosts="0,1,10")``; ``python -m
kelp.bench.scale --hosts 0,1,10``): the N=2 group with its ranks on two hosts
of a :class:`~kelp.harness.hosts.HostRig` (one ``torch.distributed.run``
agent per host, static rendezvous at rank 0, gloo), Kafka (one KRaft node)
and redis-server on a third. First over the rig's own link (``veth``: a
loopback-like baseline), then, per one-way delay ``d`` listed, over a
:class:`~kelp.harness.delay_line.DelayLine` between the rank hosts (a user
space wire: the kernels here have no ``sch_netem``), so the all-reduce, the
row exchange and the rendezvous see ``d`` each way; Kafka and Redis keep the
rig's link. Reported under ``hosts_<label>``:

* ``rtt_ms``: the round trip between the rank hosts as measured (a TCP
  connect refused by the other host: one round trip), ``2 d`` configured;
* ``step_ms``: wall time per step (each rank's first to last step over its
  steps, the warm-up step excluded), mean over the ranks;
* ``allreduce_ms_per_step``: time in the dense all-reduce per group step;
* ``row_exchange_ms_per_step``: time in the row owners' work per group step
  (``kelp_trainer_row_exchange_seconds``: the four all-to-alls, the owners'
  steps);
* ``bare_allreduce_ms``: dlrm-small's dense all-reduce alone (median of 10);
* ``samples_per_s``, ``records_committed``, ``dense_max_abs_diff`` (0.0).

``python -m kelp.bench.scale --cut S [--nnodes 1:2]`` (:func:`run_cut`):
``kelp train --nnodes 1:2`` (elastic; ``--nnodes 2`` fixed-size) on the two
rank hosts with ``--max-restarts 3``, rank 1's host cut off for ``S``
seconds mid-run: when each rank stopped, when the group committed again (an
elastic group: rank 0 alone, before the heal), whether every record was
committed and no committed offset went backwards. Both need root (network
namespaces); where the rig cannot be made they say why instead of measuring
something else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis
import torch
import yaml
from kafka import KafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry

from kelp.bench.runner import progress
from kelp.bench.synth import synth_messages
from kelp.bench.train import BATCH, PER_MESSAGE, SEED, stream_config
from kelp.config import StoreConfig, TableSpec
from kelp.consumers.produce import produce
from kelp.errors import UserError
from kelp.harness import RedisServer, make_broker
from kelp.harness.binaries import find_binary
from kelp.harness.delay_line import DelayLine
from kelp.store import build_store
from kelp.trainer.evaluation import exact_auc

__all__ = [
    "OffsetWatch",
    "WorkerWatch",
    "kelp_train_on_hosts",
    "lost_update_fraction",
    "main",
    "parse_delays",
    "run",
    "run_cut",
    "run_hosts",
]

PARTITIONS = 2


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return sum(consumer.committed(TopicPartition(topic, p)) or 0 for p in range(PARTITIONS))
    finally:
        consumer.close()


def _train(ranks: int, config: Path, out: Path, *, kafka: tuple[str, str, str], records: int) -> float:
    """Run ``ranks`` ranks until the group committed every record; seconds it took.

    ``kafka``: (bootstrap, group, topic) whose committed offsets say when to stop.
    """
    bootstrap, group, topic = kafka
    worker = ["-m", "kelp.bench.scale_rank", "--config", str(config), "--out", str(out)]
    if ranks > 1:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        worker = [*launcher, "--monitor-interval=0.5", *worker]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    log = (out.parent / f"n{ranks}.log").open("wb")
    proc = subprocess.Popen([sys.executable, *worker], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while _committed(bootstrap, group, topic) < records:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(log.name).read_text()[-2000:]
                raise RuntimeError(
                    f"N={ranks} exited or stalled before committing {records} records:\n{tail}"
                )
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    return time.monotonic() - started


def lost_update_fraction(traces: list[dict[str, np.ndarray]], tables: list[str]) -> tuple[float, int]:
    """Fraction of row updates overwritten by another rank's write based on an older read; and the total.

    Per row, events sorted by write time; an update is lost when the next
    write of that row by a *different* rank started from a read made before
    this write (see the module docstring).
    """
    lost = total = 0
    for table in tables:
        parts = [
            (t[f"{table}.ids"], t[f"{table}.read"], t[f"{table}.written"], r) for r, t in enumerate(traces)
        ]
        parts = [p for p in parts if len(p[0])]
        if not parts:
            continue
        ids = np.concatenate([p[0] for p in parts])
        read = np.concatenate([p[1] for p in parts])
        written = np.concatenate([p[2] for p in parts])
        rank = np.concatenate([np.full(len(p[0]), p[3]) for p in parts])
        order = np.lexsort((written, ids))
        ids, read, written, rank = ids[order], read[order], written[order], rank[order]
        total += len(ids)
        # For each event, the next event of the same row whose rank differs: the start of the next run.
        n = len(ids)
        boundary = np.ones(n, dtype=bool)
        boundary[1:] = (ids[1:] != ids[:-1]) | (rank[1:] != rank[:-1])
        run_start = np.flatnonzero(boundary)
        next_run = np.empty(n, dtype=np.int64)
        run_of = np.cumsum(boundary) - 1
        next_starts = np.append(run_start[1:], n)
        next_run[:] = next_starts[run_of]
        has_next = next_run < n
        j = np.where(has_next, next_run, 0)
        same_row = has_next & (ids[j] == ids)
        lost += int(np.count_nonzero(same_row & (read[j] < written)))
    return (lost / total if total else 0.0), total


def _collect(out: Path, ranks: int, tables: list[str]) -> dict[str, Any]:
    summaries = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]
    traces = [dict(np.load(out / f"rank-{r}.npz")) for r in range(ranks)]
    labels = np.concatenate([t["labels"] for t in traces])
    logits = np.concatenate([t["logits"] for t in traces])
    timed = sum(s["samples"] - s["first_batch_samples"] for s in summaries)
    span = max(s["last_step_at"] for s in summaries) - min(s["first_step_at"] for s in summaries)
    states = [torch.load(out / f"rank-{r}.pt") for r in range(ranks)]
    diff = max(
        (
            float((states[0][k] - s[k]).abs().max())
            for s in states[1:]
            for k in states[0]
            if states[0][k].numel()
        ),
        default=0.0,
    )
    steps = max(s["allreduce_count"] for s in summaries)
    exchanges = max(s.get("row_exchange_count", 0.0) for s in summaries)
    # Wall time per step from each rank's first to its last step (the first, warm-up step excluded).
    per_rank_step = [
        (s["last_step_at"] - s["first_step_at"]) / (s["steps"] - 1) for s in summaries if s["steps"] > 1
    ]
    lost, updates = lost_update_fraction(traces, tables) if ranks > 1 else (0.0, 0)
    return {
        "samples": int(labels.size),
        "samples_per_s": timed / span if span > 0 else float("nan"),
        "auc": exact_auc(labels, logits),
        "dense_max_abs_diff": diff,
        "digests_equal": len({s["dense_sha256"] for s in summaries}) == 1,
        "allreduce_seconds_per_step": (summaries[0]["allreduce_seconds"] / steps) if steps else 0.0,
        "row_exchange_seconds_per_step": (
            (summaries[0].get("row_exchange_seconds", 0.0) / exchanges) if exchanges else 0.0
        ),
        "step_seconds": (sum(per_rank_step) / len(per_rank_step)) if per_rank_step else float("nan"),
        "group_steps": int(steps),
        "lost_update_fraction": lost,
        "row_updates": updates,
        "per_rank_samples": [s["samples"] for s in summaries],
        "row_ops_per_sample": sum(s["backend_row_ops"] for s in summaries) / max(1, int(labels.size)),
        "owned_rows_read_per_sample": sum(s["owned_rows_read"] for s in summaries) / max(1, int(labels.size)),
        "owned_rows_updated_per_sample": sum(s["owned_rows_updated"] for s in summaries)
        / max(1, int(labels.size)),
    }


def run(quick: bool, broker: str | None = None, hosts: str | None = None) -> dict[str, Any]:
    """The suite; with ``hosts`` (one-way delays in ms, ``"0,1,10"``) the ranks run on separate rig
    hosts instead (see the module docstring)."""
    if hosts is not None:
        return run_hosts(quick, hosts)
    samples = (12 if quick else 96) * BATCH  # quick: under 60 s on 2 cores with three trainings
    out: dict[str, Any] = {"workload": "criteo-synth (synthetic)", "model": "dlrm-small", "batch_size": BATCH}
    service = make_broker(broker)
    out["broker"] = service.label
    progress(f"starting {service.label} and redis-server")
    with service, RedisServer() as redis_srv, tempfile.TemporaryDirectory() as tmp:
        topic = f"scale-{uuid.uuid4().hex[:6]}"
        service.create_topic(topic, PARTITIONS)
        progress(f"producing {samples:,} criteo-synth samples to {topic} ({PARTITIONS} partitions)")
        summary = produce(
            {"bootstrap_servers": [service.bootstrap]},
            topic,
            synth_messages(samples, PER_MESSAGE, seed=SEED),
            quiet=True,
        )
        out["records_produced"] = summary.messages  # Kafka records (columnar messages of 256 samples)
        out["samples_produced"] = summary.records
        for ranks, updates in ((1, "overwrite"), (2, "overwrite"), (2, "compose")):
            label = f"{ranks}" if updates == "overwrite" else f"{ranks}_compose"
            work = Path(tmp) / f"n{label}"
            cfg = stream_config(
                service.bootstrap,
                topic,
                redis_srv.url,
                work,
                hot_cache="auto",
                fetch_sessions=service.fetch_sessions_work,
            )
            cfg.source = cfg.source.model_copy(update={"group_id": f"scale-n{label}-{topic}"})
            cfg.store.sparse_updates = updates
            cfg.trainer.torch_threads = 1 if ranks > 1 else None
            work.mkdir(parents=True)
            config = work / "kelp.yaml"
            config.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
            progress(f"N={label}: training {summary.records:,} samples")
            kafka = (service.bootstrap, cfg.source.group_id, topic)
            seconds = _train(ranks, config, work / "out", kafka=kafka, records=summary.messages)
            got = _collect(work / "out", ranks, [t.name for t in cfg.features.tables])
            speed, auc = got["samples_per_s"], got["auc"]
            progress(f"N={label}: {speed:,.0f} samples/s, AUC {auc:.4f} ({seconds:.0f}s)")
            out[f"samples_per_s_{label}"] = round(speed, 1)
            out[f"auc_{label}"] = round(auc, 4)
            out[f"samples_trained_{label}"] = got["samples"]
            out[f"redis_row_ops_per_sample_{label}"] = round(got["row_ops_per_sample"], 3)
            if updates == "compose":
                out["dense_max_abs_diff_compose"] = got["dense_max_abs_diff"]
                # The same races happen; with compose the stored row absorbs both updates instead.
                out["concurrent_update_fraction_compose"] = round(got["lost_update_fraction"], 5)
            elif ranks > 1:
                out["ranks"] = ranks
                out["records_committed"] = _committed(service.bootstrap, cfg.source.group_id, topic)
                out["dense_max_abs_diff"] = got["dense_max_abs_diff"]
                out["dense_digests_equal"] = got["digests_equal"]
                out["lost_update_fraction"] = round(got["lost_update_fraction"], 5)
                out["row_updates_2"] = got["row_updates"]
                out["allreduce_seconds_per_step"] = round(got["allreduce_seconds_per_step"], 6)
                out["group_steps_2"] = got["group_steps"]
                out["per_rank_samples_2"] = got["per_rank_samples"]
                out["owned_rows_read_per_sample_2"] = round(got["owned_rows_read_per_sample"], 3)
                out["owned_rows_updated_per_sample_2"] = round(got["owned_rows_updated_per_sample"], 3)
        out.update(_push_vs_compose(redis_srv.url))
        out.update(_bare_allreduce(Path(tmp) / "allreduce.json"))
    out["ratio_2_vs_1"] = round(out["samples_per_s_2"] / out["samples_per_s_1"], 3)
    out["auc_delta_2_minus_1"] = round(out["auc_2"] - out["auc_1"], 4)
    out["auc_delta_2_compose_minus_1"] = round(out["auc_2_compose"] - out["auc_1"], 4)
    return out


def _bare_allreduce(out: Path) -> dict[str, Any]:
    """Median ms of the bare gloo all-reduce of dlrm-small's dense size and 10x it, two processes."""
    floats = (129_297, 1_292_970)  # dlrm-small's dense parameters; a model 10x larger
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["-m", "kelp.bench.allreduce_probe", "--out", str(out)]
    for n in floats:
        command += ["--floats", str(n)]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    medians = json.loads(out.read_text())
    small, large = (medians[str(n)] * 1e3 for n in floats)
    progress(f"bare all-reduce: {small:.2f} ms (dlrm-small), {large:.2f} ms (10x)")
    return {
        "bare_allreduce_ms_dlrm_small": round(medians[str(floats[0])] * 1e3, 3),
        "bare_allreduce_ms_10x": round(medians[str(floats[1])] * 1e3, 3),
    }


def _push_vs_compose(redis_url: str, rows: int = 50_000, dim: int = 16, repeats: int = 3) -> dict[str, Any]:
    """Rows/s of a plain push (MSET of whole rows) vs the in-store Adagrad script, same rows, same server."""
    spec = TableSpec(name="t", dim=dim)
    ids = np.arange(1, rows + 1, dtype=np.uint64)
    gen = np.random.default_rng(SEED)
    values, grads = (
        gen.normal(size=(rows, dim)).astype(np.float32),
        gen.normal(size=(rows, dim)).astype(np.float32),
    )
    state = np.zeros(rows, np.float32)
    cfg = StoreConfig(backend="redis", urls=[redis_url], sparse_updates="compose")
    median: dict[str, float] = {}
    with build_store(cfg, [spec], f"bench-compose-{uuid.uuid4().hex[:6]}", CollectorRegistry()) as store:
        store.push("t", ids, values, state)
        for name, call in (
            ("push", lambda: store.push("t", ids, values, state)),
            ("compose", lambda: store.apply_adagrad_many({"t": (ids, values, state, grads)}, 0.05, 1e-8)),
        ):
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                call()
                times.append(time.perf_counter() - started)
            median[name] = rows / sorted(times)[len(times) // 2]
    progress(f"push {median['push']:,.0f} rows/s, in-store Adagrad {median['compose']:,.0f} rows/s")
    return {
        "push_rows_per_s": round(median["push"], 1),
        "compose_rows_per_s": round(median["compose"], 1),
        "compose_vs_push_ratio": round(median["compose"] / median["push"], 3),
    }


# -- trainers on separate hosts ---------------------------------------------------------------------

_MASTER_PORT = 29500
_DLRM_SMALL_DENSE = 129_297  # dlrm-small's dense parameters, as kelp.bench.scale's bare all-reduce


def parse_delays(text: str) -> list[float]:
    """``"0,1,10"`` -> ``[0.0, 1.0, 10.0]``: one-way delays in ms between hosts, each a run."""
    try:
        delays = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(
            f"--hosts: expected one-way delays in ms, comma-separated (0,1,10), got {text!r}"
        ) from None
    if not delays or any(d < 0 or d > 1000 for d in delays):
        raise UserError(f"--hosts: each delay must be between 0 and 1000 ms, got {text!r}")
    return delays


def run_hosts(quick: bool, hosts: str) -> dict[str, Any]:
    """Train the same criteo-synth records with 2 ranks on 2 rig hosts once per delay in ``hosts``."""
    delays = parse_delays(hosts)
    samples = (24 if quick else 96) * BATCH
    out: dict[str, Any] = {
        "workload": "criteo-synth (synthetic)",
        "model": "dlrm-small",
        "batch_size": BATCH,
        "ranks": 2,
        "mode": "hosts",
        "delays_ms_one_way": delays,
    }
    with _Setup(samples) as setup:
        rig, ranks, kafka, topic, summary = setup.rig, setup.ranks, setup.kafka, setup.topic, setup.summary
        out["broker"] = kafka.label
        out["records_produced"] = summary.messages
        out["samples_produced"] = summary.records
        with DelayLine(*ranks, _wire_subnet(rig.address), rig.prefix) as wire:
            # The rig's own link first (no wire: the loopback-like baseline), then the wire per delay.
            runs: list[tuple[str, float | None]] = [("veth", None), *((f"{d:g}ms", d) for d in delays)]
            for index, (label, delay) in enumerate(runs):
                if delay is None:
                    link = _Link(ranks[0].address, [h.peer for h in ranks], ranks[1].address)
                else:
                    wire.delay_ms = delay
                    link = _Link(wire.addresses[0], [wire.ifname] * 2, wire.addresses[1])
                work = Path(setup.tmp) / f"run{index}"
                config, cfg = setup.config(work, f"scale-hosts-{index}", 300.0)
                rtt = _rtt_ms(ranks[0], link.peer)
                progress(f"{label} (round trip {rtt:.2f} ms): training {summary.records:,} samples")
                kafka_at = (kafka.bootstrap, cfg.source.group_id, topic)
                port = _MASTER_PORT + 2 * index
                seconds = _train_on_hosts(
                    ranks, link, config, work / "out", port=port, kafka=kafka_at, records=summary.messages
                )
                got = _collect(work / "out", 2, [t.name for t in cfg.features.tables])
                bare = _bare_allreduce_on_hosts(ranks, link, work / "allreduce.json", port + 1)
                figures = {
                    "rtt_ms": round(rtt, 3),
                    "step_ms": round(got["step_seconds"] * 1e3, 2),
                    "allreduce_ms_per_step": round(got["allreduce_seconds_per_step"] * 1e3, 2),
                    "row_exchange_ms_per_step": round(got["row_exchange_seconds_per_step"] * 1e3, 2),
                    "bare_allreduce_ms": round(bare * 1e3, 3),
                    "samples_per_s": round(got["samples_per_s"], 1),
                    "group_steps": got["group_steps"],
                    "records_committed": _committed(kafka.bootstrap, cfg.source.group_id, topic),
                    "dense_max_abs_diff": got["dense_max_abs_diff"],
                    "wall_s": round(seconds, 1),
                }
                progress(
                    f"{label}: step {figures['step_ms']} ms, all-reduce {figures['allreduce_ms_per_step']} "
                    f"ms, row exchange {figures['row_exchange_ms_per_step']} ms, bare all-reduce "
                    f"{figures['bare_allreduce_ms']} ms"
                )
                out[f"hosts_{label}"] = figures
    return out


class _Setup:
    """A rig with a services host (Kafka, one KRaft node; redis-server) and two rank hosts, and
    ``samples`` criteo-synth samples produced to a topic of its own (none with 0: :meth:`produce`
    then); all removed on exit."""

    def __init__(self, samples: int) -> None:
        from kelp.harness.hosts import HostRig, available

        ok, why = available()
        if not ok:
            raise UserError(f"kelp bench scale --hosts needs a host rig (network namespaces): {why}")
        self.samples = samples
        self.rig = HostRig()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Setup:
        from kelp.harness.kafka_cluster import KafkaCluster

        stack = self._stack
        try:
            stack.enter_context(self.rig)
            self.tmp = stack.enter_context(tempfile.TemporaryDirectory())
            services = self.rig.add_host("services")
            self.ranks = [self.rig.add_host("rank0"), self.rig.add_host("rank1")]
            progress("starting Apache Kafka and redis-server on the services host")
            self.kafka = stack.enter_context(KafkaCluster(self.rig, [services]))
            self.redis_url = stack.enter_context(_redis_on(services, Path(self.tmp)))
            self.topic = f"scale-hosts-{uuid.uuid4().hex[:6]}"
            self.kafka.create_topic(self.topic, PARTITIONS)
            if self.samples:
                progress(f"producing {self.samples:,} criteo-synth samples to {self.topic}")
                self.summary = self.produce(synth_messages(self.samples, PER_MESSAGE, seed=SEED))
        except BaseException:
            stack.close()
            raise
        return self

    def config(self, work: Path, group: str, timeout_s: float) -> tuple[Path, Any]:
        """The scale suite's trainer config for this setup, written under ``work``; (path, config)."""
        work.mkdir(parents=True, exist_ok=True)
        cfg = stream_config(self.kafka.bootstrap, self.topic, self.redis_url, work, hot_cache="auto")
        cfg.source = cfg.source.model_copy(update={"group_id": f"{group}-{self.topic}"})
        cfg.trainer.torch_threads = 1
        cfg.trainer.distributed.timeout_s = timeout_s
        path = work / "kelp.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
        return path, cfg

    def produce(self, messages: Iterable[tuple[bytes, int]]) -> Any:
        """``messages`` (each with its sample count) to the setup's topic; the producer's summary."""
        return produce({"bootstrap_servers": self.kafka.bootstrap_servers}, self.topic, messages, quiet=True)

    def committed(self, cfg: Any) -> int:
        return _committed(self.kafka.bootstrap, cfg.source.group_id, self.topic)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def run_cut(quick: bool, cut_s: float, timeout_s: float = 20.0, nnodes: str = "1:2") -> dict[str, Any]:
    """``kelp train --nnodes NNODES`` on 2 rank hosts; rank 1's host cut off for ``cut_s``.

    Reports when each rank's worker stopped after the cut (the bound for the
    rank that can still talk is ``trainer.distributed.timeout_s``, here
    ``timeout_s``); when the group committed again after rank 0 stopped, and
    whether that was before the heal (only an elastic ``nnodes``, ``1:2``, lets
    rank 0 go on alone; ``last_call_timeout=5``); when every record was
    committed after the heal; and whether committed offsets ever went backwards.
    """
    samples = (100 if quick else 200) * BATCH
    out: dict[str, Any] = {"mode": "cut", "cut_s": cut_s, "distributed_timeout_s": timeout_s}
    out["nnodes"] = nnodes
    with _Setup(samples) as setup:
        ranks, records = setup.ranks, setup.summary.messages
        config, cfg = setup.config(Path(setup.tmp) / "cut", "scale-cut", timeout_s)
        # The survivor waits last_call_timeout for more machines once enough are there (torch: 30 s).
        procs = kelp_train_on_hosts(
            ranks, config, nnodes=nnodes, port=_MASTER_PORT, tag="cut", rdzv_conf="last_call_timeout=5"
        )
        offsets = OffsetWatch(setup.kafka.bootstrap, cfg.source.group_id, setup.topic)
        try:
            _wait(lambda: offsets.total() >= records // 10, 300, procs)
            stops = WorkerWatch(procs)
            setup.rig.partition(ranks[1])
            progress(f"rank 1's host cut off for {cut_s:g} s")
            while stops.elapsed() < cut_s:
                stops.note()
                time.sleep(0.2)
            setup.rig.heal(ranks[1])
            healed = time.monotonic()
            _wait(lambda: stops.note() or offsets.total() >= records, 600, procs)
            out["finished_after_heal_s"] = round(time.monotonic() - healed, 1)
            stopped = stops.stopped.get(0)
            again = offsets.first_increase_after(stops.started + stopped) if stopped is not None else None
            logs = [(config.parent / f"cut-{h.name}.log").read_text(errors="replace") for h in ranks]
            _stop(procs)
        finally:
            setup.rig.heal(ranks[1])
            offsets.close()
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        out.update(
            records=records,
            records_committed=setup.committed(cfg),
            # Rank 0's bound is the collective timeout; the cut-off rank learns only once the link is back.
            rank_stopped_after_cut_s={str(i): round(t, 1) for i, t in sorted(stops.stopped.items())},
            # After rank 0 stopped, the group committed again this long after the cut: before the heal
            # only an elastic group can (rank 0 alone).
            committed_again_after_cut_s=None if again is None else round(again - stops.started, 1),
            committed_again_before_heal=again is not None and again < healed,
            group_joins=logs[0].count("joined the trainer group"),
            offset_regressions=len(offsets.regressions),
        )
    progress(f"cut: {out}")
    return out


class OffsetWatch:
    """The group's committed offsets per partition, polled on a thread: when the total rose, and
    every time a partition's committed offset went backwards (which must never happen)."""

    def __init__(self, bootstrap: str, group: str, topic: str, interval_s: float = 0.5) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        self._parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.latest = [0] * PARTITIONS
        self.history: list[tuple[float, int]] = []
        """(monotonic time, total committed) at each poll."""
        self.regressions: list[tuple[int, int, int]] = []
        """(partition, before, after) for each committed offset seen to go backwards."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.poll()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), name="offsets", daemon=True)
        self._thread.start()

    def poll(self) -> None:
        now = [self._consumer.committed(tp) or 0 for tp in self._parts]
        with self._lock:
            for p, (before, after) in enumerate(zip(self.latest, now, strict=True)):
                if after < before:
                    self.regressions.append((p, before, after))
            self.latest = now
            self.history.append((time.monotonic(), sum(now)))

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            with contextlib.suppress(Exception):  # a slow broker answer is only a missed poll
                self.poll()

    def total(self) -> int:
        with self._lock:
            return sum(self.latest)

    def first_increase_after(self, since: float) -> float | None:
        """When the total first rose above what it was at ``since`` (monotonic), or None."""
        with self._lock:
            base = max((total for t, total in self.history if t <= since), default=0)
            return next((t for t, total in self.history if t > since and total > base), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


class WorkerWatch:
    """When each agent's worker processes, as they are now, ended (torchrun starts new ones to
    restart), in seconds from the watch's start."""

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.procs = procs
        self.workers = [set(_children(p.pid)) for p in procs]
        self.started = time.monotonic()
        self.stopped: dict[int, float] = {}

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def note(self) -> None:
        for i, proc in enumerate(self.procs):
            if i not in self.stopped and not self.workers[i] & set(_children(proc.pid)):
                self.stopped[i] = self.elapsed()


def kelp_train_on_hosts(
    ranks: list[Any],
    config: Path,
    *,
    nnodes: str,
    port: int,
    tag: str,
    rdzv_conf: str = "",
    max_restarts: int = 3,
    nodes: list[int] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """``kelp train --nnodes NNODES`` on each rank host, meeting at a c10d rendezvous that the agent on
    the first host serves; output in ``<tag>-<host>.log`` beside ``config``.

    ``--local-addr`` is each host's rig address: the host name names the machine, which the other
    namespaces cannot reach. ``is_host`` says who serves the rendezvous (the addresses of a
    namespace are not the machine's, so torch cannot tell by itself). ``nodes``: start only these
    hosts (by index; a host that comes back joins the running group).
    """
    procs = []
    endpoint = f"{ranks[0].address}:{port}"
    for node, host in enumerate(ranks):
        if nodes is not None and node not in nodes:
            continue
        conf = ",".join(part for part in (f"is_host={int(node == 0)}", rdzv_conf) if part)
        argv = [sys.executable, "-m", "kelp.cli", "train", "--config", str(config), f"--nnodes={nnodes}"]
        argv += [f"--rdzv-endpoint={endpoint}", f"--local-addr={host.address}", f"--rdzv-conf={conf}"]
        argv += [f"--max-restarts={max_restarts}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": host.peer}
        with (config.parent / f"{tag}-{host.name}.log").open("wb") as log:
            procs.append(host.popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def _children(pid: int) -> list[int]:
    done = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in done.stdout.split()]


def _wait(predicate: Any, timeout_s: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("the group stopped or stalled")
        time.sleep(0.5)


@dataclass(frozen=True)
class _Link:
    """How the ranks reach each other: rank 0's address (the rendezvous), each host's interface
    for gloo, and rank 1's address (to time the round trip)."""

    master: str
    ifnames: list[str]
    peer: str


def _wire_subnet(rig_address: str) -> str:
    """A /24 for the wire that is not the rig's: the same third octet in the other half of 198.18.0.0/15."""
    first, second, third, _ = rig_address.split(".")
    return f"{first}.{19 if second == '18' else 18}.{third}"


@contextmanager
def _redis_on(host: Any, workdir: Path) -> Iterator[str]:
    """redis-server on ``host`` (no persistence: each run has a key space of its own); its URL."""
    folder = workdir / "redis"
    folder.mkdir()
    argv = [find_binary("redis-server"), "--bind", host.address, "--port", "6379", "--protected-mode", "no"]
    argv += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", str(folder)]
    proc = host.process(argv, name="redis", log_path=folder / "redis.log")
    try:
        client = redis.Redis(host=host.address, port=6379, socket_timeout=0.5)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline or not proc.alive():
                    raise RuntimeError(f"redis-server on {host} did not answer:\n{proc.log_tail()}") from None
                time.sleep(0.05)
        client.close()
        yield f"redis://{host.address}:6379"
    finally:
        proc.stop()


def _rtt_ms(source: Any, address: str, probes: int = 5) -> float:
    """Median round trip from ``source``'s namespace to ``address``: a TCP connect to a closed port
    is answered by a reset, one round trip later."""
    code = (
        "import socket,statistics,sys,time\n"
        "t=[]\n"
        f"for _ in range({probes}):\n"
        "    s=socket.socket(); s.settimeout(5); a=time.perf_counter()\n"
        f"    try: s.connect(({address!r}, 9))\n"
        "    except ConnectionRefusedError: pass\n"
        "    t.append(time.perf_counter()-a); s.close()\n"
        "print(statistics.median(t)*1e3)\n"
    )
    done = source.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    stdout, _ = done.communicate(timeout=60)
    if done.returncode != 0:  # no reset came back: the address is not reachable from ``source``
        raise RuntimeError(f"{address} did not answer from {source}")
    return float(stdout.strip())


def _agents(
    ranks: list[Any], link: _Link, module: list[str], port: int, *, log_dir: Path, tag: str
) -> list[subprocess.Popen[bytes]]:
    """One ``torch.distributed.run`` agent per host (static rendezvous at rank 0), running ``module``."""
    procs = []
    for node, host in enumerate(ranks):
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
        launcher += [f"--node-rank={node}", f"--master-addr={link.master}", f"--master-port={port}"]
        launcher += ["--monitor-interval=0.5", *module]
        # gloo names its peers by the address of this interface: the link chosen, not loopback.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": link.ifnames[node]}
        log = (log_dir / f"{tag}-{host.name}.log").open("wb")
        procs.append(host.popen(launcher, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def _stop(procs: list[subprocess.Popen[bytes]], timeout_s: float = 120) -> None:
    """SIGTERM every agent (they forward it: the ranks drain), then wait; kill what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _train_on_hosts(
    ranks: list[Any],
    link: _Link,
    config: Path,
    out: Path,
    *,
    port: int,
    kafka: tuple[str, str, str],
    records: int,
) -> float:
    """Both ranks until the group committed every record, then SIGTERM; seconds it took."""
    bootstrap, group, topic = kafka
    out.mkdir(parents=True, exist_ok=True)
    module = ["-m", "kelp.bench.scale_rank", "--config", str(config), "--out", str(out)]
    started = time.monotonic()
    procs = _agents(ranks, link, module, port, log_dir=out.parent, tag="train")
    try:
        deadline = time.monotonic() + 900
        while _committed(bootstrap, group, topic) < records:
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                tails = "\n".join((out.parent / f"train-{h.name}.log").read_text()[-1500:] for h in ranks)
                raise RuntimeError(
                    f"the group exited or stalled before committing {records} records:\n{tails}"
                )
            time.sleep(0.5)
        _stop(procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return time.monotonic() - started


def _bare_allreduce_on_hosts(ranks: list[Any], link: _Link, out: Path, port: int) -> float:
    """Median seconds of dlrm-small's dense all-reduce alone, one process per host."""
    module = ["-m", "kelp.bench.allreduce_probe", "--out", str(out), "--floats", str(_DLRM_SMALL_DENSE)]
    procs = _agents(ranks, link, [*module, "--repeats", "10"], port, log_dir=out.parent, tag="allreduce")
    try:
        for proc in procs:
            proc.wait(timeout=300)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return float(json.loads(out.read_text())[str(_DLRM_SMALL_DENSE)])


def main(argv: list[str] | None = None) -> int:
    """``python -m kelp.bench.scale --hosts 0,1,10 [--quick]`` (or ``--cut S``): the JSON on stdout."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", default="0,1,10", help="one-way delays in ms between the rank hosts")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--cut", type=float, default=None, metavar="S", help="instead: cut rank 1's host off for S seconds"
    )
    parser.add_argument(
        "--nnodes", default="1:2", help="with --cut: kelp train's --nnodes (1:2 elastic, 2 fixed)"
    )
    args = parser.parse_args(argv)
    if args.cut is not None:
        result = run_cut(args.quick, args.cut, nnodes=args.nnodes)
    else:
        result = run_hosts(args.quick, args.hosts)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
