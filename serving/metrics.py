"""The serving replica's Prometheus metrics (subsystem ``serving``), one registry per replica.

=================================================  ==================================================
``kelp_serving_request_seconds``                   histogram: request latency, by endpoint
``kelp_serving_requests_total``                    requests answered, by endpoint and status code
``kelp_serving_inflight_requests``                 gauge: requests being handled now
``kelp_serving_model_version``                     gauge: version of the model being served
``kelp_serving_model_created_timestamp_seconds``   gauge: creation time of that model (publish side)
``kelp_serving_model_age_seconds``                 gauge: seconds since that model was created (at scrape)
``kelp_serving_swaps_total``                       hot swaps to a new model version
``kelp_serving_snapshots_rejected_total``          snapshots refused, by reason (checksum, nonfinite, ...)
``kelp_serving_nonfinite_scores_total``            scores that came out NaN or infinite (answered 422)
``kelp_serving_store_fetch_seconds``               histogram: one batched embedding fetch from the store
``kelp_serving_rows_total``                        embedding rows used, by result (stored, default)
``kelp_serving_embedding_age_seconds``             histogram: age of the stored rows a request used
``kelp_serving_ready``                             gauge: 1 while /readyz answers 200
``kelp_serving_request_log_records_total``         request log records: sent, dropped, failed, synthetic
``kelp_serving_request_log_dropped_total``         request log records dropped, by the full bound (reason)
``kelp_serving_request_log_queue``                 gauge: request log records not yet acknowledged by Kafka
``kelp_serving_request_log_queue_bytes``           gauge: bytes of those records
=================================================  ==================================================

The default-row rate is ``rate(kelp_serving_rows_total{result="default"}[5m])
/ rate(kelp_serving_rows_total[5m])``.

Under several workers (``serving.workers``) the metrics meet in
prometheus-client's multiprocess directory, one file per process and kind.
A worker that is killed (``kill -9``, the OOM killer, a failed health ping)
never removes its files, so its in-flight count and readiness would stay in
every scrape. :func:`reap_dead_workers`, run by every worker at start and
then every second, folds a dead process's counters and histograms into one
``*_dead.db`` file per kind (totals never go back) and deletes all its files.
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import mark_process_dead

from kelp.metrics import MetricFactory

__all__ = ["EMBEDDING_AGE_BUCKETS_S", "ServingMetrics", "reap_dead_workers"]

# prometheus-client's file names: <kind>_<pid>.db, gauge_<mode>_<pid>.db.
_PROCESS_FILE = re.compile(r"^(?P<kind>[a-z]+)_(?:(?P<mode>[a-z]+)_)?(?P<pid>\d+)\.db$")
_LOCK_FILE = "kelp-reap.lock"  # not *.db: prometheus-client reads every *.db file in the directory
_DEAD = "dead"  # <kind>_dead.db: the summed counts of processes that are gone

# Row ages run from sub-second (a row the trainer just pushed) to hours (a cold row).
EMBEDDING_AGE_BUCKETS_S: tuple[float, ...] = (0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 21_600, 86_400)


class ServingMetrics:
    """Every serving metric in one registry (one instance per replica process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = MetricFactory("serving", registry)
        self.registry = m.registry
        self.request_seconds = m.histogram("request_seconds", "Request latency.", ["endpoint"])
        self.requests = m.counter("requests", "Requests answered.", ["endpoint", "status"])
        # Under several workers (multiprocess mode) each gauge says how the workers' values combine.
        self.inflight = m.gauge(
            "inflight_requests", "Requests being handled now.", multiprocess_mode="livesum"
        )
        self.model_version = m.gauge(
            "model_version", "Version of the model being served.", multiprocess_mode="livemax"
        )
        self.model_created = m.gauge(
            "model_created_timestamp",
            "Creation time of the served model.",
            unit="seconds",
            multiprocess_mode="livemax",
        )
        self.model_age = m.function_gauge(
            "model_age", "Seconds since the served model was created.", unit="seconds"
        )
        self.model_age.set_function(self._model_age)
        self.swaps = m.counter("swaps", "Hot swaps to a new model version.")
        self.snapshots_rejected = m.counter("snapshots_rejected", "Snapshots refused.", ["reason"])
        self.nonfinite_scores = m.counter(
            "nonfinite_scores", "Scores that came out NaN or infinite; their request answered 422."
        )
        self.model_errors = m.counter(
            "model_errors", "Requests the served model raised on (or answered off-contract); answered 500."
        )
        self.store_fetch_seconds = m.histogram("store_fetch_seconds", "One batched embedding fetch.")
        self.rows = m.counter("rows", "Embedding rows used by requests.", ["result"])
        self.row_cache = m.counter(
            "row_cache_lookups",
            "Rows looked up in the local row cache (serving.local_cache_ttl_ms), by result: hit or miss "
            "(read from the store).",
            ["result"],
        )
        self.embedding_age = m.histogram(
            "embedding_age_seconds",
            "Age of the stored rows a request used (now - last update).",
            buckets=EMBEDDING_AGE_BUCKETS_S,
        )
        self.ready = m.gauge(
            "ready", "1 while the replica is ready (/readyz answers 200).", multiprocess_mode="livemin"
        )
        self.request_log_records = m.counter(
            "request_log_records",
            "Scored requests for the request log, by result (sent, dropped: queue full, failed, "
            "synthetic: marked X-Kelp-Synthetic, never logged).",
            ["result"],
        )
        self.request_log_dropped = m.counter(
            "request_log_dropped",
            "Request log records dropped because its queue was full, by the bound that was: queue_requests "
            "(serving.request_log.queue_requests) or queue_bytes (serving.request_log.queue_bytes).",
            ["reason"],
        )
        self.request_log_queue = m.function_gauge(
            "request_log_queue",
            "Request log records held: queued, or sent and not yet acknowledged by Kafka (this process's).",
        )
        self.request_log_queue_bytes = m.function_gauge(
            "request_log_queue_bytes",
            "Bytes of the request log records held (this process's): at most "
            "serving.request_log.queue_bytes.",
            unit="bytes",
        )
        self.local = (self.model_age, self.request_log_queue, self.request_log_queue_bytes)
        """The gauges computed at scrape time: what this process adds to a multiprocess scrape."""
        self._created_at: float | None = None

    def model_loaded(self, version: int, created_at: float) -> None:
        self._created_at = created_at
        self.model_version.set(version)
        self.model_created.set(created_at)

    def _model_age(self) -> float:
        return float("nan") if self._created_at is None else time.time() - self._created_at


def reap_dead_workers(directory: str) -> list[int]:
    """Remove the metric files of the processes in ``directory`` that are no longer alive; their pids.

    Counters and histograms of a dead process are added into ``<kind>_dead.db`` first, so a total
    never drops; gauges (in flight, ready, model version) are simply gone, as the process is.
    Several workers may call this at once: a file lock makes one of them do the work.
    """
    dead = sorted({pid for pid in _pids_with_files(directory) if not _alive(pid)})
    if not dead:
        return []
    with _locked(directory):
        for pid in dead:
            _fold_into_dead(directory, pid)
            mark_process_dead(pid, directory)  # the live gauges, as a graceful exit removes them
            for path in glob.glob(os.path.join(directory, f"*_{pid}.db")):
                _remove(path)
    return dead


def _pids_with_files(directory: str) -> set[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return set()
    return {int(m["pid"]) for m in map(_PROCESS_FILE.match, names) if m is not None}


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (ours: this process is never reaped)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds that pid: not ours to judge
        return True
    return True


@contextmanager
def _locked(directory: str) -> Iterator[None]:
    with open(os.path.join(directory, _LOCK_FILE), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fold_into_dead(directory: str, pid: int) -> None:
    """Add ``pid``'s counters and histogram buckets into ``<kind>_dead.db``, swapped in whole."""
    for kind in ("counter", "histogram", "summary"):
        source = os.path.join(directory, f"{kind}_{pid}.db")
        if not os.path.exists(source):
            continue
        target = os.path.join(directory, f"{kind}_{_DEAD}.db")
        totals: dict[str, float] = {}
        for path in (target, source):
            if os.path.exists(path):
                for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(path):
                    totals[key] = totals.get(key, 0.0) + value
        staged = target + ".tmp"  # not *.db until it is complete: a scrape never reads half of it
        _remove(staged)
        merged = MmapedDict(staged)
        try:
            for key, value in totals.items():
                merged.write_value(key, value, 0.0)
        finally:
            merged.close()
        os.replace(staged, target)
        _remove(source)


def _remove(path: str) -> None:
    with suppress(FileNotFoundError):
        os.remove(path)
