"""The embedding store's slice: backend, Redis endpoints and credentials, retries, the hot-row cache.

Read by :func:`kelp.store.build_store` (and by the Redis snapshot channel for
its default endpoint). What a backend can enforce (for example ``max_rows``) is
checked against this slice by the store itself, at load time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from kelp.config.base import StrictModel, split_csv, url_with_plain_userinfo
from kelp.redaction import redact_url

__all__ = ["DurabilitySpec", "HotCacheConfig", "RedisTls", "RetrySpec", "RowLayoutSpec", "StoreConfig"]


class RetrySpec(StrictModel):
    attempts: int = Field(5, ge=1, le=100, description="Tries per operation, the first included.")
    base_delay_s: float = Field(0.05, ge=0)
    max_delay_s: float = Field(2.0, ge=0)


class RedisTls(StrictModel):
    enabled: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    check_hostname: bool = True


class DurabilitySpec(StrictModel):
    """What a push must reach before its ticket counts as durable (and its Kafka offsets may commit).

    Redis acknowledges a write once the primary has it; a failover to a
    replica that had not received it yet loses it. With ``replicas_ack`` n > 0,
    every shard's pipelined push ends with ``WAIT n replicas_ack_timeout_ms`` on
    the same connection: fewer than n replicas confirming within the timeout
    fails the push as an unreachable shard does (retried; never acknowledged),
    so an acknowledged update survives the loss of its primary. See
    docs/store.md, No loss across failover.
    """

    replicas_ack: int = Field(
        0,
        ge=0,
        le=16,
        description="Replicas of each written shard that must confirm a push (Redis WAIT) before it is "
        "acknowledged as durable; 0: the primary's reply is enough (a failover may lose the last "
        "updates). Needs at least this many replicas per primary, and one more to keep accepting pushes "
        "while one is down.",
    )
    replicas_ack_timeout_ms: int = Field(
        500,
        ge=1,
        le=600_000,
        description="How long a push waits for replicas_ack confirmations (WAIT's timeout) before it "
        "fails and is retried; must be below store.socket_timeout_s.",
    )


class HotCacheConfig(StrictModel):
    """The hot tier (FAE): the trainer's working copy of its most used rows, written back on a schedule.

    Hazard: a row updated in the tier reaches the store (and serving replicas)
    up to ``writeback_every_steps`` pushes or ``writeback_interval_s`` later, and
    Kafka offsets are committed only after that write-back, so a crash replays
    at most that much. See kelp.store.hot.tier and docs/store.md.
    """

    enabled: bool | Literal["auto"] = Field(
        "auto",
        description="auto: on for trainers (one, or a group, where each rank writes only the rows it "
        "owns) on a Redis backend with sparse_updates overwrite; off for the memory backend (it is "
        "local already), for compose (updates are applied in Redis) and outside training.",
    )
    capacity_rows: int = Field(
        1_000_000,
        ge=1,
        description="Rows the tier keeps across all tables (about 100 bytes each at dim 16, plus 1/8 "
        "slack between trims); the most frequent rows by a count-min sketch stay.",
    )
    min_count: int = Field(
        2,
        ge=1,
        description="In a trainer group (row owners), a fetched row enters the tier only once its id was "
        "seen this often (count-min estimate of its occurrences): ids seen once stay write-through. A single "
        "trainer's working copy takes every admitted row it trains (its update has nowhere else to go) and "
        "trims the least frequent first.",
    )
    writeback_every_steps: int = Field(
        20, ge=1, description="Write dirty rows back after this many pushes (staleness bound in steps)."
    )
    writeback_interval_s: float = Field(
        2.0, gt=0, description="... or after this many seconds, whichever comes first (bound in time)."
    )
    max_staleness_s: float = Field(
        10.0,
        gt=0,
        description="A clean row read from the store longer ago than this is re-read before use, so other "
        "writers' updates (other trainers, deletes, TTL expiry) are seen at most this late.",
    )


class RowLayoutSpec(StrictModel):
    """How rows sit in Redis: one key per row, or many rows per hash (see docs/store.md).

    ``auto`` (the default): ``buckets`` on ``backend: redis``, ``keys`` where
    buckets do not apply (Redis Cluster, ``sparse_updates: compose``).
    ``keys``: one string key per row; fastest reads; Redis's own per-key memory
    comes on top of every row, and more with a TTL (each key also sits in the
    expires table).
    ``buckets``: rows are fields of ``buckets_per_table`` hashes per table, kept
    in Redis's compact listpack encoding: little more than the row value per row,
    with or without a TTL, because a TTL is enforced from each row's update time (rows
    past it read as absent; a sweeper driven by the trainer's pushes deletes
    them) instead of a per-key expiry. Reads cost Redis more CPU (one HGET per
    row instead of one MGET per 2,048 rows). Hazard: ``buckets_per_table``
    fixes where every row lives; changing it makes stored rows invisible.
    """

    kind: Literal["auto", "keys", "buckets"] = "auto"
    buckets_per_table: int = Field(
        4096,
        ge=1,
        le=1 << 24,
        description="buckets: hashes per table; about expected rows per table / 48 keeps each one small "
        "and listpack-encoded (4096 suits up to ~500k rows per table).",
    )
    table_buckets: dict[str, int] = Field(
        default_factory=dict, description="buckets: per-table overrides of buckets_per_table."
    )
    sweep_period_s: float = Field(
        3600.0,
        gt=0,
        description="buckets with a TTL: every bucket is swept for expired rows at least this often, "
        "a few buckets per push (expired rows read as absent at once; the sweep frees their memory).",
    )
    configure_server: bool = Field(
        True,
        description="buckets: raise the server's hash-max-listpack-value/-entries on connect when they are "
        "below what a bucket needs (CONFIG SET; a server-wide setting). Off, or without CONFIG rights, "
        "Kelp logs the redis.conf lines instead; rows still work, at about 160 bytes each.",
    )

    @field_validator("table_buckets")
    @classmethod
    def _positive(cls, v: dict[str, int]) -> dict[str, int]:
        bad = {k: n for k, n in v.items() if not 1 <= n <= 1 << 24}
        if bad:
            raise ValueError(f"bucket counts must be in [1, 16777216], got {bad}")
        return v

    def buckets_for(self, table: str) -> int:
        return self.table_buckets.get(table, self.buckets_per_table)

    def resolve(self, backend: str, sparse_updates: str) -> Literal["keys", "buckets"]:
        """The layout ``auto`` stands for with this backend and update mode."""
        if self.kind != "auto":
            return self.kind
        return "buckets" if backend == "redis" and sparse_updates == "overwrite" else "keys"


class StoreConfig(StrictModel):
    backend: Literal["memory", "redis", "redis-cluster"] = Field(
        "memory",
        description="memory: in-process (embedded default); redis: client-sharded nodes; "
        "redis-cluster: Redis Cluster seed nodes.",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="redis://host:port[/db] per shard (redis) or seed nodes (redis-cluster).",
    )
    replicas: list[list[str]] = Field(
        default_factory=list, description="Optional read-replica URLs per shard, same order as urls."
    )
    username: str | None = None
    password: SecretStr | None = None
    tls: RedisTls = Field(default_factory=RedisTls)
    socket_timeout_s: float = Field(2.0, gt=0)
    connect_timeout_s: float = Field(2.0, gt=0)
    retry: RetrySpec = Field(default_factory=RetrySpec)
    max_rows_per_command: int = Field(
        2048, ge=1, le=100_000, description="Rows per MGET/MSET chunk inside one pipelined round trip."
    )
    cluster_buckets_per_table: int = Field(
        64,
        ge=1,
        le=16_384,
        description="redis-cluster: hash-tag buckets per table; each bucket's rows travel in one command to "
        "one slot. Hazard: changing it changes every key (rows written before become invisible).",
    )
    layout: RowLayoutSpec = Field(default_factory=RowLayoutSpec)
    durability: DurabilitySpec = Field(default_factory=DurabilitySpec)
    hot_cache: HotCacheConfig = Field(default_factory=HotCacheConfig)
    sparse_updates: Literal["overwrite", "compose"] = Field(
        "overwrite",
        description="overwrite: a push writes whole rows; in a trainer group each row has one owner rank, "
        "which steps it with every rank's gradient and alone writes it, so no update is lost; compose: a "
        "push sends gradients and Redis applies row-wise Adagrad to the stored row in one script call per "
        "shard batch, so concurrent updates add up (redis backends, float32 rows, no hot_cache).",
    )

    _split = field_validator("urls", mode="before")(split_csv)

    def hot_tier(self, trainers: int | None) -> bool:
        """Whether a store gets the hot tier: ``hot_cache.enabled``, with ``auto`` resolved.

        ``trainers``: the size of the trainer group the store is built for, None when it is not
        built for training (serving, ``kelp store``, tools): ``auto`` keeps the tier for one trainer.
        """
        if self.hot_cache.enabled != "auto":
            return bool(self.hot_cache.enabled)
        return self.backend != "memory" and self.sparse_updates == "overwrite" and trainers is not None

    def _check_durability(self) -> None:
        d = self.durability
        if d.replicas_ack and self.backend == "memory":
            raise ValueError(
                "durability.replicas_ack needs backend redis or redis-cluster (replicas to wait for)"
            )
        if d.replicas_ack and d.replicas_ack_timeout_ms >= self.socket_timeout_s * 1000:
            raise ValueError(
                f"durability.replicas_ack_timeout_ms ({d.replicas_ack_timeout_ms}) must be below "
                f"socket_timeout_s ({self.socket_timeout_s:g} s): the socket would time out first"
            )

    @property
    def row_layout(self) -> Literal["keys", "buckets"]:
        """``layout.kind`` with ``auto`` resolved for this backend."""
        return self.layout.resolve(self.backend, self.sparse_updates)

    @model_validator(mode="after")
    def _urls(self) -> Self:
        if self.backend != "memory" and not self.urls:
            raise ValueError(f"backend '{self.backend}' needs at least one url (redis://host:port)")
        for url in self.urls + [u for group in self.replicas for u in group]:
            if not url.startswith(("redis://", "rediss://", "unix://")):
                raise ValueError(f"url {redact_url(url)!r} must start with redis://, rediss:// or unix://")
            url_with_plain_userinfo(url, "url")
        if self.replicas and len(self.replicas) != len(self.urls):
            raise ValueError(f"replicas has {len(self.replicas)} groups but urls has {len(self.urls)} shards")
        self._check_durability()
        if self.layout.kind == "buckets" and self.backend != "redis":
            raise ValueError(
                f"layout.kind: buckets needs backend redis (standalone shards); backend '{self.backend}' "
                "keeps one key per row (layout.kind: keys)"
            )
        if self.layout.kind == "buckets" and self.sparse_updates == "compose":
            raise ValueError(
                "sparse_updates: compose needs layout.kind: keys (its script updates string keys)"
            )
        if self.sparse_updates == "compose" and (self.backend == "memory" or self.hot_cache.enabled is True):
            raise ValueError(
                "sparse_updates: compose needs backend redis or redis-cluster and hot_cache.enabled: false "
                "(the update is applied inside Redis)"
            )
        return self
