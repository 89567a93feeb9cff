"""Redis durability, stated and tested: what a SIGKILL of Redis costs acknowledged row updates.

Each test starts its own redis-server on a temporary data directory with the
append-only file on, pushes rows through Kelp's store (``build_store``, the
default layout), SIGKILLs Redis right after the acknowledgements and restarts
it on the same directory (``kelp.bench.chaos_durability``, also run by
``kelp bench chaos``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.bench.chaos_durability import probe_acked_updates
from kelp.config import StoreConfig, TableSpec
from kelp.harness import RedisServer
from kelp.harness.process import ManagedProcess
from kelp.retry import RetryPolicy
from kelp.store import build_store
from kelp.store.errors import ShardUnavailableError
from kelp.store.redis.durability import Durability

pytestmark = pytest.mark.integration


def test_appendfsync_always_loses_no_acknowledged_update_on_sigkill(tmp_path: Path) -> None:
    server = RedisServer(persistence=True, appendfsync="always", data_dir=tmp_path).start()
    try:
        probe = probe_acked_updates(server)
    finally:
        server.cleanup()
    assert probe.pushes_acked >= 50 and probe.acked_rows > 0
    assert probe.lost == 0, f"{probe.lost} of {probe.acked_rows} acknowledged rows lost"
    assert probe.durability == [Durability(f"127.0.0.1:{server.port}", "yes", "always")]
    assert probe.durability[0].loss_bound_s == 0.0


def test_without_the_append_only_file_the_restart_loses_what_was_acknowledged(tmp_path: Path) -> None:
    """The control: the same kill with persistence off loses the rows, so the probe can see a loss."""
    server = RedisServer(persistence=False, data_dir=tmp_path).start()
    try:
        probe = probe_acked_updates(server, min_pushes=10)
    finally:
        server.cleanup()
    assert probe.lost == probe.acked_rows > 0
    assert math.isinf(probe.durability[0].loss_bound_s)


@pytest.mark.parametrize(
    ("appendfsync", "bound", "says"),
    [("everysec", 1.0, "may lose the last ~1 s"), ("no", 30.0, "may lose the last ~30 s")],
)
def test_weaker_fsync_settings_are_detected_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, appendfsync: str, bound: float, says: str
) -> None:
    """``everysec`` may lose about a second on a crash: not asserted (timing), but reported."""
    registry = CollectorRegistry()
    with RedisServer(persistence=True, appendfsync=appendfsync, data_dir=tmp_path) as server:
        cfg = StoreConfig(backend="redis", urls=[server.url])
        caplog.set_level("INFO", logger="kelp.store.durability")
        with build_store(cfg, [TableSpec(name="t", dim=4)], "d", registry) as store:
            store.pull("t", np.arange(3, dtype=np.uint64))
        shard = f"127.0.0.1:{server.port}"
    labels = {"shard": shard, "appendonly": "yes", "appendfsync": appendfsync}
    assert registry.get_sample_value("kelp_store_durability_info", labels) == 1.0
    assert registry.get_sample_value("kelp_store_acked_loss_bound_seconds", {"shard": shard}) == bound
    assert f"appendfsync {appendfsync}: a crash {says}" in caplog.text


def test_refused_config_get_reports_unknown_and_the_store_still_works(tmp_path: Path) -> None:
    """Under an ACL without CONFIG the store works, and says it cannot tell."""

    with RedisServer(data_dir=tmp_path) as server:
        admin = server.client()
        admin.execute_command("ACL", "SETUSER", "kelp", "on", ">pw", "~*", "+@all", "-config")
        cfg = StoreConfig(backend="redis", urls=[f"redis://kelp:pw@127.0.0.1:{server.port}"])
        registry = CollectorRegistry()
        with build_store(cfg, [TableSpec(name="t", dim=4)], "d", registry) as store:
            store.push("t", np.array([1], np.uint64), np.ones((1, 4), np.float32), np.zeros(1, np.float32))
            assert store.pull("t", np.array([1], np.uint64), count=False).rows[0, 0] == 1.0
        shard = f"127.0.0.1:{server.port}"
    assert math.isnan(registry.get_sample_value("kelp_store_acked_loss_bound_seconds", {"shard": shard}))
    labels = {"shard": shard, "appendonly": "unknown", "appendfsync": "unknown"}
    assert registry.get_sample_value("kelp_store_durability_info", labels) == 1.0


def test_a_reader_exports_durability_but_logs_it_at_debug_only(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A serving replica (``writer=False``) never writes rows: an info line about what a crash loses, or
    redis.conf advice for the write encoding, at each replica start would read as a warning."""
    cfg = StoreConfig(backend="redis", urls=[redis_server.url])
    shard = f"127.0.0.1:{redis_server.port}"
    caplog.set_level("INFO", logger="kelp.store")
    for writer in (False, True):
        caplog.clear()
        registry = CollectorRegistry()
        with build_store(
            cfg, [TableSpec(name="t", dim=4)], f"reader-{writer}", registry, writer=writer
        ) as store:
            store.pull("t", np.array([1], np.uint64), count=False)
        assert registry.get_sample_value("kelp_store_acked_loss_bound_seconds", {"shard": shard}) is not None
        said = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
        assert any("durability" in m for m in said) is writer, said


def test_a_read_while_redis_replays_its_append_only_file_is_a_retriable_outage(tmp_path: Path) -> None:
    """After a restart Redis answers LOADING until its AOF is replayed: the store must say "unavailable,
    retry" (the trainer rides it out, serving answers 503), not decode the error reply as a row.

    ``key-load-delay`` (µs per key) makes the replay of 4,096 keys last ~8 s, so the reads land in it.
    """
    server = RedisServer(persistence=True, data_dir=tmp_path).start()
    loading: ManagedProcess | None = None
    cfg = StoreConfig(backend="redis", urls=[server.url])
    spec = TableSpec(name="t", dim=4)
    ids = np.arange(1, 9, dtype=np.uint64)
    try:
        with build_store(cfg, [spec], "d", CollectorRegistry(), retry=RetryPolicy(1, 0.0, 0.0)) as store:
            store.push("t", ids, np.ones((8, 4), np.float32), np.zeros(8, np.float32))
            admin = server.client()
            pipe = admin.pipeline(transaction=False)
            for i in range(4096):
                pipe.set(f"filler:{i}", "x")
            pipe.execute()
            admin.bgrewriteaof()  # the base file becomes an RDB preamble, which key-load-delay slows down
            while any(
                admin.info("persistence")[k] for k in ("aof_rewrite_in_progress", "aof_rewrite_scheduled")
            ):
                time.sleep(0.05)
            server.kill()
            argv = [
                *server._argv(),
                "--key-load-delay",
                "2000",
                "--loading-process-events-interval-bytes",
                "1024",
            ]
            loading = ManagedProcess(argv, "redis-loading", workdir=tmp_path)
            loading.start()
            seen: list[str] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any("loading" in s.lower() for s in seen):
                try:
                    store.pull("t", ids, count=False)  # the per-row reads of the default (buckets) layout
                    seen.append("answered")
                except ShardUnavailableError as exc:
                    seen.append(str(exc))
            assert any("loading" in s.lower() for s in seen), seen
    finally:
        if loading is not None:
            loading.stop()
        server.cleanup()
