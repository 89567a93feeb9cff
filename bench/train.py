"""``kelp bench train``: the whole trainer daemon on criteo-synth vs the in-memory baseline.

Starts its own broker (Apache Kafka by default, Tansu with ``--broker
tansu``; the JSON's ``broker`` names it) and redis-server, produces criteo-synth
(columnar messages of 256 samples), then measures in the same run:

* **stream**: :class:`~kelp.daemon.train.TrainDaemon` exactly as ``kelp train``
  runs it (Kafka source -> prefetch pulls from Redis -> dlrm-small step ->
  write-behind push -> offset commit), from its first trained batch until the
  drain has pushed, flushed and committed everything; once with the default
  config, which keeps the hot tier (the headline ``ratio``; ``hotcache_*``
  repeat it, ``hot_cache_hit_rate``), and once write-through, the tier off
  (``writethrough_ratio``);
* **baseline**: :class:`~kelp.bench.baseline.InMemoryBaseline`, the same
  model and optimizers with every embedding in one in-memory table, on the
  very batches the stream trained (kept as decoded), in the same process;
* **plain**: the plain PyTorch loop of :mod:`kelp.bench.plain`
  (``nn.EmbeddingBag`` tables, torch's sparse Adagrad, tensors prepared before
  the clock starts) on the same batches: ``plain_inmemory_samples_per_s`` and
  ``plain_ratio`` (stream / plain), the ceiling a user compares Kelp with.

The first batch of each side is a warm-up and is not timed. Stage seconds of
both sides are reported, so the gap is explained rather than asserted.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import torch
from prometheus_client import CollectorRegistry

from kelp.bench.baseline import InMemoryBaseline
from kelp.bench.cost import CostSnapshot, cost_per_sample, steady_start
from kelp.bench.ingest import bench_kafka
from kelp.bench.plain import plain_samples_per_s
from kelp.bench.runner import progress
from kelp.bench.synth import synth_messages
from kelp.config import KelpConfig, StoreConfig, load_config
from kelp.consumers.batch import MicroBatch
from kelp.consumers.produce import produce
from kelp.daemon.train import TrainDaemon
from kelp.examples import example_path
from kelp.harness import KafkaBroker, RedisServer, make_broker
from kelp.trainer import ProgressiveValidator, TrainStep, build_model, resolve_device

__all__ = ["inmemory_run", "produce_topic", "run", "run_header", "stream_config", "stream_run"]

PER_MESSAGE = 256
BATCH = 4096
SEED = 0


def stream_config(
    bootstrap: str,
    topic: str,
    redis_url: str,
    workdir: Path,
    hot_cache: bool | Literal["auto"],
    *,
    fetch_sessions: bool = True,
) -> KelpConfig:
    """``fetch_sessions``: False for Tansu, which mishandles them for the partitions a trainer pauses."""
    cfg = load_config(example_path("criteo-synth.yaml"))
    cfg.source = bench_kafka(bootstrap, topic).model_copy(
        update={"max_poll_records": 8192, "incremental_fetch_sessions": fetch_sessions}
    )
    cfg.deployment = f"bench-{uuid.uuid4().hex[:6]}"
    cfg.store = StoreConfig(backend="redis", urls=[redis_url])
    cfg.store.hot_cache.enabled = hot_cache
    cfg.batching.batch_size = BATCH
    cfg.trainer.device = "auto"
    cfg.trainer.checkpoint_dir = workdir / "checkpoints"
    cfg.trainer.checkpoint_every_steps = 10_000
    cfg.trainer.log_every_s = 5.0
    cfg.publisher.enabled = False
    cfg.metrics.enabled = False
    return cfg


def stream_run(
    cfg: KelpConfig, samples: int, step_class: type[TrainStep] | None = None
) -> tuple[dict[str, Any], list[MicroBatch]]:
    """Train ``samples`` from the config's stream with the real daemon; its rate and its cost per sample.

    ``samples_per_s`` is timed from the first trained batch until the drain has
    committed everything; the cost figures (:mod:`kelp.bench.cost`) cover the
    steady window, from a quarter into the run to the end of the drain.
    """
    registry = CollectorRegistry()
    batches: list[MicroBatch] = []
    first_done: list[float] = []
    steady_from = steady_start(samples // cfg.batching.batch_size)
    trained = [0]
    snapshots: list[CostSnapshot] = []

    def snapshot(step: int) -> None:
        snapshots.append(CostSnapshot.take(registry, cfg.store.urls, step=step, samples=trained[0]))

    def on_step(step: int, batch: MicroBatch, _result: Any) -> None:
        batches.append(batch)
        trained[0] += batch.size
        if len(batches) == 1:
            first_done.append(time.perf_counter())
        if len(batches) == steady_from:
            snapshot(len(batches))
        if trained[0] >= samples:
            daemon.request_stop("all samples trained")

    torch.manual_seed(SEED)
    daemon = TrainDaemon(cfg, registry=registry, on_step=on_step, step_class=step_class)
    report = daemon.run()
    ended = time.perf_counter()
    if snapshots:  # after the drain: the last write-back belongs to the window's steps
        snapshot(len(batches))
    timed = sum(b.size for b in batches[1:])
    elapsed = ended - first_done[0]
    hit_rate = registry.get_sample_value("kelp_store_hot_cache_hit_rate_ratio")
    out = {
        "samples_per_s": timed / elapsed,
        "steps": report.steps,
        "samples": report.samples,
        "auc": report.auc,
        "hot_cache_hit_rate": hit_rate,
        "stage_seconds": {k: round(v, 3) for k, v in report.stage_seconds.items()},
        "overlay_patched_rows": daemon.pipeline.ledger.patched_rows,  # type: ignore[union-attr]
    }
    working = daemon.pipeline.working_copy  # type: ignore[union-attr]
    if working is not None:
        out["working_copy_overlapped_rows"] = working.overlapped_rows
    if len(snapshots) == 2:
        hot = cfg.store.hot_cache
        writeback = (hot.writeback_every_steps, hot.writeback_interval_s) if working is not None else None
        out["cost"] = cost_per_sample(snapshots[0], snapshots[1], batches, writeback)
    return out, batches


def inmemory_run(cfg: KelpConfig, batches: list[MicroBatch]) -> dict[str, Any]:
    device = resolve_device(cfg.trainer.device)
    torch.manual_seed(SEED)
    baseline = InMemoryBaseline(
        build_model(cfg.features, cfg.trainer),
        cfg.features,
        cfg.trainer,
        device,
        validator=ProgressiveValidator(cfg.trainer.eval_window_batches),
        initial_capacity=1 << 17,
    )
    baseline.step(batches[0])  # warm-up, as on the stream side
    stages: dict[str, float] = {}
    started = time.perf_counter()
    for batch in batches[1:]:
        result = baseline.step(batch)
        for stage, seconds in result.timings.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    assert baseline.validator is not None
    return {
        "samples_per_s": sum(b.size for b in batches[1:]) / elapsed,
        "auc": baseline.validator.cumulative().auc,
        "stage_seconds": {k: round(v, 3) for k, v in stages.items()},
    }


def _unique_id_ratio(batches: list[MicroBatch]) -> float:
    ratios = [sum(t.unique_ids.size for t in b.tables.values()) / max(1, b.num_ids()) for b in batches]
    return sum(ratios) / max(1, len(ratios))


def run_header(model: str) -> dict[str, Any]:
    """The keys every stream suite's result starts with: workload, model, batch, device."""
    return {
        "workload": "criteo-synth (synthetic)",
        "model": model,
        "batch_size": BATCH,
        "device": str(resolve_device("auto")),
        "torch_threads": torch.get_num_threads(),
    }


def produce_topic(service: KafkaBroker, prefix: str, samples: int) -> str:
    """A new two-partition topic holding ``samples`` criteo-synth samples (columnar messages)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    service.create_topic(topic, 2)
    progress(f"producing {samples:,} criteo-synth samples to {topic}")
    summary = produce(
        {"bootstrap_servers": [service.bootstrap]},
        topic,
        synth_messages(samples, PER_MESSAGE, seed=SEED),
        quiet=True,
    )
    progress(f"produced {summary.records:,} samples in {summary.seconds:.1f}s")
    return topic


def run(quick: bool, broker: str | None = None) -> dict[str, Any]:
    samples = (20 if quick else 120) * BATCH
    out = run_header("dlrm-small")
    service = make_broker(broker)
    out["broker"] = service.label
    progress(f"starting {service.label} and redis-server")
    with service, RedisServer() as redis_srv, tempfile.TemporaryDirectory() as tmp:
        # The default config is the headline; it keeps the hot tier (hot_cache.enabled: auto), so the
        # tier's own figures (hotcache_*) are the same run. The write-through variant turns it off.
        variants: tuple[tuple[str, bool | Literal["auto"]], ...] = (("", "auto"), ("writethrough_", False))
        for label, hot in variants:
            topic = produce_topic(service, "train", samples)
            cfg = stream_config(
                service.bootstrap,
                topic,
                redis_srv.url,
                Path(tmp) / topic,
                hot_cache=hot,
                fetch_sessions=service.fetch_sessions_work,
            )
            progress(f"stream: kelp train on {topic} (hot cache {'on' if hot else 'off'})")
            stream, batches = stream_run(cfg, samples)
            progress(f"stream: {stream['samples_per_s']:,.0f} samples/s over {stream['steps']} steps")
            out[f"{label}stream_samples_per_s"] = round(stream["samples_per_s"], 1)
            out[f"{label}stream_stage_seconds"] = stream["stage_seconds"]
            out[f"{label}stream_auc"] = round(stream["auc"], 4)
            out[f"{label}overlay_patched_rows"] = stream["overlay_patched_rows"]
            if "working_copy_overlapped_rows" in stream:
                out[f"{label}working_copy_overlapped_rows"] = stream["working_copy_overlapped_rows"]
            for key, value in stream.get("cost", {}).items():  # per sample, over the steady steps
                out[f"{label}{key}"] = value
            if hot:
                out["hot_cache_hit_rate"] = round(stream["hot_cache_hit_rate"] or 0.0, 4)
                out["hot_cache_capacity_rows"] = cfg.store.hot_cache.capacity_rows
            if not label:
                progress("baseline: in-memory tables on the same batches")
                base = inmemory_run(cfg, batches)
                progress(f"baseline: {base['samples_per_s']:,.0f} samples/s")
                out["inmemory_samples_per_s"] = round(base["samples_per_s"], 1)
                out["inmemory_stage_seconds"] = base["stage_seconds"]
                out["inmemory_auc"] = round(base["auc"], 4)
                out["unique_id_ratio"] = round(_unique_id_ratio(batches), 4)
                out["batches"] = len(batches)
                progress("plain PyTorch loop: nn.EmbeddingBag tables, same batches, tensors ready")
                plain = plain_samples_per_s(cfg, batches, resolve_device(cfg.trainer.device))
                progress(f"plain: {plain:,.0f} samples/s")
                out["plain_inmemory_samples_per_s"] = round(plain, 1)
            ratio = out[f"{label}stream_samples_per_s"] / out["inmemory_samples_per_s"]
            out[f"{label}ratio"] = round(ratio, 3)
            plain_ratio = out[f"{label}stream_samples_per_s"] / out["plain_inmemory_samples_per_s"]
            out[f"{label}plain_ratio"] = round(plain_ratio, 3)
    out["row_layout"] = cfg.store.row_layout
    for key in ("stream_samples_per_s", "ratio", "plain_ratio"):
        out[f"hotcache_{key}"] = out[key]  # the default run keeps the tier
    return out
