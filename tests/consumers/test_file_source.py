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
    assert first.sparse["C1"].values[0] == int(line[14], 16)
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
