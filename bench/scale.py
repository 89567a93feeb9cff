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
* ``*_2_compose``: N=2 again with ``store.sparse_updates: compose`` (gradients
  applied to the stored row inside Redis, so concurrent updates add up);
* ``push_rows_per_s`` / ``compose_rows_per_s``: one shard, 50k dim-16 rows,
  a plain push against the in-store Adagrad script (median of 3 each);
* ``bare_allreduce_ms_*``: the group step's all-reduce alone (2 processes,
  gloo, median of 30) for dlrm-small's dense size and 10x it: the network
  term of ``docs/scaling.md``, without the waiting that a training step adds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from kafka import KafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry

from kelp.bench.runner import progress
from kelp.bench.synth import synth_messages
from kelp.bench.train import BATCH, PER_MESSAGE, SEED, stream_config
from kelp.config import StoreConfig, TableSpec
from kelp.consumers.produce import produce
from kelp.harness import RedisServer, make_broker
from kelp.store import build_store
from kelp.trainer.evaluation import exact_auc

__all__ = ["lost_update_fraction", "run"]

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
    lost, updates = lost_update_fraction(traces, tables) if ranks > 1 else (0.0, 0)
    return {
        "samples": int(labels.size),
        "samples_per_s": timed / span if span > 0 else float("nan"),
        "auc": exact_auc(labels, logits),
        "dense_max_abs_diff": diff,
        "digests_equal": len({s["dense_sha256"] for s in summaries}) == 1,
        "allreduce_seconds_per_step": (summaries[0]["allreduce_seconds"] / steps) if steps else 0.0,
        "group_steps": int(steps),
        "lost_update_fraction": lost,
        "row_updates": updates,
        "per_rank_samples": [s["samples"] for s in summaries],
        "row_ops_per_sample": sum(s["backend_row_ops"] for s in summaries) / max(1, int(labels.size)),
        "owned_rows_read_per_sample": sum(s["owned_rows_read"] for s in summaries) / max(1, int(labels.size)),
        "owned_rows_updated_per_sample": sum(s["owned_rows_updated"] for s in summaries)
        / max(1, int(labels.size)),
    }


def run(quick: bool, broker: str | None = None) -> dict[str, Any]:
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
