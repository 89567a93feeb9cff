"""``kelp bench serve``: closed-loop HTTP load on a real replica while the model is hot-swapped.

Set-up (all started here, on loopback, stopped afterwards):

* a real ``redis-server`` (the harness), holding criteo-synth rows (dim 16,
  26 tables) for every id the requests use;
* ``kelp serve`` as a separate process (uvicorn, 1 worker, torch 1 thread),
  reading the same Redis, subscribed to the Redis snapshot channel;
* this process publishes ``dlrm-small`` snapshots: one before the run, then a
  new version every ``duration / (SWAPS + 1)`` seconds during it (>= 5 swaps).

Load: ``CONCURRENCY`` client threads in this process, each with one
keep-alive connection, send ``POST /v1/score/candidates`` back to back
(closed loop). A request is one user (I1..I13 dense, C1..C13) plus 100
candidates (C14..C26 each), drawn from criteo-synth (synthetic; Zipf ids), so
one request reads ~1,300 unique rows from 26 tables. After the 2-client run
with hot swaps: 8 clients for half as long (``p99_ms_8_clients``), then 2
clients sending the compact form, msgpack bodies with packed candidate id
columns and msgpack replies (``p99_ms_msgpack``). Then a second ``kelp
serve`` with ``serving.workers: 2`` takes 8 clients for as long
(``rps_8_clients_2_workers``, ``p99_ms_8_clients_2_workers``). Last, a third
with the local row cache on (``serving.local_cache_ttl_ms``: ``CACHE_TTL_MS``)
takes 2 JSON clients for as long (``*_cached``, with ``cache_hit_rate``: the
share of rows the cache answered; the 64 requests cycle, so it is high).

The client is cheap on purpose, because it shares the machine (2 cores in the
documented runs) with the replica and Redis: each request is encoded once
before the run (JSON body and HTTP head as bytes, see :class:`_Connection`),
and the socket has ``TCP_NODELAY``. Latency is still measured at the client,
per request, from the first byte sent to the reply read and parsed (orjson or
msgpack; the number of scores checked). ``errors`` counts non-200 answers and
transport failures. ``cpu_ms_per_request`` (the replica's processes, uvicorn's
workers included, from ``/proc``: Linux only) and ``client_cpu_ms_per_request``
say what one request cost each side in CPU, which shared-machine noise barely
moves.

Floor, same run, same Redis, same requests: a raw read (``MGET`` per table, or
per-row ``HGET`` in the default ``buckets`` layout, in one pipeline) of the
request's unique row keys decoded with ``numpy.frombuffer``, plus the bare
``dlrm-small`` forward on the pooled tensors, in-process (no HTTP, no JSON, no
validation). ``floor_p50_ms`` is its median; ``p50_ms / floor_p50_ms`` is what
the HTTP layer, validation and Kelp's store path cost on top.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import orjson
import redis
import torch
import yaml
from prometheus_client import CollectorRegistry

from kelp.bench.runner import progress
from kelp.bench.synth import CriteoSynth
from kelp.config import KelpConfig
from kelp.consumers.criteo import DENSE_NAMES, SPARSE_NAMES, criteo_feature_spec
from kelp.harness import RedisServer, free_port
from kelp.publish import build_publisher
from kelp.store import build_store
from kelp.store.redis import PackedPipeline, pack_commands
from kelp.store.redis.keys import BucketLayout, KeyLayout
from kelp.trainer import ModelInput, build_model

__all__ = ["run"]

CONCURRENCY = 2  # closed-loop clients: the documented load (see docs/serving.md)
CANDIDATES = 100
USER_FEATURES = SPARSE_NAMES[:13]
ITEM_FEATURES = SPARSE_NAMES[13:]
POOL = 64  # distinct requests, cycled
SWAPS = 6
CACHE_TTL_MS = 1000  # the cached run's serving.local_cache_ttl_ms: one second of added staleness
DEPLOYMENT = "bench-serve"


def _requests(n: int) -> list[dict[str, Any]]:
    synth = CriteoSynth(seed=0)
    out = []
    for _ in range(n):
        user = synth.batch(1)
        items = synth.batch(CANDIDATES)
        out.append(
            {
                "user": {
                    "dense": dict(zip(DENSE_NAMES, user.dense[0].tolist(), strict=True)),
                    "sparse": {f: int(user.sparse[0, i]) for i, f in enumerate(USER_FEATURES)},
                },
                "candidates": [
                    {"sparse": {f: int(items.sparse[k, 13 + i]) for i, f in enumerate(ITEM_FEATURES)}}
                    for k in range(CANDIDATES)
                ],
            }
        )
    return out


def _unique_ids(req: dict[str, Any]) -> dict[str, np.ndarray]:
    ids = {f: np.array([v], np.uint64) for f, v in req["user"]["sparse"].items()}
    for f in ITEM_FEATURES:
        ids[f] = np.unique(np.array([c["sparse"][f] for c in req["candidates"]], np.uint64))
    return ids


def _config(redis_url: str, port: int, workdir: Path) -> KelpConfig:
    data = {
        "deployment": DEPLOYMENT,
        "source": {"kind": "file", "path": str(workdir / "unused.msgpack"), "format": "msgpack"},
        "features": criteo_feature_spec().model_dump(mode="json"),
        "store": {"backend": "redis", "urls": [redis_url]},
        "trainer": {"device": "cpu"},
        "publisher": {"interval_s": 1.0, "keep_versions": 3},
        "serving": {"host": "127.0.0.1", "port": port, "poll_interval_s": 5.0},
    }
    return KelpConfig.model_validate(data)


def _prefill(cfg: KelpConfig, requests: list[dict[str, Any]]) -> int:
    ids: dict[str, set[int]] = {}
    for req in requests:
        for table, arr in _unique_ids(req).items():
            ids.setdefault(table, set()).update(arr.tolist())
    rng = np.random.default_rng(1)
    with build_store(cfg.store, cfg.features.store_tables(), cfg.deployment) as store:
        updates = {}
        for table, s in ids.items():
            arr = np.array(sorted(s), np.uint64)
            updates[table] = (
                arr,
                rng.normal(0, 0.05, (len(arr), 16)).astype(np.float32),
                np.zeros(len(arr), np.float32),
            )
        store.push_many(updates)
    return sum(len(s) for s in ids.values())


JSON = "application/json"
MSGPACK = "application/msgpack"
PATH = "/v1/score/candidates"


def _encode_request(port: int, body: bytes, media_type: str) -> bytes:
    """One complete HTTP/1.1 request (head and body), built once and sent as it is every time."""
    accept = f"Accept: {media_type}\r\n" if media_type == MSGPACK else ""
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {media_type}\r\n"
        f"{accept}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Connection:
    """One keep-alive connection that speaks just the HTTP/1.1 this benchmark needs.

    ``http.client`` parses every response's headers with the ``email`` package
    and builds each request's head again; on a 2-core machine that client CPU
    competes with the replica it measures. Here a request is pre-encoded bytes
    and a response is read by its ``Content-Length`` (the replica always sends
    one). ``TCP_NODELAY``, so a request is never held back by Nagle's algorithm.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request``; ``(status, body)`` of the response."""
        self.sock.sendall(request)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._fill()
        head = bytes(self.buf[:end]).lower()
        del self.buf[: end + 4]
        start = head.find(b"\r\ncontent-length:")
        if start < 0:
            raise http.client.HTTPException(f"no content-length in {head[:200]!r}")
        line_end = head.find(b"\r\n", start + 2)
        length = int(head[start + 17 : line_end if line_end >= 0 else len(head)])
        while len(self.buf) < length:
            self._fill()
        body = bytes(self.buf[:length])
        del self.buf[:length]
        return int(head[9:12]), body

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def _parse_reply(status: int, data: bytes, media_type: str) -> dict[str, Any] | None:
    if status != 200:
        return None
    return msgpack.unpackb(data) if media_type == MSGPACK else orjson.loads(data)


def _columnar(request: dict[str, Any]) -> bytes:
    """The same request as msgpack with packed candidate columns (the compact form)."""
    cands = request["candidates"]
    columns = {f: np.array([c["sparse"][f] for c in cands], dtype="<u8").tobytes() for f in ITEM_FEATURES}
    return msgpack.packb(
        {"user": request["user"], "candidates": {"count": len(cands), "sparse": columns}}, use_bin_type=True
    )


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kelp serve exited with status {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("kelp serve did not become ready")


def _load(
    port: int,
    bodies: list[bytes],
    duration_s: float,
    *,
    on_tick: Any = None,
    clients: int = CONCURRENCY,
    media_type: str = JSON,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """Closed loop: ``clients`` threads, back-to-back requests until the deadline.

    A latency is one request from the first byte sent to the reply parsed
    (orjson or msgpack) at the client. ``client_cpu_ms`` is the client threads'
    own CPU per request (``time.thread_time``), what the load costs the machine;
    ``server_cpu_ms`` the replica process's (all its threads, from ``/proc``).
    """
    stop = time.monotonic() + duration_s
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    cpu = [0.0] * clients
    versions: set[int] = set()
    requests = [_encode_request(port, body, media_type) for body in bodies]

    def client(k: int) -> None:
        cpu0 = time.thread_time()
        conn = _Connection(port)
        i = k
        while time.monotonic() < stop:
            request = requests[i % len(requests)]
            i += clients
            t0 = time.perf_counter()
            try:
                out = _parse_reply(*conn.exchange(request), media_type)
            except (OSError, ValueError, http.client.HTTPException):
                errors[k] += 1
                conn.close()
                conn = _Connection(port)
                continue
            lat[k].append(time.perf_counter() - t0)
            if out is None or len(out["scores"]) != CANDIDATES:
                errors[k] += 1
            else:
                versions.add(out["model_version"])
        conn.close()
        cpu[k] = time.thread_time() - cpu0

    server_cpu0 = _cpu_seconds(server_pid)
    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    if on_tick is not None:
        on_tick(stop)
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    all_lat = np.array([x for per in lat for x in per]) * 1000
    n = max(int(all_lat.size), 1)
    server_cpu = _cpu_seconds(server_pid)
    return {
        "requests": int(all_lat.size),
        "errors": int(sum(errors)),
        "elapsed_s": elapsed,
        "p50_ms": float(np.percentile(all_lat, 50)) if all_lat.size else float("nan"),
        "p99_ms": float(np.percentile(all_lat, 99)) if all_lat.size else float("nan"),
        "versions": sorted(versions),
        "client_cpu_ms": sum(cpu) / n * 1000,
        "server_cpu_ms": (server_cpu - server_cpu0) / n * 1000
        if server_cpu is not None and server_cpu0 is not None
        else None,
    }


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds so far of process ``pid`` and its live children (uvicorn's workers),
    from Linux ``/proc``; None elsewhere."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for child in _children(pid):
        total += _cpu_seconds(child) or 0.0
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _start_serve(config: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    return subprocess.Popen(
        [sys.executable, "-m", "kelp.cli", "--log-level", "warning", "serve", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=sys.stderr,
    )


def _stop_serve(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _floor(cfg: KelpConfig, requests: list[dict[str, Any]], reps: int) -> float:
    """p50 ms of a raw read of a request's unique rows (frombuffer) + the bare forward, in-process.

    The raw read is the fastest plain way to the rows where the store keeps
    them: one ``MGET`` per table in the ``keys`` layout, one packed run of
    per-row ``HGET`` on the same buckets in the ``buckets`` layout (the
    default). Keys and commands are built before the clock starts.
    """
    client = redis.Redis.from_url(cfg.store.urls[0])
    buckets = cfg.store.row_layout == "buckets"
    layouts = {t.name: KeyLayout(cfg.deployment, t.name) for t in cfg.features.tables}
    hashes = {
        t.name: BucketLayout(cfg.deployment, t.name, cfg.store.layout.buckets_for(t.name))
        for t in cfg.features.tables
    }
    model = build_model(cfg.features, cfg.trainer).eval()
    prepared = []
    for req in requests:
        ids = _unique_ids(req)
        if buckets:
            reads: Any = [
                (
                    t,
                    len(a),
                    pack_commands(
                        ("HGET",), hashes[t].bucket_keys(hashes[t].bucket_of(a)), hashes[t].fields(a)
                    ),
                )
                for t, a in ids.items()
            ]
        else:
            reads = [(t, len(a), layouts[t].row_keys(a)) for t, a in ids.items()]
        dense = np.log1p(np.maximum(np.array([list(req["user"]["dense"].values())], np.float32), 0))
        inverse = {
            f: np.searchsorted(ids[f], np.array([c["sparse"][f] for c in req["candidates"]], np.uint64))
            for f in ITEM_FEATURES
        }
        prepared.append((reads, torch.from_numpy(np.repeat(dense, CANDIDATES, axis=0)), inverse))
    times = []
    for r in range(reps):
        reads, dense, inverse = prepared[r % len(prepared)]
        t0 = time.perf_counter()
        pipe = PackedPipeline(client)
        for _table, n, what in reads:
            if buckets:
                pipe.add_packed(what, n)
            else:
                pipe.execute_command("MGET", *what)
        replies = pipe.execute()
        pooled = {}  # the criteo spec names each table after its one feature
        for (table, _n, _what), values in zip(reads, replies, strict=True):
            rows = np.frombuffer(bytearray(b"".join(values)), dtype=np.float32).reshape(len(values), -1)[
                :, 4:
            ]
            t = torch.from_numpy(rows)
            pooled[table] = (
                t.expand(CANDIDATES, -1) if table in USER_FEATURES else t[torch.from_numpy(inverse[table])]
            )
        with torch.inference_mode():
            model(ModelInput(dense, pooled))
        times.append(time.perf_counter() - t0)
    client.close()
    return float(np.median(times) * 1000)


def run(quick: bool = False) -> dict[str, Any]:
    duration = 15.0 if quick else 60.0
    warmup = 2.0 if quick else 5.0
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="kelp-bench-serve-") as tmp, RedisServer() as redis_srv:
        workdir = Path(tmp)
        port = free_port()
        cfg = _config(redis_srv.url, port, workdir)
        config_path = workdir / "kelp.yaml"
        config_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
        progress(f"building {POOL} requests of {CANDIDATES} candidates (criteo-synth, synthetic)")
        requests = _requests(POOL)
        bodies = [json.dumps(r).encode() for r in requests]
        rows = _prefill(cfg, requests)
        progress(f"stored {rows} rows; publishing v1 and starting kelp serve on port {port}")
        publisher = build_publisher(cfg, CollectorRegistry())
        model = build_model(cfg.features, cfg.trainer)
        publisher.maybe_publish(model, step=0, offsets={}, force=True)
        proc = _start_serve(config_path)
        try:
            _wait_ready(port, proc)
            progress(f"warm-up {warmup:.0f} s")
            _load(port, bodies, warmup)

            def swapper(stop: float) -> None:
                every = duration / (SWAPS + 1)
                step = 0
                while time.monotonic() + every <= stop + 1e-3:
                    time.sleep(every)
                    step += 1
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn_like(p) * 0.01)
                    publisher.maybe_publish(model, step=step, offsets={}, force=True)
                    progress(f"published v{publisher.last_version}")

            progress(f"measuring {duration:.0f} s, concurrency {CONCURRENCY}, swapping {SWAPS} times")
            swaps_before = _swaps(port)
            result = _load(port, bodies, duration, on_tick=swapper, server_pid=proc.pid)
            swaps = _swaps(port) - swaps_before
            extra = duration / 2
            progress(f"measuring {extra:.0f} s, 8 clients (JSON)")
            eight = _load(port, bodies, extra, clients=8, server_pid=proc.pid)
            progress(f"measuring {extra:.0f} s, {CONCURRENCY} clients, msgpack bodies with packed columns")
            packed = _load(
                port, [_columnar(r) for r in requests], extra, media_type=MSGPACK, server_pid=proc.pid
            )

        finally:
            _stop_serve(proc)
        progress(f"measuring {extra:.0f} s, 8 clients (JSON), serving.workers: 2")
        two = cfg.model_copy(update={"serving": cfg.serving.model_copy(update={"workers": 2})})
        two_path = workdir / "kelp-2-workers.yaml"
        two_path.write_text(yaml.safe_dump(two.model_dump(mode="json", exclude_none=True)))
        proc = _start_serve(two_path)
        try:
            _wait_ready(port, proc)
            _load(port, bodies, warmup, clients=8)
            workers = _load(port, bodies, extra, clients=8, server_pid=proc.pid)
        finally:
            _stop_serve(proc)
            publisher.close()
        progress(f"measuring {extra:.0f} s, {CONCURRENCY} clients (JSON), local row cache {CACHE_TTL_MS} ms")
        cached_cfg = cfg.model_copy(
            update={"serving": cfg.serving.model_copy(update={"local_cache_ttl_ms": CACHE_TTL_MS})}
        )
        cached_path = workdir / "kelp-cached.yaml"
        cached_path.write_text(yaml.safe_dump(cached_cfg.model_dump(mode="json", exclude_none=True)))
        proc = _start_serve(cached_path)
        try:
            _wait_ready(port, proc)
            _load(port, bodies, warmup)
            lookups_before = _cache_lookups(port)
            cached = _load(port, bodies, extra, server_pid=proc.pid)
            (hits_after, misses_after), (hits_before, misses_before) = _cache_lookups(port), lookups_before
            hits, misses = hits_after - hits_before, misses_after - misses_before
        finally:
            _stop_serve(proc)
        progress("floor: raw MGET + bare forward, in-process")
        floor = _floor(cfg, requests, reps=200 if quick else 1000)
    rps = result["requests"] / result["elapsed_s"]
    progress(
        f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, {rps:.0f} req/s, floor {floor:.1f} ms"
    )
    return {
        "suite": "serve",
        "p50_ms": round(result["p50_ms"], 3),
        "p99_ms": round(result["p99_ms"], 3),
        "rps": round(rps, 1),
        "errors": result["errors"]
        + eight["errors"]
        + packed["errors"]
        + workers["errors"]
        + cached["errors"],
        "p50_ms_8_clients": round(eight["p50_ms"], 3),
        "p99_ms_8_clients": round(eight["p99_ms"], 3),
        "rps_8_clients": round(eight["requests"] / eight["elapsed_s"], 1),
        "p50_ms_msgpack": round(packed["p50_ms"], 3),
        "p99_ms_msgpack": round(packed["p99_ms"], 3),
        "cpu_ms_per_request": _rounded(result["server_cpu_ms"]),
        "p50_ms_8_clients_2_workers": round(workers["p50_ms"], 3),
        "p99_ms_8_clients_2_workers": round(workers["p99_ms"], 3),
        "rps_8_clients_2_workers": round(workers["requests"] / workers["elapsed_s"], 1),
        "cpu_ms_per_request_2_workers": _rounded(workers["server_cpu_ms"]),
        "server_cpu_ms_per_request_msgpack": _rounded(packed["server_cpu_ms"]),
        "cpu_ms_per_request_cached": _rounded(cached["server_cpu_ms"]),
        "p50_ms_cached": round(cached["p50_ms"], 3),
        "p99_ms_cached": round(cached["p99_ms"], 3),
        "rps_cached": round(cached["requests"] / cached["elapsed_s"], 1),
        "cache_ttl_ms": CACHE_TTL_MS,
        "cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
        "client_cpu_ms_per_request": _rounded(result["client_cpu_ms"]),
        "swaps": int(swaps),
        "floor_p50_ms": round(floor, 3),
        "p50_over_floor": round(result["p50_ms"] / floor, 2),
        "requests": result["requests"],
        "concurrency": CONCURRENCY,
        "candidates_per_request": CANDIDATES,
        "duration_s": duration,
        "versions_seen": result["versions"],
        "workload": "criteo-synth (synthetic), user C1..C13 + I1..I13, 100 candidates C14..C26",
        "server": (
            "kelp serve, 1 uvicorn worker, torch 1 thread, gc frozen after start, local cache off "
            f"(on, {CACHE_TTL_MS} ms, in the *_cached run)"
        ),
    }


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _cache_lookups(port: int) -> tuple[float, float]:
    """The replica's row-cache lookups so far: (hits, misses)."""
    text = _metrics_text(port)
    found = dict(
        re.findall(r'^kelp_serving_row_cache_lookups_total\{result="(\w+)"\} ([0-9.e+]+)$', text, re.M)
    )
    return float(found.get("hit", 0.0)), float(found.get("miss", 0.0))


def _metrics_text(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    return conn.getresponse().read().decode()


def _swaps(port: int) -> float:
    text = _metrics_text(port)
    m = re.search(r"^kelp_serving_swaps_total ([0-9.e+]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0
