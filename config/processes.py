"""The processes' own slices: snapshot publishing, the serving replica, metrics/health HTTP, logging."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, field_validator, model_validator

from kelp.config.base import StrictModel, url_with_plain_userinfo

__all__ = ["LoggingConfig", "MetricsConfig", "PublisherConfig", "ServingConfig"]


class PublisherConfig(StrictModel):
    enabled: bool = Field(True, description="Publish dense snapshots for serving (off: a trainer only).")
    channel: Literal["redis", "filesystem"] = "redis"
    interval_s: float = Field(5.0, gt=0, description="Seconds between dense snapshots.")
    keep_versions: int = Field(5, ge=1, description="Older snapshots are deleted.")
    redis_url: str | None = Field(None, description="Defaults to the store's first url.")
    path: Path | None = Field(None, description="Directory for channel=filesystem.")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        return None if value is None else url_with_plain_userinfo(value, "url")

    @model_validator(mode="after")
    def _path(self) -> Self:
        if self.channel == "filesystem" and self.path is None:
            raise ValueError("channel 'filesystem' needs path")
        return self


class RequestLogConfig(StrictModel):
    """``serving.request_log``: what each replica scored, to a Kafka topic (the input of a join)."""

    enabled: bool = Field(
        False,
        description="Send each scored request (its id, the model version, the features as scored, every "
        "score, a timestamp) to `topic` on the source's Kafka brokers, batched and off the request path. "
        "Off: the replica needs no Kafka settings or secrets.",
    )
    topic: str = Field("kelp-requests", min_length=1, description="The topic the records go to.")
    queue_requests: int = Field(
        10_000,
        ge=1,
        description="Records not yet acknowledged by Kafka (queued, or in the producer's batches); past it "
        "(Kafka slow or down) new ones are dropped and "
        'counted in kelp_serving_request_log_records_total{result="dropped"}, never waited for.',
    )
    queue_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024 * 1024,
        description="Bytes of encoded records not yet acknowledged by Kafka (queued, or in the producer's "
        "batches): the memory the request log may hold while Kafka is slow or down. Past it new records "
        "are dropped and counted like queue_requests "
        '(kelp_serving_request_log_dropped_total{reason="queue_bytes"}). A record holds every candidate\'s '
        "ids, the user's repeated for each (docs/serving.md sizes it). Hazard: the pod's memory limit must "
        "have room for it.",
    )
    linger_ms: int = Field(
        20, ge=0, le=10_000, description="kafka-python's linger: how long a batch may wait."
    )


class ServingConfig(StrictModel):
    host: str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65_535)
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65_535,
        description="Also serve the Open Inference Protocol over gRPC (inference.GRPCInferenceService) on "
        "this port, beside HTTP; None (default): HTTP only. Needs `pip install 'kelp[grpc]'`.",
    )
    workers: int = Field(1, ge=1, le=64)
    worker_healthcheck_timeout_s: int = Field(
        30,
        ge=1,
        le=600,
        description="With workers > 1: how long a worker may take to answer the supervisor's health ping "
        "before it is killed and replaced (uvicorn's timeout_worker_healthcheck, 5 s by default there). A "
        "starting worker imports torch and loads the model, which holds the interpreter for seconds on a "
        "busy machine. Hazard: a hung worker is replaced only this long after it stops answering.",
    )
    model_version: Literal["latest"] | Annotated[int, Field(ge=1)] = Field(
        "latest",
        description="`latest`: serve what the snapshot channel names (the newest version, or the one "
        "`kelp model pin`/`rollback` pinned for every replica). A number: this replica serves that version "
        "only, whatever the channel says (it must still be stored: keep publisher.keep_versions in mind).",
    )
    max_samples_per_request: int = Field(1024, ge=1)
    max_ids_per_feature: int = Field(256, ge=1)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_vector_values: int = Field(
        262_144,
        ge=1,
        description="Floats in one /v1/embeddings answer (ids x dim for stored rows; samples x d summed "
        "over the encode hook's outputs); more: 413 answer_too_large, checked before the answer is built. "
        "Bounds the answer's size and the scoring thread's time on it (about 12 bytes of JSON a float).",
    )
    local_cache_ttl_ms: int = Field(
        0, ge=0, description="Serving-side row cache; 0 = off. Hazard: rows can be this much staler."
    )
    poll_interval_s: float = Field(5.0, gt=0, description="Fallback poll for new model versions.")
    startup_timeout_s: float = Field(
        10.0,
        gt=0,
        description="At start-up, the store and the snapshot channel's Redis must answer within this long, "
        "else `kelp serve` exits with one line naming the endpoint (after start-up, an outage only "
        "makes /readyz answer 503).",
    )
    body_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's body (any route that reads one: /v1, /v2, /v1/embeddings) must arrive "
        "within this many seconds of its headers, else 408 and the connection closed (a slow-body client "
        "holds one connection, never a scoring thread).",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Bytes of one request's head (request line and headers); over it: 431 and the "
        "connection closed, before the rest is read. Hazard: a proxy that adds long headers "
        "(forwarding chains, cookies) needs room here.",
    )
    max_headers: int = Field(
        100, ge=1, description="Header lines of one request; more: 431 and the connection closed."
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's head must be complete this many seconds after it began (after the "
        "connection opened, for the first request), else 408 and the connection closed; a connection "
        "that sends nothing is closed then. Hazard: a client on a very slow link needs more.",
    )
    request_log: RequestLogConfig = Field(default_factory=RequestLogConfig)
    auth_token_file: Path | None = Field(
        None,
        description="File holding a bearer token the score endpoints require (Authorization: Bearer "
        "<token>); None (default): no auth. /healthz, /readyz and /metrics stay open. Read once at start, "
        "so the token never appears in the config; mount it from a Secret.",
    )


class MetricsConfig(StrictModel):
    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = Field(9400, ge=1, le=65_535, description="/metrics, /healthz and /readyz of the trainer.")


class LoggingConfig(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
