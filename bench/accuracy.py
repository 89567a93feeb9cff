"""``kelp bench accuracy``: does Kelp learn as well as the simple thing, and what does admission cost?

Progressive validation (each micro-batch scored before it trains), one pass,
batch 256, dim 16, row-wise Adagrad 0.05, Adam 1e-3, on two real time-ordered
streams (:mod:`kelp.bench.streams`):

1. **Parity.** Kelp's ``kelp train`` daemon (the shipped example configs, file
   source, in-memory store) against the plain PyTorch reference of
   :mod:`kelp.bench.reference`, same architecture, same stream. AUC and log loss
   are computed the same way for both: exactly, from the logits of every sample.
2. **Experiments** (full run): one change at a time, the controlled comparisons
   behind docs/accuracy.md (interaction layer, init scale, row-wise vs element-wise
   Adagrad, prefetching, evaluation binning, admission in the reference).
2b. **Two tasks** (:mod:`kelp.bench.accuracy_tasks`): Kelp's daemon with a
   two-head plug-in model against the reference with the same two heads, on
   criteo-attribution (click and conversion) and on Taobao UserBehavior
   (engaged and buy); each skipped, with the reason in the JSON, where its data
   is missing (the shipped criteo sample has no conversion label; Kelp does not
   ship Taobao).
2c. **First-order forms** (full run, :mod:`kelp.bench.accuracy_first_order`): DeepFM's
   ``projection`` and ``per_id`` (with and without its gradient scale) beside the
   reference, at ``min_count`` 1 and 3, three seeds, on Taobao, the synthetic
   long-tail click stream of :mod:`kelp.bench.longtail`, MovieLens and criteo-attribution.
3. **Sweep** on MovieLens-100k: admission ``min_count`` with and without fallback
   rows, TTL and LFU eviction. These runs use the trainer's step on an in-memory
   store whose clock is the stream's *event* time, so a TTL of 7 days means 7 days
   of MovieLens time, not 7 days of a replay that lasts seconds. Rows stored are
   counted at the end (expired rows excluded); bytes stored are what those rows and
   admission counters take in Redis, at per-row and per-counter costs measured on a
   real redis-server in the same run.

It writes a PNG (sweep + windowed AUC over each stream) and prints its path.
``--quick`` trains the first 30k samples of each stream and a smaller sweep.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from kelp.bench.accuracy_admission import ROWS_TARGET, admission_sweep, memory_auc, taobao_config
from kelp.bench.accuracy_first_order import first_order_comparison
from kelp.bench.accuracy_kelp import Trained, default_data_dir, kelp_config, train_daemon
from kelp.bench.accuracy_tasks import RUNS, multitask_parity
from kelp.bench.longtail import longtail_stream
from kelp.bench.reference import ReferenceOptions, train_reference
from kelp.bench.runner import progress
from kelp.bench.store import bytes_per_counter, bytes_per_row
from kelp.bench.streams import (
    CRITEO_ATTRIBUTION,
    MOVIELENS,
    TAOBAO,
    TAOBAO_FILE,
    Stream,
    load_stream,
    stream_folder,
)
from kelp.config import KelpConfig
from kelp.consumers import build_source
from kelp.daemon.stages import training_pull
from kelp.harness import RedisServer
from kelp.plots import curve_from_logits, plot_accuracy, plot_admission
from kelp.store.memory import MemoryStore
from kelp.trainer import ProgressiveValidator, TrainStep, build_model
from kelp.trainer.evaluation import exact_auc, log_loss_from_logits

__all__ = ["default_data_dir", "run"]

DAY_S = 86_400.0
QUICK_SAMPLES = 30_000
FALLBACK_BUCKETS = 64
COUNTER_TTL_S = 30 * DAY_S


class EventClock:
    """The store's clock during a replay: the newest event time trained so far (unix seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def train_on_event_time(cfg: KelpConfig) -> Trained:
    """The trainer's step, one batch after another, on an in-memory store whose clock is event time.

    Same pull (``training_pull``: occurrences counted), step and push as the daemon
    with ``prefetch_batches: 0``; the daemon's pipelined run is exactly equal to it
    (tests/daemon). Rows stored are sampled every 20 batches for the peak.
    """
    clock = EventClock()
    spec = cfg.features
    registry = CollectorRegistry()
    store = MemoryStore(spec.store_tables(), registry, clock=clock, seed=0)
    step = TrainStep(
        build_model(spec, cfg.trainer),
        spec,
        cfg.trainer,
        torch.device("cpu"),
        validator=ProgressiveValidator(),
    )
    labels: list[np.ndarray] = []
    logits: list[np.ndarray] = []
    peak = 0
    with build_source(cfg.source, spec, cfg.batching, registry) as source:
        for n, batch in enumerate(source):
            if np.isfinite(batch.event_ts).any():
                clock.now = max(clock.now, float(np.nanmax(batch.event_ts)))
            pulled = training_pull(store, batch, step.pull_plan(batch).ids)
            result = step(batch, pulled)
            store.push_many(result.updates)
            labels.append(batch.labels)
            logits.append(result.logits)
            if n % 20 == 0:
                peak = max(peak, sum(r or 0 for r in store.stats().rows.values()))
    stats = store.stats()
    rows = sum(r or 0 for r in stats.rows.values())
    return Trained(
        np.concatenate(labels),
        np.concatenate(logits),
        validator_auc=step.validator.cumulative().auc if step.validator else math.nan,
        rows_stored=rows,
        rows_peak=max(peak, rows),
        counters=sum(stats.admission_counters.values()),
    )


# ---------------------------------------------------------------------------------------- the parts


def _round(x: float, digits: int = 4) -> float:
    return round(float(x), digits)


def _parity(
    streams: Mapping[str, Stream], data_dir: Path, work: Path, limit: int | None
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    out: dict[str, Any] = {}
    curves: dict[str, list[Any]] = {}
    prefix = {CRITEO_ATTRIBUTION: "criteo_attribution", MOVIELENS: "movielens"}
    for name, stream in streams.items():
        progress(
            f"{name}: Kelp deepfm (kelp train daemon) and the reference deepfm, {len(stream.labels)} samples"
        )
        kelp = train_daemon(kelp_config(name, data_dir, work, limit, model="deepfm"))
        ref = train_reference(stream, ReferenceOptions(kind="deepfm"))
        if len(kelp.labels) != len(ref.labels) or not np.array_equal(kelp.labels, ref.labels):
            raise RuntimeError(
                f"{name}: Kelp and the reference did not train the same labels in the same order"
            )
        key = prefix[name]
        out[f"{key}_auc"] = _round(kelp.auc)
        out[f"{key}_reference_auc"] = _round(exact_auc(ref.labels, ref.logits))
        out[f"{key}_auc_gap"] = _round(kelp.auc - exact_auc(ref.labels, ref.logits))
        out[f"{key}_log_loss"] = _round(kelp.log_loss)
        out[f"{key}_reference_log_loss"] = _round(log_loss_from_logits(ref.labels, ref.logits).mean())
        out[f"{key}_binned_auc"] = _round(kelp.validator_auc)
        out[f"{key}_samples"] = len(kelp.labels)
        window = 50 * 256
        curves[name] = [
            curve_from_logits("Kelp deepfm", kelp.labels, kelp.logits, window),
            curve_from_logits("reference deepfm", ref.labels, ref.logits, window),
        ]
    return out, curves


def _configs(stream: str, data_dir: Path, work: Path) -> Callable[..., KelpConfig]:
    def cfg(**changes: Any) -> KelpConfig:
        return kelp_config(stream, data_dir, work, None, **changes)

    return cfg


def _experiments(streams: Mapping[str, Stream], data_dir: Path, work: Path) -> list[dict[str, Any]]:
    """One change at a time; each row says what was changed and both sides' AUC where both exist."""
    rows: list[dict[str, Any]] = []

    def add(stream: str, name: str, kelp: Trained | None, ref: ReferenceOptions | None) -> None:
        entry: dict[str, Any] = {"stream": stream, "experiment": name}
        if kelp is not None:
            entry["kelp_auc"] = _round(kelp.auc)
        if ref is not None:
            r = train_reference(streams[stream], ref)
            entry["reference_auc"] = _round(exact_auc(r.labels, r.logits))
        progress(f"  {stream}: {name}: {entry}")
        rows.append(entry)

    for stream in streams:
        cfg = _configs(stream, data_dir, work)
        add(
            stream,
            "dlrm-small (concatenation) / reference concat",
            train_daemon(cfg(model="dlrm-small")),
            ReferenceOptions(kind="concat"),
        )
        add(stream, "dcn-v2", train_daemon(cfg(model="dcn-v2")), None)
        add(
            stream,
            "reference deepfm with Kelp's projected first-order term",
            None,
            ReferenceOptions(kind="deepfm-proj"),
        )
        add(
            stream,
            "deepfm, init std 0.1 (default 0.01)",
            train_daemon(cfg(model="deepfm", init_std=0.1)),
            ReferenceOptions(kind="deepfm", init_std=0.1),
        )
        add(
            stream,
            "reference deepfm, element-wise Adagrad (Kelp: row-wise)",
            None,
            ReferenceOptions(kind="deepfm", rowwise=False),
        )
    add(
        MOVIELENS,
        "deepfm, prefetch 0 (strictly sequential; default 2)",
        train_daemon(kelp_config(MOVIELENS, data_dir, work, None, model="deepfm", prefetch=0)),
        None,
    )
    add(
        MOVIELENS,
        "deepfm, admission min_count 3 (occurrences), no fallback",
        train_daemon(
            kelp_config(
                MOVIELENS,
                data_dir,
                work,
                None,
                model="deepfm",
                admission={"min_count": 3, "counter_ttl_s": COUNTER_TTL_S},
            )
        ),
        ReferenceOptions(kind="deepfm", min_count=3),
    )
    return rows


@dataclass(frozen=True)
class SweepPoint:
    name: str
    min_count: int = 1
    fallback: int = 0
    warm_start: bool = False
    ttl_days: float | None = None
    lfu_fraction: float | None = None


def _sweep_points(quick: bool) -> list[SweepPoint]:
    if quick:
        return [
            SweepPoint("min_count 1"),
            SweepPoint("min_count 3", min_count=3),
            SweepPoint("min_count 3 + fallback", min_count=3, fallback=FALLBACK_BUCKETS),
            SweepPoint("TTL 7 d", ttl_days=7),
        ]
    points = [SweepPoint(f"min_count {k}", min_count=k) for k in (1, 2, 3, 5)]
    points += [
        SweepPoint(f"min_count {k} + fallback", min_count=k, fallback=FALLBACK_BUCKETS) for k in (1, 2, 3, 5)
    ]
    points += [
        SweepPoint("min_count 3 + fallback 512 warm", min_count=3, fallback=512, warm_start=True),
        SweepPoint("min_count 30", min_count=30),
        SweepPoint("min_count 30 + fallback", min_count=30, fallback=FALLBACK_BUCKETS),
        SweepPoint("min_count 30 + fallback 512", min_count=30, fallback=512),
        SweepPoint("min_count 30 + fallback 512 warm", min_count=30, fallback=512, warm_start=True),
        SweepPoint("TTL 7 d", ttl_days=7),
        SweepPoint("TTL 30 d", ttl_days=30),
        SweepPoint("min_count 3 + fallback + TTL 7 d", min_count=3, fallback=FALLBACK_BUCKETS, ttl_days=7),
        SweepPoint("min_count 3 + fallback + TTL 30 d", min_count=3, fallback=FALLBACK_BUCKETS, ttl_days=30),
        SweepPoint("LFU cap 50%", lfu_fraction=0.5),
    ]
    return points


def _sweep(
    stream: Stream, *, data_dir: Path, work: Path, limit: int | None, quick: bool, costs: Mapping[str, float]
) -> list[dict[str, Any]]:
    distinct = {f: len(np.unique(stream.ids[:, i])) for i, f in enumerate(stream.features)}
    out: list[dict[str, Any]] = []
    base_auc = base_rows = None
    for p in _sweep_points(quick):
        admission: dict[str, Any] = {"min_count": p.min_count, "counter_ttl_s": COUNTER_TTL_S}
        if p.fallback:
            admission.update(fallback_buckets=p.fallback, fallback_warm_start=p.warm_start)
        eviction: dict[str, Any] = {"ttl_s": p.ttl_days * DAY_S} if p.ttl_days else {}
        cfg = kelp_config(
            MOVIELENS, data_dir, work, limit, model="deepfm", admission=admission, eviction=eviction
        )
        if p.lfu_fraction:  # per table: a fraction of the ids the stream holds for it
            for t in cfg.features.tables:
                t.eviction.max_rows = max(1, int(p.lfu_fraction * distinct[t.name]))
        run = train_on_event_time(cfg)
        reference = None
        if not (p.fallback or p.ttl_days or p.lfu_fraction):  # admission alone: the reference can do it too
            reference = train_reference(stream, ReferenceOptions(kind="deepfm", min_count=p.min_count))
        per_row = costs["bytes_per_row_ttl"] if p.ttl_days else costs["bytes_per_row"]
        entry = {
            "name": p.name,
            "min_count": p.min_count,
            "fallback": p.fallback,
            "fallback_warm_start": p.warm_start,
            "ttl_s": p.ttl_days * DAY_S if p.ttl_days else None,
            "max_rows": {t.name: t.eviction.max_rows for t in cfg.features.tables}
            if p.lfu_fraction
            else None,
            "rows_stored": run.rows_stored,
            "rows_stored_peak": run.rows_peak,
            "admission_counters": run.counters,
            "bytes_stored": round(run.rows_stored * per_row + run.counters * costs["bytes_per_counter"]),
            "auc": _round(run.auc),
            "log_loss": _round(run.log_loss),
        }
        if reference is not None:
            entry["reference_auc"] = _round(exact_auc(reference.labels, reference.logits))
            entry["reference_log_loss"] = _round(
                log_loss_from_logits(reference.labels, reference.logits).mean()
            )
        if base_auc is None:
            base_auc, base_rows = run.auc, run.rows_stored
        entry["auc_loss_vs_min_count_1"] = _round(base_auc - run.auc)
        entry["rows_ratio_vs_min_count_1"] = _round(run.rows_stored / base_rows, 3) if base_rows else None
        progress(f"  sweep {p.name}: {entry['rows_stored']} rows, AUC {entry['auc']}")
        out.append(entry)
    return out


def _redis_costs(quick: bool) -> dict[str, float]:
    n = 5_000 if quick else 50_000
    progress(f"Redis bytes per row and per admission counter ({n} each, a fresh redis-server)")
    with RedisServer() as server:
        return {
            "bytes_per_row": round(bytes_per_row(server, n, None), 1),
            "bytes_per_row_ttl": round(bytes_per_row(server, n, 3600.0), 1),
            "bytes_per_counter": round(bytes_per_counter(server, n), 1),
        }


def run(quick: bool, data_dir: Path | None = None, out_dir: Path | None = None) -> dict[str, Any]:
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    out_dir = Path(out_dir) if out_dir is not None else Path("bench-results")
    limit = QUICK_SAMPLES if quick else None
    streams = {name: load_stream(name, data_dir).head(limit) for name in (CRITEO_ATTRIBUTION, MOVIELENS)}
    result: dict[str, Any] = {"batch_size": 256, "dim": 16, "data_dir": str(data_dir)}
    with tempfile.TemporaryDirectory(prefix="kelp-bench-accuracy-") as tmp:
        work = Path(tmp)
        parity, curves = _parity(streams, data_dir, work, limit)
        result.update(parity)
        for task_run in RUNS:
            tasks, task_curves = multitask_parity(task_run, data_dir, work, limit)
            result.update(tasks)
            if task_curves:
                curves[task_run.title] = task_curves
        if not quick:
            progress("experiments (one change at a time)")
            result["experiments"] = _experiments(streams, data_dir, work)
        costs = _redis_costs(quick)
        result["redis_costs"] = costs
        progress("MovieLens sweep: admission, fallback rows, TTL and LFU on event time")
        result["sweep"] = _sweep(
            streams[MOVIELENS], data_dir=data_dir, work=work, limit=limit, quick=quick, costs=costs
        )
        result["movielens_memory_auc"] = _movielens_memory_auc(result["sweep"])
        taobao = _taobao(data_dir, limit)
        if isinstance(taobao, str):
            progress(f"Taobao admission sweep: skipped: {taobao}")
            result["taobao_skipped"] = taobao
        else:
            progress("Taobao admission sweep (long tail): Kelp with and without fallback rows, the reference")
            result["taobao_sweep"] = admission_sweep(
                taobao,
                lambda admission, first_order: taobao_config(data_dir, work, limit, admission, first_order),
                train_on_event_time,
                min_counts=(1, 3) if quick else (1, 2, 3, 5),
                fallback_buckets=FALLBACK_BUCKETS,
                counter_ttl_s=COUNTER_TTL_S,
                costs=costs,
            )
            result["taobao_memory_auc"] = memory_auc(result["taobao_sweep"], first_order="projection")
        if not quick:
            candidates = (taobao, longtail_stream(), streams[MOVIELENS], streams[CRITEO_ATTRIBUTION])
            compared = [s for s in candidates if isinstance(s, Stream)]
            progress(f"deepfm's first-order forms on {', '.join(s.name for s in compared)} (3 seeds each)")
            result["first_order"] = first_order_comparison(
                compared, work=work, data_dir=data_dir, train=train_on_event_time
            )
    suffix = "-quick" if quick else ""
    title = "kelp bench accuracy" + (" --quick" if quick else "")
    path = out_dir / f"accuracy{suffix}.png"
    plot_accuracy(result["sweep"], curves, path, title)
    result["plot_path"] = str(path.resolve())
    progress(f"wrote {path.resolve()}")
    if "taobao_sweep" in result:
        admission_path = out_dir / f"admission{suffix}.png"
        plot_admission(
            {"Taobao UserBehavior (engaged)": result["taobao_sweep"]}, admission_path, title, ROWS_TARGET
        )
        result["admission_plot_path"] = str(admission_path.resolve())
        progress(f"wrote {admission_path.resolve()}")
    return result


def _taobao(data_dir: Path, limit: int | None) -> Stream | str:
    """The Taobao stream's first ``limit`` samples, or why it is not there (Kelp does not ship it)."""
    folder = stream_folder(TAOBAO, data_dir)
    if not (folder / TAOBAO_FILE).is_file():
        return f"{folder / TAOBAO_FILE} not found (Kelp does not ship Taobao UserBehavior: Tianchi's terms)"
    return load_stream(TAOBAO, data_dir).head(limit)


def _movielens_memory_auc(sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """MovieLens's answer to the memory–AUC question: admission alone (no fallback, TTL or LFU)."""
    plain = [
        {
            "min_count": e["min_count"],
            "fallback": 0,
            "rows_stored": e["rows_stored"],
            "auc_cost": e["auc_loss_vs_min_count_1"],
            "reference_auc_cost": None,
        }
        for e in sweep
        if not e["fallback"] and e["ttl_s"] is None and e["max_rows"] is None
    ]
    return memory_auc(plain)
