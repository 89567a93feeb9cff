"""Row snapshots: where a deployment's point-in-time row copies are kept, how often a trainer takes one."""

from __future__ import annotations

from typing import Self

from pydantic import Field, field_validator, model_validator

from kelp.config.base import StrictModel

__all__ = ["RowSnapshotsConfig", "SnapshotsConfig"]


class RowSnapshotsConfig(StrictModel):
    """Snapshots of every row (embedding, optimizer state, eviction metadata) of the deployment."""

    url: str | None = Field(
        None,
        description="Where snapshots are kept: a directory path (or file://...) or s3://bucket/prefix. "
        "None: no snapshots (kelp store snapshot then needs --to).",
    )
    s3_endpoint: str | None = Field(
        None,
        description="S3-compatible endpoint for an s3:// url (MinIO, Ceph, s3proxy...); None: boto3's "
        "usual resolution (AWS_ENDPOINT_URL, then AWS). Credentials come from boto3's usual chain.",
    )
    every_s: float | None = Field(
        None,
        gt=0,
        description="A trainer (rank 0 of a group) takes a snapshot this often, at a flush barrier, "
        "while training goes on. None: only `kelp store snapshot` takes them.",
    )
    full_every: int = Field(
        6,
        ge=1,
        description="Of the trainer's scheduled snapshots, every full_every-th is full and the others "
        "are incremental (only rows updated since the previous one). 1: always full.",
    )
    max_rows_per_s: float | None = Field(
        None,
        gt=0,
        description="Rows a snapshot reads per second at most, all shards together. The scan shares "
        "Redis and the machine with training; a slower snapshot takes less of them at a time. "
        "None: as fast as Redis answers (see docs/benchmarks.md, the snapshot suite).",
    )
    keep: int = Field(
        7, ge=1, description="Full snapshots kept (with their incrementals); older ones are deleted."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("expected a directory, file://... or s3://bucket/prefix, not an empty string")
        if v is not None and v.startswith("s3://") and len(v) <= len("s3://"):
            raise ValueError("s3:// needs a bucket: s3://bucket/prefix")
        return v

    @model_validator(mode="after")
    def _schedule_needs_url(self) -> Self:
        if self.every_s is not None and self.url is None:
            raise ValueError("every_s is set but url is not: name where the snapshots go")
        return self


class SnapshotsConfig(StrictModel):
    """Point-in-time copies a deployment keeps (the dense model's versions are the publisher's)."""

    rows: RowSnapshotsConfig = Field(default_factory=RowSnapshotsConfig)
