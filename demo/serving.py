"""The serving half of ``kelp demo``: a real ``kelp serve`` process on what the trainer just learned.

Runs after the trainer has drained (its last snapshot is published to Redis):

1. starts ``kelp serve`` as a child process on a free loopback port and waits for ``/readyz``;
2. scores three real Criteo rows (``POST /v1/score``) and one user with five
   candidates (``POST /v1/score/candidates``), printing scores, the model
   version and the freshness the replica reports;
3. writes one embedding row into the store the way a trainer's push does and
   scores the same row again: the score moves while the model version stays,
   i.e. a sparse update is servable without any publish;
4. stops the replica with SIGTERM and checks it exits 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import yaml

from kelp.config import KelpConfig
from kelp.errors import KelpError

__all__ = ["demo_serving"]

Printer = Callable[[str], None]


def _http(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _samples(path: Path, n: int) -> list[dict[str, Any]]:
    """The first ``n`` rows as request samples (raw dense values, the ids the trainer saw)."""
    from kelp.consumers.file_source import iter_criteo_tsv

    out = []
    for packed in iter_criteo_tsv(path):
        sample = msgpack.unpackb(packed)
        out.append({"dense": sample["dense"], "sparse": {k: [v] for k, v in sample["sparse"].items()}})
        if len(out) == n:
            break
    return out


def _start_replica(cfg: KelpConfig, workdir: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    from kelp.harness import free_port

    served = cfg.model_copy(deep=True)
    served.serving.host = "127.0.0.1"
    served.serving.port = free_port()
    path = workdir / "serve.yaml"
    path.write_text(yaml.safe_dump(served.model_dump(mode="json", exclude_none=True)))
    log = workdir / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kelp.cli", "serve", "--config", str(path)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{served.serving.port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise KelpError(f"kelp serve exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if _http(f"{url}/readyz")[0] == 200:
                return proc, url, log
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise KelpError(f"kelp serve was not ready within 60s:\n{log.read_text()[-2000:]}")


def _freshness(reply: dict[str, Any]) -> str:
    age = reply.get("embedding_age_s") or {}
    mean = age.get("mean")
    rows = f"mean stored-row age {mean:.1f}s" if mean is not None else "no stored rows"
    return (
        f"model v{reply['model_version']} (age {reply['model_age_s']:.1f}s), {rows}, "
        f"default rows {reply['default_row_rate']:.0%}"
    )


def _a_stored_row(cfg: KelpConfig, sample: dict[str, Any]) -> tuple[str, int, Any] | None:
    """(table, id, store) of the first of the sample's ids that has a stored row (one batched read)."""
    from kelp.store.factory import build_store

    store = build_store(cfg.store, cfg.features.store_tables(), cfg.deployment)
    first = {cfg.features.sparse_table(f): ids[0] for f, ids in reversed(sample["sparse"].items()) if ids}
    got = store.pull_many({t: np.array([i], dtype=np.uint64) for t, i in first.items()}, count=False)
    for feature in sample["sparse"]:
        table = cfg.features.sparse_table(feature)
        stored = got[table].updated_s if table in got else None
        if stored is not None and stored[0] > 0:
            return table, first[table], store
    store.close()
    return None


def demo_serving(cfg: KelpConfig, data: Path, out: Printer) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; returns what the demo report needs."""
    workdir = Path(tempfile.mkdtemp(prefix="kelp-demo-serve-"))
    proc, url, _ = _start_replica(cfg, workdir)
    out(f"  kelp serve ready at {url} (pid {proc.pid})")
    result: dict[str, Any] = {}
    try:
        samples = _samples(data, 6)
        status, reply = _http(f"{url}/v1/score", {"samples": samples[:3]})
        if status != 200:
            raise KelpError(f"/v1/score answered {status}: {reply}")
        out(f"  POST /v1/score, 3 Criteo rows -> {[round(s, 4) for s in reply['scores']]}")
        out(f"    {_freshness(reply)}")
        result["version"] = reply["model_version"]

        # The user's features for all; each candidate brings its own item-side ids (C1-C3 here).
        user = {"dense": samples[0]["dense"], "sparse": dict(samples[0]["sparse"])}
        item_features = ("C1", "C2", "C3")
        candidates = [
            {"sparse": {k: samples[i]["sparse"][k] for k in item_features if k in samples[i]["sparse"]}}
            for i in range(1, 6)
        ]
        status, ranked = _http(f"{url}/v1/score/candidates", {"user": user, "candidates": candidates})
        if status != 200:
            raise KelpError(f"/v1/score/candidates answered {status}: {ranked}")
        scores = [round(s, 4) for s in ranked["scores"]]
        out(f"  POST /v1/score/candidates, 1 user x 5 candidates -> {scores}")

        found = _a_stored_row(cfg, samples[0])
        if found is None:
            out("  (row 0 has no stored embedding row to update; skipping the freshness step)")
        else:
            table, row_id, store = found
            try:
                before = reply["scores"][0]
                got = store.pull(table, np.array([row_id], dtype=np.uint64), count=False)
                bumped = got.rows * 40.0 + 0.5  # a large, visible change, written as a trainer's push writes
                store.push(table, np.array([row_id], dtype=np.uint64), bumped, got.state)
            finally:
                store.close()
            status, again = _http(f"{url}/v1/score", {"samples": samples[:1]})
            out(
                f"  pushed a new row for {table} id {row_id} (no publish): score of row 0 "
                f"{before:.4f} -> {again['scores'][0]:.4f}, model still v{again['model_version']}"
            )
            result["score_before"], result["score_after"] = before, again["scores"][0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    out(f"  kelp serve stopped with SIGTERM, exit {code}")
    result["exit"] = code
    return result
