"""A benchmark stopped by SIGTERM (``timeout``, Ctrl-C in CI) stops the services it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    ps = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in ps.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purpose.
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return fh.read().split(")")[-1].split()[0] != "Z"


def test_sigterm_stops_the_benchmarks_services(tmp_path: Path) -> None:
    log = tmp_path / "bench.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kelp.cli", "bench", "store", "--quick"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        # Generous: on a loaded machine importing torch and starting redis-server can take a while.
        deadline = time.monotonic() + 180
        while not _children(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        services = _children(proc.pid)
        tail = log.read_text(errors="replace")[-2000:]
        assert services, f"the benchmark started no service (exit code {proc.poll()}):\n{tail}"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    leaked = [pid for pid in services if _alive(pid)]
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert not leaked, f"services outlived the benchmark: {leaked}"
