"""Redis durability, stated and tested: what a SIGKILL of Redis costs acknowledged row updates.

Each test starts its own redis-server on a temporary data directory with the
append-only file on, pushes rows through Kelp's store (``build_store``, the
default layout), SIGKILLs Redis right after the acknowledgements and restarts
it on the same directory (``kelp.bench.chaos_durability``, also run by
``kelp bench chaos``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.bench.chaos_durability import probe_acked_updates
from kelp.config import StoreConfig, TableSpec
from kelp.harness import RedisServer
from kelp.store import build_store
from kelp.store.durability import Durability

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
