"""``serving.workers: 2`` as a real ``kelp serve`` process: /metrics from any worker counts every request.

Two uvicorn workers share the port; each is a whole replica. Their metrics meet
in prometheus-client's multiprocess mode, so the request counter read from
whichever worker answers a scrape is the total of both. The test names the
shared directory itself, to see that both workers did take requests.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml

from kelp.harness import free_port

from .helpers import DEPLOYMENT, constant_model, publisher_for, small_config, start_serve, wait_until

pytestmark = pytest.mark.integration

REQUESTS = 60
SAMPLE = {"samples": [{"dense": {"I1": 1.0}, "sparse": {"C1": 3}}]}


def _counted(text: str) -> float:
    found = re.search(r'kelp_serving_requests_total\{endpoint="/v1/score",status="200"\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_two_workers_count_their_requests_together(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    grpc_port = free_port()
    serving = {"host": "127.0.0.1", "port": port, "workers": 2, "grpc_port": grpc_port}
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
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
