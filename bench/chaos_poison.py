"""The chaos bench's poisoned-row fault, and the auditor of every snapshot the trainer publishes.

``poisoned_rows`` writes, as a foreign client would (plain ``HSET`` on the
store's Redis), two kinds of bad row for ids both processes read:

* a row with a valid header and NaN floats (a bug or a bad restore);
* a value of the wrong length (another program's data in Kelp's hash).

The ids are those of the scoring client's request, so the replica reads every
one of them many times a second, and the hottest ids of a criteo-synth draw, so
the trainer (or its next incarnation, whose hot tier starts empty) reads them
too. Kelp must quarantine both kinds: no crash loop, no non-finite score, and
no non-finite tensor in a published snapshot.

:class:`SnapshotAuditor` reads each new ``latest`` of the snapshot channel
straight from the channel (not through a replica, which refuses a bad
snapshot and so would hide one) and counts the versions holding a non-finite
tensor: the ``nonfinite_published`` invariant.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import Any

import numpy as np

from kelp.bench.chaos_procs import total
from kelp.bench.chaos_rig import Rig
from kelp.bench.synth import CriteoSynth
from kelp.config import KelpConfig
from kelp.consumers.criteo import SPARSE_NAMES
from kelp.store.redis.keys import BucketLayout
from kelp.store.rows.codec import HEADER_BYTES, RowCodec

__all__ = ["SnapshotAuditor", "poison_targets", "poisoned_rows"]

log = logging.getLogger(__name__)

POISON_WAIT_S = 4.0
"""How long the fault lets both processes read the poisoned rows before its recovery check."""


class SnapshotAuditor(threading.Thread):
    """Checks every version ``latest`` points at, once, for non-finite tensors (see the module docstring)."""

    def __init__(self, cfg: KelpConfig, interval_s: float = 0.5) -> None:
        super().__init__(name="chaos-snapshot-auditor", daemon=True)
        self.cfg = cfg
        self.interval_s = interval_s
        self.audited: set[int] = set()
        self.nonfinite: dict[int, str] = {}
        """Version -> the first tensor holding a non-finite value."""
        self.failed_reads = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        from kelp.publish.publisher import build_channel

        channel = build_channel(self.cfg.publisher, self.cfg.store, self.cfg.deployment)
        try:
            while not self._halt.wait(self.interval_s):
                self._audit_latest(channel)
            self._audit_all(channel)
        finally:
            channel.close()

    def _audit_latest(self, channel: Any) -> None:
        try:
            latest = channel.latest_version()
        except Exception:  # the fault of the moment (Redis away); the next poll reads it
            self.failed_reads += 1
            return
        if latest is not None and latest not in self.audited:
            self._audit(channel, latest)

    def _audit_all(self, channel: Any) -> None:
        """At the end: every version still stored, in case one was published and replaced between polls."""
        try:
            versions = channel.versions()
        except Exception:
            self.failed_reads += 1
            return
        for v in versions:
            if v not in self.audited:
                self._audit(channel, v)

    def _audit(self, channel: Any, version: int) -> None:
        from safetensors.torch import load as st_load

        try:
            _manifest, weights = channel.read_raw(version)
            tensors = st_load(weights)
        except Exception:  # pruned between the read of latest and this one, or Redis away
            self.failed_reads += 1
            return
        with self._lock:
            self.audited.add(version)
            for name, tensor in tensors.items():
                if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
                    self.nonfinite[version] = name
                    log.error("snapshot v%d holds a non-finite tensor: %s", version, name)
                    break

    def finish(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Stop polling, audit what is still stored; the figures for the report."""
        self._halt.set()
        self.join(timeout_s)
        with self._lock:
            return {
                "nonfinite_published": len(self.nonfinite),
                "snapshots_audited": len(self.audited),
                "snapshot_audit_failed_reads": self.failed_reads,
                "nonfinite_snapshot_details": {str(v): n for v, n in sorted(self.nonfinite.items())[:10]},
            }


def poison_targets(request_body: bytes, hot_draw: int = 2048, seed: int = 11) -> dict[str, list[int]]:
    """``{feature: ids}`` to poison: the scoring request's ids, and each feature's commonest id in a draw."""
    body = json.loads(request_body)
    targets: dict[str, set[int]] = {}
    for name, raw in body["user"]["sparse"].items():
        targets.setdefault(name, set()).add(int(raw))
    for candidate in body["candidates"][:3]:
        for name, raw in candidate["sparse"].items():
            targets.setdefault(name, set()).add(int(raw))
    draw = CriteoSynth(seed=seed).batch(hot_draw)
    for i, name in enumerate(SPARSE_NAMES):
        values, counts = np.unique(draw.sparse[:, i], return_counts=True)
        targets.setdefault(name, set()).add(int(values[np.argmax(counts)]))
    return {name: sorted(ids) for name, ids in targets.items()}


def _bad_values(good: bytes | None, nbytes: int, wrong_length: bool) -> tuple[str, bytes]:
    """One bad value: a wrong length, or NaN floats behind a valid header (``good``'s; b"" for none)."""
    if wrong_length:
        return "wrong_length", (good or b"\x01\x00") + b"\x00\x07\x00"
    header = good[:HEADER_BYTES] if good is not None and len(good) == nbytes else None
    if header is None:
        return "nonfinite", b""  # no valid header to keep: let the caller make one
    return "nonfinite", header + b"\xff" * (nbytes - HEADER_BYTES)  # all ones: NaN in float32 and float16


def poisoned_rows(rig: Rig, health: Any, rng: random.Random) -> dict[str, Any]:
    """``HSET`` a NaN row or a wrong-length value over each target id; what each process made of them."""
    from kelp.bench.chaos_load import score_request

    cfg = rig.cfg
    client = rig.redis.client()
    trainer_before = total(rig.trainer.metrics(), "kelp_store_rows_quarantined_total")
    serve_before = total(rig.serve.metrics(), "kelp_store_rows_quarantined_total")
    written = {"nonfinite": 0, "wrong_length": 0}
    poisoned: list[tuple[bytes, bytes, RowCodec]] = []
    try:
        tables = {f.name: f.table_name for f in cfg.features.sparse}
        for feature, ids in poison_targets(score_request()).items():
            table = tables[feature]
            spec = next(t for t in cfg.features.tables if t.name == table)
            codec = RowCodec(spec.dim, spec.dtype)
            layout = BucketLayout(cfg.deployment, table, cfg.store.layout.buckets_for(table))
            arr = np.asarray(ids, dtype=np.uint64)
            keys = layout.bucket_keys(layout.bucket_of(arr)).tolist()
            fields = BucketLayout.fields(arr).tolist()
            for key, field in zip(keys, fields, strict=True):
                good = client.hget(key, field)
                kind, value = _bad_values(good, codec.nbytes, wrong_length=len(poisoned) % 2 == 1)
                if not value:
                    nan = np.full((1, spec.dim), np.nan, dtype=np.float32)
                    value = codec.encode(nan, np.zeros(1, np.float32), count=1)[0]
                client.hset(key, field, value)
                written[kind] += 1
                poisoned.append((key, field, codec))
        time.sleep(POISON_WAIT_S)
        still_bad = sum(1 for key, field, codec in poisoned if _is_bad(client.hget(key, field), codec))
    finally:
        client.close()
    return {
        "rows_poisoned": written,
        "trainer_quarantined": total(rig.trainer.metrics(), "kelp_store_rows_quarantined_total")
        - trainer_before,
        "serve_quarantined": total(rig.serve.metrics(), "kelp_store_rows_quarantined_total") - serve_before,
        "poisoned_rows_left_after_s": {"s": POISON_WAIT_S, "rows": still_bad},
    }


def _is_bad(value: bytes | None, codec: RowCodec) -> bool:
    """Still poisoned: a present value that is not a row of the table, or holds a non-finite float."""
    if value is None:
        return False
    if len(value) != codec.nbytes:
        return True
    rec = np.frombuffer(value, dtype=codec.record)
    return not bool(np.isfinite(rec["emb"]).all() and np.isfinite(rec["state"]).all())
