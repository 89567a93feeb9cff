"""The joiner's Prometheus metrics (subsystem ``join``), in its own registry.

===============================================  ====================================================
``kelp_join_impressions_total``                  impressions read, by result (new, duplicate)
``kelp_join_actions_total``                      actions read, by task and result: matched, early
                                                 (matched after waiting for its impression), waiting,
                                                 repeat, late, outside_window, no_candidate, orphan
``kelp_join_samples_total``                      labelled samples emitted, by task and label
                                                 (positive, negative); late corrections are not in it
``kelp_join_late_corrections_total``             samples emitted again as a positive (late actions)
``kelp_join_negatives_dropped_total``            negatives left out by negative_keep_rate
``kelp_join_rejected_total``                     input records that could not be read, by input, reason
                                                 (also future_ts, bad_request_id, and output_too_large /
                                                 output_refused for an output Kafka refused for good)
``kelp_join_state_corrupt_total``                stored values dropped as unreadable, by kind
                                                 (impression, early_actions, watermark)
``kelp_join_send_failures_total``                steps whose sends Kafka refused (retried)
``kelp_join_commit_failures_total``              steps whose offsets were not committed (read again)
``kelp_join_waiting_impressions``                gauge: impressions in the waiting store
``kelp_join_waiting_bytes``                      gauge: their packed bytes in the store
``kelp_join_early_actions``                      gauge: requests with actions waiting for the impression
``kelp_join_watermark_seconds``                  gauge: the watermark (event time, unix seconds)
``kelp_join_watermark_lag_seconds``              gauge: wall clock minus the watermark
``kelp_join_label_delay_seconds``                histogram: from when a label could be known (the
                                                 action, or the window's close) to Kafka's ack, by kind
``kelp_join_step_seconds``                       histogram: one step, reads to commit
===============================================  ====================================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kelp.metrics import MetricFactory

__all__ = ["JoinMetrics"]

_DELAY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400)


class JoinMetrics:
    """Every joiner metric in one registry (one instance per joiner)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = MetricFactory("join", registry if registry is not None else CollectorRegistry())
        self.registry = m.registry
        self.impressions = m.counter("impressions", "Impressions read, by result.", ["result"])
        self.actions = m.counter("actions", "Actions read, by task and result.", ["task", "result"])
        self.samples = m.counter("samples", "Labelled samples emitted, by task and label.", ["task", "label"])
        self.late_corrections = m.counter(
            "late_corrections", "Samples emitted again as a positive after a late action."
        )
        self.negatives_dropped = m.counter("negatives_dropped", "Negatives left out by negative_keep_rate.")
        self.rejected = m.counter("rejected", "Input records that could not be read.", ["input", "reason"])
        self.state_corrupt = m.counter(
            "state_corrupt", "Stored join state that did not read back, dropped (by kind).", ["kind"]
        )
        self.send_failures = m.counter("send_failures", "Steps whose sends Kafka refused (then retried).")
        self.commit_failures = m.counter(
            "commit_failures", "Steps whose input offsets were not committed (their records are read again)."
        )
        self.waiting = m.gauge("waiting_impressions", "Impressions in the waiting store.")
        self.waiting_bytes = m.gauge("waiting", "Packed bytes of the waiting impressions.", unit="bytes")
        self.early = m.gauge("early_actions", "Requests with actions waiting for their impression.")
        self.watermark = m.gauge("watermark", "The watermark (event time).", unit="seconds")
        self.watermark_lag = m.gauge("watermark_lag", "Wall clock minus the watermark.", unit="seconds")
        self.label_delay = m.histogram(
            "label_delay",
            "From when a label could be known to Kafka's acknowledgement of its event.",
            ["kind"],
            buckets=_DELAY_BUCKETS_S,
        )
        self.step_seconds = m.histogram("step", "One step of the joiner, reads to commit.")
