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
``kelp_serving_request_log_records_total``         request log records, by result (sent, dropped, failed)
``kelp_serving_request_log_queue``                 gauge: scored requests waiting for the request log
=================================================  ==================================================

The default-row rate is ``rate(kelp_serving_rows_total{result="default"}[5m])
/ rate(kelp_serving_rows_total[5m])``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from kelp.metrics import MetricFactory

__all__ = ["EMBEDDING_AGE_BUCKETS_S", "ServingMetrics"]

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
            "Scored requests for the request log, by result (sent, dropped: queue full, failed).",
            ["result"],
        )
        self.request_log_queue = m.function_gauge(
            "request_log_queue", "Scored requests waiting for the request log (this process's)."
        )
        self.local = (self.model_age, self.request_log_queue)
        """The gauges computed at scrape time: what this process adds to a multiprocess scrape."""
        self._created_at: float | None = None

    def model_loaded(self, version: int, created_at: float) -> None:
        self._created_at = created_at
        self.model_version.set(version)
        self.model_created.set(created_at)

    def _model_age(self) -> float:
        return float("nan") if self._created_at is None else time.time() - self._created_at
