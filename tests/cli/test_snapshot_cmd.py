"""``kelp store snapshot | snapshots | restore``: bad input in one line, kill -9 mid-way, and S3.

A snapshot killed mid-scan is never listed as whole and the next one
succeeds; a restore killed mid-write leaves its marker, which names it, and
the next restore finishes over it (replacing the half-written rows) and clears
it. The commands run as a user runs them: in a subprocess where one is killed,
in-process otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis

from kelp.cli.main import main
from kelp.config import load_config
from kelp.daemon.row_snapshots import marker_key, restore_in_progress
from kelp.store import build_store
from kelp.store.snapshots.catalog import incomplete_snapshots, list_snapshots
from kelp.store.snapshots.storage import open_storage

ROWS = 60_000


def _write_config(tmp_path: Path, store: str, snapshots: str = "", name: str = "snapcli") -> Path:
    path = tmp_path / "kelp.yaml"
    path.write_text(
        f"deployment: {name}\n"
        f"source: {{kind: file, path: {tmp_path / 'x.tsv'}, format: criteo_tsv}}\n"
        f"store: {store}\n"
        "publisher: {enabled: false}\n"
        f"{snapshots}"
        "features: {sparse: [{name: ads}], tables: [{name: ads, dim: 8}]}\n"
    )
    return path


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    memory = _write_config(tmp_path, "{backend: memory}", "snapshots: {rows: {url: snaps}}\n")
    assert "store.backend is memory" in _error_line(capsys, ["store", "snapshot", "--config", str(memory)])
    unset = _write_config(tmp_path, "{backend: redis, urls: ['redis://127.0.0.1:1']}")
    line = _error_line(capsys, ["store", "snapshots", "--config", str(unset)])
    assert "snapshots.rows.url is not set" in line
    kept = _write_config(
        tmp_path,
        "{backend: redis, urls: ['redis://127.0.0.1:1']}",
        f"snapshots: {{rows: {{url: {tmp_path}}}}}\n",
    )
    line = _error_line(
        capsys, ["store", "restore", "--config", str(kept), "--snapshot", "20200101T000000.000Z-x"]
    )
    assert "no complete snapshot '20200101T000000.000Z-x'" in line
    with pytest.raises(SystemExit) as exc:
        main(["store", "snapshot", "--config", str(kept), "--shard-rows", "0"])
    assert exc.value.code == 2 and "expected a whole number >= 1" in capsys.readouterr().err


def _fill(config: Path) -> dict[str, np.ndarray]:
    """ROWS rows pushed through the store API; returns them by field, sorted by id."""
    cfg = load_config(config)
    ids = np.arange(1, ROWS + 1, dtype=np.uint64)
    rng = np.random.default_rng(5)
    with build_store(cfg.store, cfg.features.store_tables(), cfg.deployment) as store:
        for lo in range(0, ROWS, 10_000):
            part = ids[lo : lo + 10_000]
            store.push(
                "ads", part, rng.standard_normal((len(part), 8)).astype(np.float32), rng.random(len(part))
            )
        return _rows(config)


def _rows(config: Path) -> dict[str, np.ndarray]:
    cfg = load_config(config)
    with build_store(cfg.store, cfg.features.store_tables(), cfg.deployment) as store:
        blocks = [b for p in range(store.row_scan_parts()) for b in store.scan_rows("ads", p)]
    fields = ("ids", "rows", "state", "access_count", "updated_s")
    joined = {f: np.concatenate([getattr(b, f) for b in blocks]) for f in fields}
    _, first = np.unique(joined["ids"], return_index=True)
    return {f: v[first] for f, v in joined.items()}


def _kill_when(argv: list[str], seen: Callable[[], object], what: str) -> None:
    """Start ``kelp ARGV``, SIGKILL it as soon as ``seen()`` is true; fails if it ended first."""
    proc = subprocess.Popen([sys.executable, "-m", "kelp.cli", *argv], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not seen():
            if proc.poll() is not None:
                err = proc.stderr.read() if proc.stderr is not None else ""
                pytest.fail(f"`kelp {' '.join(argv)}` ended (rc {proc.returncode}) before {what}: {err}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.integration
def test_a_killed_snapshot_or_restore_is_never_taken_for_whole(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    snaps = tmp_path / "snaps"
    config = _write_config(
        tmp_path, f"{{backend: redis, urls: ['{redis_url}']}}", f"snapshots: {{rows: {{url: {snaps}}}}}\n"
    )
    before = _fill(config)
    storage = open_storage(str(snaps))
    base = ["--config", str(config)]

    _kill_when(
        ["store", "snapshot", *base, "--shard-rows", "500"],
        lambda: any(snaps.glob("snapcli/*/shards/*.safetensors")),
        "its first shard",
    )
    assert list_snapshots(storage, "snapcli") == [] and len(incomplete_snapshots(storage, "snapcli")) == 1
    assert main(["store", "snapshot", *base]) == 0
    taken = json.loads(capsys.readouterr().out)
    assert (taken["kind"], taken["rows"]) == ("full", ROWS)
    assert main(["store", "snapshots", *base, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["snapshots"]
    assert sorted(e["complete"] for e in listed) == [False, True]

    marker = redis.Redis.from_url(redis_url)
    _kill_when(
        ["store", "restore", *base, "--snapshot", "latest", "--replace"],
        lambda: marker.exists(marker_key("snapcli")),
        "the restore marker",
    )
    assert taken["id"] in (restore_in_progress(load_config(config)) or "")
    assert "has not finished" in _error_line(capsys, ["store", "snapshot", *base])
    assert main(["store", "restore", *base, "--snapshot", taken["id"]]) == 0  # no --replace needed
    report = json.loads(capsys.readouterr().out)
    assert report["replaced"] and taken["id"] in report["interrupted"]
    assert restore_in_progress(load_config(config)) is None
    after = _rows(config)
    for field, want in before.items():
        np.testing.assert_array_equal(after[field], want, err_msg=field)


@pytest.mark.integration
def test_snapshot_to_s3_and_restore_from_it(
    tmp_path: Path,
    redis_url: str,
    s3_snapshot_url: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, endpoint = s3_snapshot_url
    config = _write_config(
        tmp_path,
        f"{{backend: redis, urls: ['{redis_url}']}}",
        f"snapshots: {{rows: {{s3_endpoint: '{endpoint}'}}}}\n",
        name="snaps3",
    )
    cfg = load_config(config)
    with build_store(cfg.store, cfg.features.store_tables(), cfg.deployment) as store:
        store.push("ads", np.arange(1, 101, dtype=np.uint64), np.ones((100, 8), np.float32), np.zeros(100))
    before = _rows(config)
    assert main(["store", "snapshot", "--config", str(config), "--to", url]) == 0
    taken = json.loads(capsys.readouterr().out)
    assert main(["store", "snapshots", "--config", str(config), "--from", url]) == 0
    assert taken["id"] in capsys.readouterr().out
    redis.Redis.from_url(redis_url).flushall()
    assert main(["store", "restore", "--config", str(config), "--snapshot", "latest", "--from", url]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == {"ads": 100}
    after = _rows(config)
    for field, want in before.items():
        np.testing.assert_array_equal(after[field], want, err_msg=field)
