"""Poisoned and malformed stored rows on a real Redis: quarantined, counted, logged, healed; never raised.

Values are written straight into Redis with redis-py, as a foreign client, a bug
or a bad restore would. The non-finite case on every backend (memory included)
is in the contract suite (``check_nonfinite_rows_are_quarantined``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import redis

from kelp.config import HotCacheConfig, StoreConfig, TableSpec
from kelp.harness import RedisCluster, RedisServer
from kelp.retry import RetryPolicy
from kelp.store import build_store
from kelp.store.errors import LayoutMarkerError, WrongTypeError
from kelp.store.hot.tier import HotRowCache
from kelp.store.policy.initial_rows import init_rows
from kelp.store.redis.buckets import RedisBucketStore
from kelp.store.redis.keys import BucketLayout, quote_key
from kelp.store.redis.layout_marker import marker_key
from kelp.store.redis.shared import RedisStoreBase
from kelp.store.rows.codec import RowCodec

pytestmark = pytest.mark.integration

NO_SLEEP = RetryPolicy(attempts=3, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)
INIT = {"kind": "normal", "std": 0.1, "seed": 3}
INIT_SPEC = TableSpec(name="t", dim=4, init=INIT)  # type: ignore[arg-type]
_deployments = (f"q{i}" for i in itertools.count())

Plant = Callable[[str, int, bytes], None]
"""Write raw ``bytes`` as the stored value of (table, id), bypassing the store."""


def _counted(store: RedisStoreBase, reason: str, table: str = "t") -> float:
    return store.metrics.rows_quarantined.labels(table=table, reason=reason)._value.get()


@contextmanager
def _opened(
    topology: str, specs: list[TableSpec], request: pytest.FixtureRequest, **cfg: object
) -> Iterator[tuple[RedisStoreBase, Plant]]:
    """A fresh store of ``topology`` and a function that plants raw values under its keys."""
    if topology == "cluster":
        cluster: RedisCluster = request.getfixturevalue("clean_redis_cluster")
        config = StoreConfig(backend="redis-cluster", urls=cluster.urls, **cfg)  # type: ignore[arg-type]
        client: redis.Redis | redis.RedisCluster = cluster.client()
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        server.client().flushall()
        layout = {"kind": "buckets", "buckets_per_table": 4} if topology == "buckets" else {"kind": "keys"}
        config = StoreConfig(backend="redis", urls=[server.url], layout=layout, **cfg)  # type: ignore[arg-type]
        client = server.client()
    store = build_store(config, specs, next(_deployments), retry=NO_SLEEP, seed=0)
    assert isinstance(store, RedisStoreBase)

    def plant(table: str, row_id: int, value: bytes) -> None:
        ids = np.array([row_id], np.uint64)
        if isinstance(store, RedisBucketStore):
            layout = store.buckets[table]
            key = layout.bucket_keys(layout.bucket_of(ids))[0].tobytes()
            client.hset(key, BucketLayout.fields(ids)[0].tobytes(), value)
        else:
            layout = store.layouts[table]
            client.set(layout.row_keys(ids, layout.bucket_of(ids))[0], value)

    try:
        yield store, plant
    finally:
        store.close()


def _poison(codec: RowCodec, plant: Plant, ids: np.ndarray) -> np.ndarray:
    """Plant a NaN row (valid header), a wrong-length value and a wrong-version row at ids 1, 3 and 4;
    returns the mask of the ids left alone."""
    now = int(time.time())
    nan_row = codec.encode(np.array([[0.5, np.nan, 0.0, 1.0]], np.float32), np.zeros(1, np.float32), 0, now)
    other_version = (
        b"\x07" + codec.encode(np.ones((1, 4), np.float32), np.zeros(1, np.float32), 0, now)[0][1:]
    )
    plant("t", int(ids[1]), nan_row[0])
    plant("t", int(ids[3]), b"short")
    plant("t", int(ids[4]), other_version)
    good = np.ones(len(ids), dtype=bool)
    good[[1, 3, 4]] = False
    return good


@pytest.mark.parametrize("topology", ["keys", "buckets", "cluster"])
@pytest.mark.parametrize("admission", ["always", "counting-ttl"])
def test_bad_stored_rows_are_quarantined_then_healed_by_the_next_push(
    topology: str, admission: str, request: pytest.FixtureRequest
) -> None:
    """A NaN row, a wrong-length value and a wrong-version row: no exception, the rest of the batch
    intact; serving reads the default row (not admitted), training the init row (admitted); each is
    counted by reason; the push that follows writes valid finite rows over them."""
    extra = {"admission": {"min_count": 2}, "eviction": {"ttl_s": 3600}} if admission != "always" else {}
    spec = TableSpec(name="t", dim=4, init=INIT, **extra)  # type: ignore[arg-type]
    with _opened(topology, [spec], request) as (store, plant):
        ids = np.arange(1, 7, dtype=np.uint64)
        rows = np.arange(24, dtype=np.float32).reshape(6, 4)
        state = np.full(6, 0.25, np.float32)
        if admission != "always":
            store.pull("t", ids)
            assert store.pull("t", ids).admitted.all()  # the second sighting admits
        store.push("t", ids, rows, state)
        good = _poison(store.table("t").codec, plant, ids)

        serving = store.pull("t", ids, count=False)
        assert serving.admitted.tolist() == good.tolist()
        np.testing.assert_array_equal(serving.rows[good], rows[good])
        np.testing.assert_array_equal(serving.state[good], state[good])
        assert (serving.rows[~good] == 0).all() and (serving.state[~good] == 0).all()
        assert [_counted(store, r) for r in ("nonfinite", "wrong_length", "bad_header")] == [1, 1, 1]

        training = store.pull("t", ids)
        assert training.admitted.all()
        np.testing.assert_array_equal(training.rows[good], rows[good])
        np.testing.assert_allclose(training.rows[~good], init_rows(spec.init, "t", ids[~good], 4))
        assert (training.state[~good] == 0).all() and np.isfinite(training.rows).all()
        assert [_counted(store, r) for r in ("nonfinite", "wrong_length", "bad_header")] == [2, 2, 2]

        store.push("t", ids, training.rows + 1, training.state + 1)
        decoded = store.table("t").codec.decode(store.raw_values("t", ids))
        assert decoded.present.all() and not decoded.fault.any()
        np.testing.assert_allclose(decoded.rows, training.rows + 1)
        healed = store.pull("t", ids, count=False)
        assert healed.admitted.all()
        assert [_counted(store, r) for r in ("nonfinite", "wrong_length", "bad_header")] == [2, 2, 2]


@pytest.mark.parametrize("topology", ["keys", "buckets"])
def test_the_warning_names_table_id_and_key_at_most_once_per_interval(
    topology: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    with _opened(topology, [TableSpec(name="t", dim=4)], request) as (store, plant):
        ids = np.array([41, 42], np.uint64)
        plant("t", 42, b"\x01\x02")
        with caplog.at_level(logging.WARNING, logger="kelp.store.quarantine"):
            store.pull("t", ids, count=False)
            store.pull("t", ids, count=False)
        lines = [r.getMessage() for r in caplog.records if r.name == "kelp.store.quarantine"]
        assert len(lines) == 1, lines  # rate-limited ...
        assert _counted(store, "wrong_length") == 2  # ... but always counted
        one = np.array([42], np.uint64)
        if isinstance(store, RedisBucketStore):
            layout = store.buckets["t"]
            where = (
                f"key {quote_key(layout.bucket_keys(layout.bucket_of(one))[0].tobytes())} "
                f"field {quote_key(BucketLayout.fields(one)[0].tobytes())}"
            )
        else:
            where = f"key {quote_key(store.layouts['t'].row_keys(one)[0])}"
        assert "store table 't'" in lines[0] and "wrong_length" in lines[0]
        assert f"id 42 at {where} on {store.shard_names[0]}" in lines[0]


def test_compose_updates_replace_a_bad_stored_value_with_the_trainers_row(
    request: pytest.FixtureRequest,
) -> None:
    """``sparse_updates: compose``: the Adagrad script never composes onto a bad value (a short one
    would fail the script, a NaN one would stay NaN); it writes the trainer's row, which started from
    the init row."""
    spec = TableSpec(name="t", dim=4, init=INIT, admission={"min_count": 2})
    with _opened("keys", [spec], request, sparse_updates="compose") as (store, plant):
        ids = np.arange(1, 7, dtype=np.uint64)
        store.pull("t", ids)
        store.pull("t", ids)
        good = _poison(store.table("t").codec, plant, ids)
        got = store.pull("t", ids)
        assert got.admitted.all() and np.isfinite(got.rows).all()
        grads = np.full((6, 4), 0.1, np.float32)
        store.apply_adagrad_many({"t": (ids, got.rows, got.state, grads)}, lr=0.1, eps=1e-8)
        decoded = store.table("t").codec.decode(store.raw_values("t", ids))
        assert not decoded.fault.any() and decoded.present.all()
        np.testing.assert_allclose(decoded.rows[~good], got.rows[~good])  # the trainer's row
        assert (decoded.rows[good] < got.rows[good]).all()  # composed: the stored row stepped down
        nan_grads = grads.copy()
        nan_grads[0, 0] = np.nan
        store.apply_adagrad_many({"t": (ids, got.rows, got.state, nan_grads)}, lr=0.1, eps=1e-8)
        assert _counted(store, "nonfinite_push") == 1
        assert not store.table("t").codec.decode(store.raw_values("t", ids)).fault.any()


def test_the_hot_tier_takes_only_finite_rows(request: pytest.FixtureRequest) -> None:
    """A quarantined row enters the tier as its init row; a non-finite push leaves the tier's row as it
    was; the write-back heals the stored value."""
    with _opened("keys", [INIT_SPEC], request) as (inner, plant):
        cache = HotRowCache(inner, HotCacheConfig(enabled=True, min_count=1, writeback_every_steps=100))
        ids = np.array([1, 2], np.uint64)
        inner.push("t", ids, np.ones((2, 4), np.float32), np.zeros(2, np.float32))
        plant("t", 2, b"not a row")
        got = cache.pull("t", ids)
        assert cache.holds("t", ids).all() and np.isfinite(got.rows).all()
        np.testing.assert_allclose(got.rows[1], init_rows(INIT_SPEC.init, "t", ids[1:], 4)[0])
        bad = got.rows + 1
        bad[1, 0] = np.inf
        cache.push("t", ids, bad, got.state)
        assert _counted(inner, "nonfinite_push") == 1
        again = cache.pull("t", ids)
        np.testing.assert_allclose(again.rows[0], got.rows[0] + 1)
        np.testing.assert_allclose(again.rows[1], got.rows[1])  # the tier kept its finite row
        cache.push("t", ids, again.rows + 1, again.state)
        cache.flush()  # the write-back heals the stored value
        decoded = inner.table("t").codec.decode(inner.raw_values("t", ids))
        assert not decoded.fault.any()
        np.testing.assert_allclose(decoded.rows, again.rows + 1)


def test_wrongtype_bucket_names_the_key_and_table_and_is_left_alone(
    request: pytest.FixtureRequest,
) -> None:
    with _opened("buckets", [TableSpec(name="t", dim=4, eviction={"ttl_s": 60})], request) as (store, _):
        assert isinstance(store, RedisBucketStore)
        client = request.getfixturevalue("redis_server").client()
        layout = store.buckets["t"]
        ids = np.arange(100, dtype=np.uint64)
        bucket = layout.bucket_of(ids)
        key = layout.bucket_keys(bucket[:1])[0].tobytes()
        client.set(key, b"someone's string")
        expected = (
            f"store table 't': key {quote_key(key)} on {store.shard_names[0]} "
            "holds a string, expected a hash (bucket)"
        )
        with pytest.raises(WrongTypeError) as pulled:
            store.pull("t", ids)
        assert expected in str(pulled.value) and "\n" not in str(pulled.value)
        with pytest.raises(WrongTypeError, match="holds a string, expected a hash"):
            store.push("t", ids, np.ones((100, 4), np.float32), np.zeros(100, np.float32))
        assert client.get(key) == b"someone's string"  # never deleted
        others = ids[bucket != bucket[0]]
        store._sweepers["t"].period_s = 1e-9  # every bucket due: the sweep passes the string by
        store.push("t", others, np.ones((len(others), 4), np.float32), np.zeros(len(others), np.float32))
        assert store.pull("t", others, count=False).admitted.all()
        assert client.get(key) == b"someone's string"


def test_wrongtype_admission_counter_names_the_key(request: pytest.FixtureRequest) -> None:
    spec = TableSpec(name="t", dim=4, admission={"min_count": 2})
    with _opened("keys", [spec], request) as (store, _):
        client = request.getfixturevalue("redis_server").client()
        key = store.layouts["t"].counter_keys(np.array([5], np.uint64))[0]
        client.hset(key, b"f", b"v")
        with pytest.raises(
            WrongTypeError,
            match=r"store table 't': key .* holds a hash, expected a string \(admission counter\)",
        ):
            store.pull("t", np.array([4, 5], np.uint64))


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (b"{not json", "{not json"),
        (b'["keys"]', '["keys"]'),
        (b'{"kind": "rows"}', "rows"),
        (b"\xff\xfe", ""),
    ],
)
def test_an_unreadable_layout_marker_is_one_line_naming_the_key(
    value: bytes, shown: str, request: pytest.FixtureRequest
) -> None:
    server: RedisServer = request.getfixturevalue("redis_server")
    server.client().flushall()
    server.client().set(marker_key("lm"), value)
    cfg = StoreConfig(backend="redis", urls=[server.url])
    with (
        build_store(cfg, [TableSpec(name="t", dim=2)], "lm", retry=NO_SLEEP) as store,
        pytest.raises(LayoutMarkerError) as err,
    ):
        store.pull("t", np.array([1], np.uint64))
    text = str(err.value)
    assert (
        "\n" not in text and "'kelp:lm:layout'" in text and shown in text and "expected a JSON object" in text
    )
    server.client().delete(marker_key("lm"))
    server.client().hset(marker_key("lm"), b"kind", b"keys")
    with (
        build_store(cfg, [TableSpec(name="t", dim=2)], "lm", retry=NO_SLEEP) as store,
        pytest.raises(LayoutMarkerError, match="'kelp:lm:layout' is not a string key"),
    ):
        store.pull("t", np.array([1], np.uint64))


def test_the_cli_reports_a_bad_layout_marker_in_one_line(
    tmp_path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    from kelp.cli.main import main

    redis_server.client().flushall()
    redis_server.client().set(marker_key("clilm"), b"{oops")
    config = tmp_path / "kelp.yaml"
    config.write_text(
        "deployment: clilm\n"
        "source: {kind: file, path: x.tsv, format: criteo_tsv}\n"
        f"store: {{backend: redis, urls: ['{redis_server.url}']}}\n"
        "features: {tables: [{name: ads, dim: 2}]}\n"
    )
    assert main(["store", "inspect", "--config", str(config), "ads", "7"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and "'kelp:clilm:layout'" in err, err
