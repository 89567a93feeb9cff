"""``kelp serve`` as a real process: the probe passes, SIGTERM shuts it down with status 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kelp.harness import free_port

from .helpers import constant_model, publisher_for, small_config, start_serve, wait_until

pytestmark = pytest.mark.integration


def _kelp(*args: str, **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        **kw,
    )


def test_serve_probe_and_sigterm(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    cfg = small_config(redis_url, tmp_path, serving={"host": "127.0.0.1", "port": port})
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    url = f"http://127.0.0.1:{port}"

    proc = start_serve(path)
    try:
        # running but not ready: no model yet, the probe fails with the reason
        wait_until(
            lambda: "readyz answered 503" in _kelp("probe", "--config", str(path), "--url", url).stdout,
            timeout_s=60.0,  # a start imports torch: slow on a loaded machine
            what="serve to listen",
        )
        pub = publisher_for(cfg)
        pub.maybe_publish(constant_model(cfg, 0.0), step=1, offsets={})
        pub.close()
        ok = wait_until(
            lambda: (r := _kelp("probe", "--config", str(path), "--url", url)).returncode == 0 and r,
            what="probe ok",
        )
        assert (
            ok.stdout.startswith("probe ok:")
            and "model v1" in ok.stdout
            and len(ok.stdout.strip().splitlines()) == 1
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_probe_fails_cleanly_when_nothing_listens(redis_url: str, tmp_path: Path) -> None:
    cfg = small_config(redis_url, tmp_path)
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    r = _kelp("probe", "--config", str(path), "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert r.returncode == 1 and r.stdout.startswith("probe failed:") and "Traceback" not in r.stderr
