"""File sources: Criteo TSV, mapped CSV (gzip, sort_by), msgpack event log."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import (
    BatchingConfig,
    CsvMapping,
    FeatureSpec,
    FileSourceConfig,
    SparseFeature,
)
from kelp.consumers import build_source, criteo_feature_spec, encode_sample
from kelp.consumers.file_source import FileSource
from kelp.consumers.ids import str_id

from .conftest import DATA


def test_criteo_tsv_parses_hex_empty_and_short_rows(metrics_registry: CollectorRegistry) -> None:
    src = FileSource(
        FileSourceConfig(path=DATA / "criteo_sample.tsv", format="criteo_tsv"),
        criteo_feature_spec(),
        BatchingConfig(batch_size=8),
        metrics_registry,
    )
    batches = list(src)
    assert [b.size for b in batches] == [8, 8, 5]
    first = batches[0]
    line = (DATA / "criteo_sample.tsv").read_text().splitlines()[0].split("\t")
    assert first.labels[0] == float(line[0])
    assert first.sparse["C1"].values[0] == str_id(line[14])  # a hex token: a string id like any other
    short = batches[-1]  # the last row is "1\t\t5": only I2 set, no ids
    assert short.sparse["C1"].lengths()[-1] == 0
    np.testing.assert_allclose(short.dense[-1, :3], [0.0, np.log1p(5.0), 0.0])
    for b in batches:
        src.commit(b)
    assert src.committed == 21


def test_csv_mapping_sorted_gzip_and_limit() -> None:
    spec = FeatureSpec(sparse=[SparseFeature(name=n) for n in ("cat1", "cat4")])
    source = FileSourceConfig(
        path=DATA / "attribution_sample.csv.gz",
        format="csv",
        limit=25,
        csv=CsvMapping(
            label_column="click", sparse_columns={"cat1": "cat1", "cat4": "cat4"}, sort_by="orig_row"
        ),
    )
    rows = [r.split(",") for r in (DATA / "attribution_sample.csv").read_text().splitlines()[1:]]
    rows.sort(key=lambda r: int(r[0]))
    batches = list(build_source(source, spec, BatchingConfig(batch_size=10), CollectorRegistry()))
    assert sum(b.size for b in batches) == 25
    got = np.concatenate([b.sparse["cat1"].values for b in batches])
    assert got.tolist() == [int(r[1]) for r in rows[:25]]
    assert np.concatenate([b.labels for b in batches]).tolist() == [float(r[-1]) for r in rows[:25]]


def test_msgpack_log_counts_rejections(tmp_path: Path, metrics_registry: CollectorRegistry) -> None:
    path = tmp_path / "events.msgpack"
    path.write_bytes(encode_sample(1, sparse={"a": 1}) + encode_sample(2, sparse={"a": 2}) + encode_sample(0))
    spec = FeatureSpec(sparse=[SparseFeature(name="a")])
    src = FileSource(FileSourceConfig(path=path, format="msgpack"), spec, registry=metrics_registry)
    (batch,) = list(src)
    assert batch.labels.tolist() == [1.0, 0.0]
    assert batch.sources[0].first_offset == 0 and batch.sources[0].last_offset == 2
    assert metrics_registry.get_sample_value("kelp_records_rejected_total", {"reason": "bad_label"}) == 1


def _movielens_like(tmp_path: Path) -> FileSourceConfig:
    """A headerless ratings file joined to a pipe-separated, latin-1 item file with genre flags."""
    (tmp_path / "ratings.tsv").write_text("7\t2\t5\t300\n7\t1\t3\t100\n8\t3\t4\t200\n9\t1\t\t250\n")
    (tmp_path / "items.psv").write_bytes(
        "item|title|Action|Comedy|Drama\n1|Amélie|0|1|1\n2|Heat|1|0|1\n".encode("latin-1")
    )
    return FileSourceConfig(
        path=tmp_path / "ratings.tsv",
        format="csv",
        csv=CsvMapping.model_validate(
            {
                "delimiter": "\t",
                "columns": ["user_id", "item_id", "rating", "ts"],
                "label_column": "rating",
                "label_threshold": 4,
                "event_time_column": "ts",
                "sort_by": "ts",
                "sparse_columns": {"user": "user_id", "item": "item_id", "title": "title"},
                "flag_columns": {
                    "genre": {"columns": ["Action", "Comedy", "Drama"]},
                    "genres": {"columns": ["Action", "Comedy", "Drama"], "take": "all"},
                },
                "joins": [
                    {
                        "path": tmp_path / "items.psv",
                        "delimiter": "|",
                        "encoding": "latin-1",
                        "column": "item_id",
                        "key": "item",
                    }
                ],
            }
        ),
    )


def test_csv_without_header_with_threshold_label_join_and_flag_columns(tmp_path: Path) -> None:
    from kelp.consumers.codec import hash_str_id

    spec = FeatureSpec(
        sparse=[
            SparseFeature(name="user"),
            SparseFeature(name="item"),
            SparseFeature(name="title"),
            SparseFeature(name="genre"),
            SparseFeature(name="genres", max_ids=3),
        ]
    )
    registry = CollectorRegistry()
    batches = list(build_source(_movielens_like(tmp_path), spec, BatchingConfig(batch_size=10), registry))
    (batch,) = batches
    # Sorted by ts: (7,1,3,100) (8,3,4,200) (7,2,5,300); the row with no rating has no label: rejected.
    assert batch.size == 3
    assert batch.labels.tolist() == [0.0, 1.0, 1.0]  # rating >= 4
    assert batch.event_ts.tolist() == [100.0, 200.0, 300.0]
    assert batch.sparse["user"].values.tolist() == [7, 8, 7]  # digits: the integer itself
    assert batch.sparse["title"].values.tolist() == [hash_str_id("Amélie"), hash_str_id("Heat")]
    assert batch.sparse["title"].lengths().tolist() == [1, 0, 1]  # item 3 is not in items.psv
    assert batch.sparse["genre"].values.tolist() == [hash_str_id("Comedy"), hash_str_id("Action")]
    assert batch.sparse["genres"].values.tolist() == [
        hash_str_id(g) for g in ("Comedy", "Drama", "Action", "Drama")
    ]
    assert registry.get_sample_value("kelp_records_rejected_total", {"reason": "missing_label"}) == 1


def test_csv_id_rules_digits_are_ids_everything_else_is_hashed() -> None:
    from kelp.consumers.csv_rows import parse_id

    assert parse_id("0") == 0
    assert parse_id("18446744073709551615") == 2**64 - 1
    # "٣" is an Arabic-Indic digit: not ASCII; 2**64 is past uint64: a string id, not a rejected number
    for text in ("-3", "0x1f", "12.0", "1e3", "alice", "٣", "18446744073709551616"):
        assert parse_id(text) == text


def test_progress_knows_how_many_rows_a_gzip_and_a_headerless_file_hold(tmp_path: Path) -> None:
    spec = FeatureSpec(sparse=[SparseFeature(name=n) for n in ("cat1", "cat4")])
    gz = FileSourceConfig(
        path=DATA / "attribution_sample.csv.gz",
        format="csv",
        csv=CsvMapping(label_column="click", sparse_columns={"cat1": "cat1", "cat4": "cat4"}),
    )
    rows = len((DATA / "attribution_sample.csv").read_text().splitlines()) - 1
    assert FileSource(gz, spec, registry=CollectorRegistry()).expected_samples() == rows
    headerless = _movielens_like(tmp_path)
    one = FeatureSpec(sparse=[SparseFeature(name="user")])
    assert FileSource(headerless, one, registry=CollectorRegistry()).expected_samples() == 4
