"""``kelp bench snapshot``: row snapshots, incrementals and restore against Redis's own RDB dump.

Workload: one standalone ``redis-server`` started here, the store as a
standalone config gets it by default (``layout`` in the result names it), the
criteo-synth tables (26 tables of dim 16, float32, admission off) filled with
``rows`` rows in all, each stored an hour ago. Every figure goes through the
code an operator runs: :func:`~kelp.daemon.row_snapshots.take_snapshot` and
:func:`~kelp.daemon.row_snapshots.restore_snapshot` with a config whose source
is a file (no Kafka, so no offsets to read or set), into a directory.

* full snapshot: rows/s and bytes written per row (every file of the snapshot);
* incremental, after ``push_many`` of new values for a share of the rows of
  every table: rows/s over the rows it holds and its seconds against the full
  one's. The scan still reads every row from Redis to keep the changed ones,
  so its cost is the full scan's read plus the changed rows' encoding and
  writing, not proportional to the change alone;
* restore of the full snapshot into the flushed server: rows/s;
* the floor, same server, same rows: ``BGSAVE`` (from the command until the
  fork's save is done) and its RDB's bytes per row, and ``redis-cli --rdb``
  (a replica's full sync into a file, the way an operator takes a dump
  remotely);
* training throughput lost while a snapshot runs. What stands for training is
  a process doing what a trainer does to the store each step, without a model:
  ``pull_many`` of a criteo-synth-like batch (4096 samples, ids drawn Zipf-like
  over the stored ids of each table, deduplicated), then ``push_many`` of the
  same rows changed. Its rows/s over fixed windows alone are compared with its
  rows/s while a full snapshot runs, alternating; the snapshot runs either on
  a thread inside the load's process (as ``snapshots.rows.every_s`` runs it in
  the trainer: ``throughput_lost_share``) or in a process of its own (as
  ``kelp store snapshot`` runs beside a trainer: ``..._separate_process``),
  and paced in a process of its own at ``PACED_SHARE`` of the unpaced rate
  (``snapshots.rows.max_rows_per_s``: ``..._paced``).
  A real trainer spends most of a step in the model, so it touches the store
  less per second than this load does; on a 2-core machine the snapshot's scan,
  the load and redis-server share the same cores.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kelp.bench.runner import progress
from kelp.config import FileSourceConfig, KelpConfig, StoreConfig, load_config
from kelp.daemon.row_snapshots import restore_snapshot, take_snapshot
from kelp.examples import example_path
from kelp.harness import RedisServer
from kelp.harness.binaries import find_binary
from kelp.store import build_store
from kelp.store.base import EmbeddingStore
from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.catalog import delete_snapshot
from kelp.store.snapshots.manifest import SnapshotManifest
from kelp.store.snapshots.storage import open_storage

__all__ = ["run"]

DIM = 16
N_TABLES = 26
UPDATED_SHARE = 0.05
"""Share of every table's rows given new values between the full and the incremental snapshot."""
LOAD_BATCH = 4096
"""Samples per step of the stand-in training load (the criteo-synth batch)."""
REPS = 3
"""Alone and during-snapshot windows of the load, alternated, each this many times."""
PACED_SHARE = 0.25
"""The paced snapshot's ``snapshots.rows.max_rows_per_s``, as a share of the unpaced full snapshot's rate."""
FILL_BLOCK = 50_000
STORED_AGO_S = 3600
"""The filled rows' last update: long before the full snapshot, so an incremental leaves them out."""


# --------------------------------------------------------------------------- set-up


def bench_config(redis_url: str, workdir: Path) -> KelpConfig:
    """criteo-synth's tables on ``redis_url`` (default layout), a file source, snapshots in ``workdir``."""
    cfg = load_config(example_path("criteo-synth.yaml"))
    cfg.deployment = f"bench-snap-{uuid.uuid4().hex[:6]}"
    cfg.source = FileSourceConfig(path=workdir / "unused.tsv", format="criteo_tsv")
    cfg.store = StoreConfig(backend="redis", urls=[redis_url])
    cfg.store.hot_cache.enabled = False  # every step of the load goes to Redis, as a snapshot does
    cfg.publisher.enabled = False
    cfg.metrics.enabled = False
    cfg.snapshots.rows.url = str(workdir / "snapshots")
    tables = cfg.features.store_tables()
    if len(tables) != N_TABLES or any(t.dim != DIM for t in tables):
        raise RuntimeError(f"criteo-synth.yaml no longer has {N_TABLES} tables of dim {DIM}")
    return cfg


def open_store(cfg: KelpConfig) -> EmbeddingStore:
    return build_store(cfg.store, cfg.features.store_tables(), cfg.deployment)


def table_ids(table: int, n: int) -> np.ndarray:
    """``n`` distinct ids of table number ``table``, spread over the id space as hashed ids are."""
    base = np.arange(n, dtype=np.uint64) * np.uint64(2654435761)
    return base + np.uint64(table * 7 + 1)


def fill(store: EmbeddingStore, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Write ``rows`` rows in all, spread evenly over the tables, stored :data:`STORED_AGO_S` ago."""
    rng = np.random.default_rng(seed)
    names = list(store.tables)
    per_table = max(1, rows // len(names))
    stored_at = int(time.time()) - STORED_AGO_S
    ids_by_table: dict[str, np.ndarray] = {}
    for t, name in enumerate(names):
        ids = table_ids(t, per_table)
        ids_by_table[name] = ids
        for start in range(0, per_table, FILL_BLOCK):
            block = ids[start : start + FILL_BLOCK]
            n = len(block)
            store.load_rows(
                name,
                StoredRows(
                    ids=block,
                    rows=rng.standard_normal((n, DIM)).astype(np.float32),
                    state=rng.random(n).astype(np.float32),
                    access_count=np.ones(n, np.uint32),
                    updated_s=np.full(n, stored_at, np.uint32),
                ),
            )
    return ids_by_table


def update_share(store: EmbeddingStore, ids_by_table: Mapping[str, np.ndarray], share: float) -> int:
    """Push new values for ``share`` of every table's rows (as training would); returns the rows pushed."""
    rng = np.random.default_rng(7)
    pushed = 0
    for name, ids in ids_by_table.items():
        chosen = rng.choice(ids, size=max(1, int(len(ids) * share)), replace=False)
        for start in range(0, len(chosen), FILL_BLOCK):
            part = chosen[start : start + FILL_BLOCK]
            rows = rng.standard_normal((len(part), DIM)).astype(np.float32)
            store.push_many({name: (part, rows, np.ones(len(part), np.float32))})
        pushed += len(chosen)
    return pushed


# --------------------------------------------------------------------------- snapshots and restore


def snapshot_bytes(workdir: Path, manifest: SnapshotManifest) -> int:
    """Every byte the snapshot put on disk: shards and manifest."""
    folder = workdir / "snapshots" / manifest.deployment / manifest.snapshot_id
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@dataclass
class Taken:
    """One timed snapshot."""

    manifest: SnapshotManifest
    seconds: float
    bytes: int

    @property
    def rows(self) -> int:
        return self.manifest.total_rows


def timed_snapshot(cfg: KelpConfig, workdir: Path, *, incremental: bool) -> Taken:
    started = time.perf_counter()
    manifest = take_snapshot(cfg, incremental=incremental)
    seconds = time.perf_counter() - started
    return Taken(manifest, seconds, snapshot_bytes(workdir, manifest))


def timed_restore(cfg: KelpConfig, server: RedisServer, snapshot_id: str) -> tuple[int, float]:
    """Flush the server and restore ``snapshot_id`` into it: ``(rows written, seconds)``."""
    server.client().flushall()
    started = time.perf_counter()
    report = restore_snapshot(cfg, snapshot_id, replace=False)
    return sum(report.rows.values()), time.perf_counter() - started


# --------------------------------------------------------------------------- the floor


def bgsave(server: RedisServer, timeout_s: float = 600.0) -> tuple[float, int]:
    """``BGSAVE``: seconds until the save is done, and the RDB file's bytes."""
    client = server.client()
    dump = Path(client.config_get("dir")["dir"]) / client.config_get("dbfilename")["dbfilename"]
    dump.unlink(missing_ok=True)
    before = int(client.lastsave().timestamp())
    started = time.perf_counter()
    client.bgsave()
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info("persistence")
        if not info["rdb_bgsave_in_progress"] and dump.exists():
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"BGSAVE did not finish in {timeout_s:.0f} s")
        time.sleep(0.005)
    seconds = time.perf_counter() - started
    if info["rdb_last_bgsave_status"] != "ok" or int(client.lastsave().timestamp()) < before:
        raise RuntimeError(f"BGSAVE failed: {info['rdb_last_bgsave_status']}")
    client.close()
    return seconds, dump.stat().st_size


def redis_cli_rdb(server: RedisServer, path: Path, timeout_s: float = 600.0) -> tuple[float, int]:
    """``redis-cli --rdb``: seconds to receive the server's dump into ``path``, and its bytes.

    The server's ``repl-diskless-sync-delay`` (seconds it waits for more replicas
    before a diskless sync starts) is set to 0 for the call: the floor is the
    dump's transfer, not a wait an operator can configure away.
    """
    client = server.client()
    delay = client.config_get("repl-diskless-sync-delay")["repl-diskless-sync-delay"]
    client.config_set("repl-diskless-sync-delay", 0)
    argv = [find_binary("redis-cli"), "-h", server.host, "-p", str(server.port), "--rdb", str(path)]
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    finally:
        seconds = time.perf_counter() - started
        client.config_set("repl-diskless-sync-delay", delay)
        client.close()
    if done.returncode != 0 or not path.exists():
        raise RuntimeError(f"redis-cli --rdb failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return seconds, path.stat().st_size


# --------------------------------------------------------------------------- the stand-in for training


def load_batches(
    ids_by_table: Mapping[str, np.ndarray], count: int, seed: int = 3
) -> list[dict[str, np.ndarray]]:
    """``count`` steps of unique ids per table: :data:`LOAD_BATCH` draws, Zipf-like (1.1) over stored ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        step = {}
        for name, ids in ids_by_table.items():
            ranks = np.arange(1, len(ids) + 1, dtype=np.float64)
            cdf = np.cumsum(ranks**-1.1)
            picks = np.searchsorted(cdf, rng.random(LOAD_BATCH) * cdf[-1])
            step[name] = np.unique(ids[np.minimum(picks, len(ids) - 1)])
        out.append(step)
    return out


def train_like_step(store: EmbeddingStore, batch: Mapping[str, np.ndarray]) -> int:
    """What a trainer does to the store per step, without a model: pull the rows, push them changed."""
    pulled = store.pull_many(batch)
    store.push_many({n: (ids, pulled[n].rows + 1e-3, pulled[n].state) for n, ids in batch.items()})
    return sum(len(ids) for ids in batch.values())


def _load_worker(
    cfg: KelpConfig,
    batches: list[dict[str, np.ndarray]],
    conn: Any,
    stop: Any,
    ready: Any,
) -> None:
    """The load's process: steps until ``stop``; on a ``"snapshot"`` message takes one on a thread of its
    own (as the trainer's schedule does) and answers ``(started, ended, snapshot_id)``; at the end
    sends every step's ``(started, ended, rows)`` (monotonic clock, shared by processes)."""
    steps: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def snapshot() -> None:
        started = time.monotonic()
        try:
            snapshot_id = take_snapshot(cfg).snapshot_id
            answer: tuple[Any, ...] = (started, time.monotonic(), snapshot_id)
        except Exception as exc:  # the parent raises it: a silent thread would leave it waiting
            answer = ("error", f"{type(exc).__name__}: {exc}")
        with lock:
            conn.send(answer)

    with open_store(cfg) as store:
        i = 0
        while not stop.is_set():
            if conn.poll() and conn.recv() == "snapshot":
                threading.Thread(target=snapshot, name="kelp-bench-snapshot", daemon=True).start()
            started = time.monotonic()
            rows = train_like_step(store, batches[i % len(batches)])
            steps.append((started, time.monotonic(), rows))
            i += 1
            if i == 2:
                ready.set()
    with lock:
        conn.send(steps)


def window_rate(steps: Sequence[tuple[float, float, int]], start: float, end: float) -> float:
    """Rows/s of the load over ``[start, end]``: each step's rows counted by its share inside the window."""
    rows = 0.0
    for s0, s1, n in steps:
        overlap = min(s1, end) - max(s0, start)
        if overlap > 0:
            rows += n * overlap / max(s1 - s0, 1e-9)
    return rows / (end - start)


@dataclass
class Windows:
    """The load's windows: ``(kind, start, end)`` with kind ``alone``, ``in_process`` or ``separate``."""

    spans: list[tuple[str, float, float]]
    snapshot_ids: list[str]


def measure_load(
    cfg: KelpConfig,
    ids_by_table: Mapping[str, np.ndarray],
    *,
    window_s: float,
    reps: int,
    modes: Sequence[str] = ("in_process", "separate"),
    timeout_s: float = 900.0,
    paced_cfg: KelpConfig | None = None,
) -> dict[str, Any]:
    """The stand-in load alone and during full snapshots, windows alternated ``reps`` times."""
    batches = load_batches(ids_by_table, 16)
    ctx = mp.get_context("spawn")  # a clean process, as a trainer is: no threads or sockets inherited
    parent, child = ctx.Pipe()
    stop, ready = ctx.Event(), ctx.Event()
    proc = ctx.Process(
        target=_load_worker,
        args=(cfg, batches, child, stop, ready),
        name="kelp-bench-load",
        daemon=True,
    )
    proc.start()
    windows = Windows([], [])
    try:
        if not ready.wait(timeout_s):
            raise RuntimeError("the load process did not start its steps")
        for rep in range(reps):
            for mode in modes:
                progress(
                    f"load: alone {window_s:.1f} s, then during a full snapshot ({mode}), {rep + 1}/{reps}"
                )
                start = time.monotonic()
                time.sleep(window_s)
                windows.spans.append(("alone", start, time.monotonic()))
                during_cfg = paced_cfg if mode == "paced" and paced_cfg is not None else cfg
                windows.spans.append(_during(during_cfg, mode, parent, windows, timeout_s))
        stop.set()
        if not parent.poll(timeout_s):
            raise RuntimeError("the load process did not report its steps")
        steps = parent.recv()
    finally:
        stop.set()
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    out = _load_figures(steps, windows.spans)
    out["load_rows_per_step"] = statistics.mean(sum(len(ids) for ids in b.values()) for b in batches)
    return out


def _during(
    cfg: KelpConfig, mode: str, conn: Any, windows: Windows, timeout_s: float
) -> tuple[str, float, float]:
    """One full snapshot while the load runs: in the load's process or in this one (``paced``: in
    this one, at ``cfg``'s ``snapshots.rows.max_rows_per_s``)."""
    if mode == "in_process":
        conn.send("snapshot")
        if not conn.poll(timeout_s):
            raise RuntimeError("the load process's snapshot did not finish")
        answer = conn.recv()
        if answer[0] == "error":
            raise RuntimeError(f"the snapshot in the load's process failed: {answer[1]}")
        start, end, snapshot_id = answer
    else:
        start = time.monotonic()
        snapshot_id = take_snapshot(cfg).snapshot_id
        end = time.monotonic()
    windows.snapshot_ids.append(snapshot_id)
    delete_snapshot(open_storage(str(cfg.snapshots.rows.url)), cfg.deployment, snapshot_id)  # disk
    return mode, start, end


def _load_figures(
    steps: Sequence[tuple[float, float, int]], spans: Sequence[tuple[str, float, float]]
) -> dict[str, Any]:
    """Median rows/s of the load per kind of window, and the share lost during snapshots."""
    rates: dict[str, list[float]] = {}
    seconds: dict[str, list[float]] = {}
    for kind, start, end in spans:
        rates.setdefault(kind, []).append(window_rate(steps, start, end))
        seconds.setdefault(kind, []).append(end - start)
    alone = statistics.median(rates["alone"])
    out: dict[str, Any] = {"load_rows_per_s_alone": alone, "load_windows_alone": rates["alone"]}
    suffixes = {"in_process": "", "separate": "_separate_process", "paced": "_paced"}
    for kind, suffix in suffixes.items():
        if kind not in rates:
            continue
        during = statistics.median(rates[kind])
        out[f"load_rows_per_s_during_snapshot{suffix}"] = during
        out[f"throughput_lost_share{suffix}"] = 1.0 - during / alone
        out[f"load_windows_during_snapshot{suffix}"] = rates[kind]
        out[f"full_seconds_under_load{suffix}"] = statistics.median(seconds[kind])
    return out


# --------------------------------------------------------------------------- the suite


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4) if abs(value) < 10 else round(value, 1)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def measure(
    server: RedisServer,
    workdir: Path,
    rows: int,
    *,
    reps: int = REPS,
    modes: Sequence[str] = ("in_process", "separate"),
    min_window_s: float = 1.0,
    say: Callable[[str], None] = progress,
) -> dict[str, Any]:
    """Every figure of the suite on ``server`` (flushed first) with ``rows`` rows, snapshots in ``workdir``.

    The load's windows alone last as long as the full snapshot took alone, at
    least ``min_window_s``.
    """
    server.client().flushall()
    cfg = bench_config(server.url, workdir)
    out: dict[str, Any] = {"tables": N_TABLES, "dim": DIM, "dtype": "float32", "layout": cfg.store.row_layout}
    with open_store(cfg) as store:
        say(f"filling {rows:,} rows over {N_TABLES} tables (layout {out['layout']})")
        ids_by_table = fill(store, rows)
        stored = sum(len(ids) for ids in ids_by_table.values())
        out["rows"] = stored

        say("full snapshot")
        full = timed_snapshot(cfg, workdir, incremental=False)
        if full.rows != stored:
            raise RuntimeError(f"the full snapshot holds {full.rows} rows, the store {stored}")
        out.update(
            full_seconds=full.seconds,
            full_rows_per_s=full.rows / full.seconds,
            full_bytes_per_row=full.bytes / full.rows,
        )

        say("floor: BGSAVE and redis-cli --rdb of the same store")
        save_s, rdb_bytes = bgsave(server)
        cli_s, cli_bytes = redis_cli_rdb(server, workdir / "cli.rdb")
        (workdir / "cli.rdb").unlink()
        out.update(
            bgsave_seconds=save_s,
            bgsave_rows_per_s=stored / save_s,
            rdb_bytes_per_row=rdb_bytes / stored,
            redis_cli_rdb_seconds=cli_s,
            redis_cli_rdb_rows_per_s=stored / cli_s,
            redis_cli_rdb_bytes_per_row=cli_bytes / stored,
        )
        out["full_vs_bgsave"] = out["full_rows_per_s"] / out["bgsave_rows_per_s"]
        out["full_vs_redis_cli_rdb"] = out["full_rows_per_s"] / out["redis_cli_rdb_rows_per_s"]
        out["full_bytes_vs_rdb"] = out["full_bytes_per_row"] / out["rdb_bytes_per_row"]

        say(f"incremental after pushing {UPDATED_SHARE:.0%} of the rows")
        out["incremental_rows_updated"] = update_share(store, ids_by_table, UPDATED_SHARE)
        inc = timed_snapshot(cfg, workdir, incremental=True)
        out.update(
            incremental_rows=inc.rows,
            incremental_seconds=inc.seconds,
            incremental_rows_per_s=inc.rows / inc.seconds,
            incremental_bytes_per_row=inc.bytes / max(1, inc.rows),
            incremental_share_of_full_seconds=inc.seconds / full.seconds,
            incremental_share_of_rows=inc.rows / stored,
        )

    pace = PACED_SHARE * out["full_rows_per_s"]
    paced_cfg = cfg.model_copy(deep=True)
    paced_cfg.snapshots.rows.max_rows_per_s = pace
    out["paced_max_rows_per_s"] = pace
    say(f"training stand-in alone and during full snapshots, {reps} times each")
    load = measure_load(
        cfg,
        ids_by_table,
        window_s=max(min_window_s, full.seconds),
        reps=reps,
        modes=modes,
        paced_cfg=paced_cfg,
    )
    out.update(load)
    lost = "throughput_lost_share"
    # train_slowdown: the name ../shared/BENCHMARKS.md gives the same figure
    out["train_slowdown"] = load.get(lost, load.get(f"{lost}_separate_process"))

    say("restore of the full snapshot into the flushed server")
    restored, restore_s = timed_restore(cfg, server, full.manifest.snapshot_id)
    if restored != stored:
        raise RuntimeError(f"the restore wrote {restored} rows, the snapshot holds {stored}")
    out.update(restore_seconds=restore_s, restore_rows_per_s=restored / restore_s)
    out["restore_vs_full"] = out["restore_rows_per_s"] / out["full_rows_per_s"]
    return {k: _rounded(v) for k, v in out.items()}


def run(quick: bool) -> dict[str, Any]:
    rows = 200_000 if quick else 1_000_000
    result: dict[str, Any] = {"store": "one standalone redis-server"}
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="kelp-bench-snapshot-") as tmp:
        result["redis_version"] = server.client().info("server")["redis_version"]
        # quick: within its 60 s
        modes = ("in_process", "paced") if quick else ("in_process", "separate", "paced")
        result.update(measure(server, Path(tmp), rows, modes=modes))
    return result
