"""``serving.workers: 2`` as a real ``kelp serve`` process: /metrics from any worker counts every request.

Two uvicorn workers share the port; each is a whole replica. Their metrics meet
in prometheus-client's multiprocess mode, so the request counter read from
whichever worker answers a scrape is the total of both. The test names the
shared directory itself, to see that both workers did take requests.

Then one worker is killed (``kill -9``) in the middle of a request. Once
uvicorn has replaced it, the idle replica reports nothing in flight and ready,
the dead worker's files are gone from the directory, and no request it
answered is lost from the counter.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml
from prometheus_client.mmap_dict import MmapedDict

from kelp.harness import free_port

from .helpers import DEPLOYMENT, constant_model, publisher_for, small_config, start_serve, wait_until

pytestmark = pytest.mark.integration

REQUESTS = 60
SAMPLE = {"samples": [{"dense": {"I1": 1.0}, "sparse": {"C1": 3}}]}


def _counted(text: str) -> float:
    found = re.search(r'kelp_serving_requests_total\{endpoint="/v1/score",status="200"\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def _gauge(text: str, name: str) -> float | None:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _pids(shared: Path) -> set[int]:
    """The processes with metric files in the multiprocess directory."""
    return {int(m.group(1)) for p in shared.glob("*.db") if (m := re.search(r"_(\d+)\.db$", p.name))}


def _inflight_by_pid(shared: Path) -> dict[int, float]:
    found = {}
    for path in shared.glob("gauge_livesum_*.db"):
        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(str(path)):
            if json.loads(key)[0] == "kelp_serving_inflight_requests":
                found[int(path.stem.rsplit("_", 1)[1])] = value
    return found


def _kill_a_worker_mid_request(url: str, port: int, shared: Path) -> None:
    """kill -9 the worker holding a half-sent request; once it is replaced the scrape forgets it."""

    def scrape() -> str:
        with httpx.Client(base_url=url, timeout=30) as client:
            return client.get("/metrics").text

    before = _counted(scrape())
    hanging = socket.create_connection(("127.0.0.1", port))
    try:
        hanging.sendall(
            b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        busy = wait_until(
            lambda: [pid for pid, n in _inflight_by_pid(shared).items() if n >= 1],
            timeout_s=60,
            what="a worker to hold the half-sent request",
        )
        victim = busy[0]
        alive = _pids(shared) - {victim}
        os.kill(victim, signal.SIGKILL)
    finally:
        hanging.close()
    wait_until(lambda: _pids(shared) - alive - {victim}, timeout_s=120, what="uvicorn to replace the worker")
    wait_until(lambda: victim not in _pids(shared), timeout_s=60, what="the dead worker's files to go")

    def settled() -> bool:
        text = scrape()  # the scrape is the one request in flight: the killed one no longer counts
        return _gauge(text, "kelp_serving_inflight_requests") == 1 and _gauge(text, "kelp_serving_ready") == 1

    wait_until(settled, timeout_s=120, what="only the scrape in flight, and ready 1, on the idle replica")
    assert not list(shared.glob(f"*_{victim}.db"))
    assert _counted(scrape()) == before  # the dead worker's answers still count


def test_two_workers_count_their_requests_together(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    grpc_port = free_port()
    serving = {
        "host": "127.0.0.1",
        "port": port,
        "workers": 2,
        "grpc_port": grpc_port,
        "body_timeout_s": 300,  # the half-sent request below stays in flight until its worker is killed
    }
    cfg = small_config(redis_url, tmp_path, serving=serving)
    publisher = publisher_for(cfg)
    publisher.maybe_publish(constant_model(cfg, 0.0), step=1, offsets={}, force=True)
    publisher.close()
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    shared = tmp_path / "metrics"
    shared.mkdir()
    proc = start_serve(path, PROMETHEUS_MULTIPROC_DIR=str(shared))
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout_s=60, what="the workers to load the model")
        for _ in range(REQUESTS):  # a new connection each: the kernel spreads them over the workers
            with httpx.Client(base_url=url, timeout=30) as client:
                assert client.post("/v1/score", json=SAMPLE).status_code == 200
        writers = {p.name for p in shared.glob("counter_*.db")}
        assert len(writers) >= 2, writers  # both workers answered some of the requests
        for _ in range(4):  # whichever worker answers the scrape, it counts all of them
            with httpx.Client(base_url=url, timeout=30) as client:
                assert _counted(client.get("/metrics").text) == REQUESTS
        # Both workers listen on the gRPC port too (SO_REUSEPORT): a client there is answered.
        grpc = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            ids = triton.InferInput("C1", [1], "INT64")
            ids.set_data_from_numpy(np.array([3], np.int64))
            assert grpc.infer(DEPLOYMENT, [ids]).as_numpy("label").shape == (1,)
        finally:
            grpc.close()
        _kill_a_worker_mid_request(url, port, shared)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
