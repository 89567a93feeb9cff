"""``kelp config validate`` refuses what ``kelp train`` would refuse: one line each, exit 2, no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from validate_run import run_validate

DATA = Path(__file__).resolve().parents[1] / "consumers" / "data"
CRITEO = DATA / "criteo_sample.tsv"
CSV = DATA / "attribution_sample.csv"

CRITEO_FILE = f"source: {{kind: file, path: {CRITEO}, format: criteo_tsv}}\n"
CRITEO_FEATURES = (
    "features:\n"
    "  dense: [" + ", ".join(f"{{name: I{i}}}" for i in range(1, 14)) + "]\n"
    "  sparse: [" + ", ".join(f"{{name: C{i}}}" for i in range(1, 27)) + "]\n"
)
FS_PUBLISHER = "publisher: {channel: filesystem, path: snapshots}\n"


def _one_line_error(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def test_a_valid_config_passes(tmp_path: Path) -> None:
    result = run_validate(tmp_path, CRITEO_FILE + CRITEO_FEATURES + FS_PUBLISHER)
    assert result.returncode == 0, result.stderr
    assert "ok (" in result.stdout


def test_max_rows_on_a_redis_backend(tmp_path: Path) -> None:
    text = (
        CRITEO_FILE
        + CRITEO_FEATURES
        + "  tables: [{name: C1, eviction: {max_rows: 1000}}]\n"
        + "store: {backend: redis, urls: ['redis://127.0.0.1:1']}\n"
    )
    _one_line_error(
        run_validate(tmp_path, text), "features.tables[0].eviction.max_rows", "redis", "maxmemory"
    )


def test_an_unbuilt_model(tmp_path: Path) -> None:
    text = CRITEO_FILE + CRITEO_FEATURES + FS_PUBLISHER + "trainer: {model: wide-and-deep}\n"
    _one_line_error(
        run_validate(tmp_path, text),
        "trainer.model: got 'wide-and-deep'",
        "'dlrm-small', 'dcn-v2', 'deepfm' or an import reference package.module:attr",
    )


def test_a_redis_publisher_with_a_memory_store(tmp_path: Path) -> None:
    text = CRITEO_FILE + CRITEO_FEATURES + "store: {backend: memory}\npublisher: {channel: redis}\n"
    _one_line_error(run_validate(tmp_path, text), "publisher.channel", "publisher.redis_url")


def test_a_file_that_does_not_exist(tmp_path: Path) -> None:
    text = CRITEO_FILE.replace(str(CRITEO), str(tmp_path / "gone.tsv")) + CRITEO_FEATURES + FS_PUBLISHER
    _one_line_error(run_validate(tmp_path, text), "source.path", "gone.tsv: no such file")


def test_a_mapped_csv_column_that_does_not_exist(tmp_path: Path) -> None:
    text = (
        f"source: {{kind: file, path: {CSV}, format: csv, csv: "
        "{label_column: click, sparse_columns: {cat1: cat1, cat4: kat4}}}\n"
        "features: {sparse: [{name: cat1}, {name: cat4}]}\n" + FS_PUBLISHER
    )
    line = _one_line_error(run_validate(tmp_path, text), "source.csv.sparse_columns.cat4", "'kat4'")
    assert "columns: orig_row, cat1, cat4, cat6, cat8, cat9, click" in line


@pytest.mark.parametrize("missing", ["C7"])
def test_a_declared_feature_that_no_csv_column_feeds(tmp_path: Path, missing: str) -> None:
    text = (
        f"source: {{kind: file, path: {CSV}, format: csv, csv: "
        "{label_column: click, sparse_columns: {cat1: cat1}}}\n"
        f"features: {{sparse: [{{name: cat1}}, {{name: {missing}}}]}}\n" + FS_PUBLISHER
    )
    _one_line_error(
        run_validate(tmp_path, text), "features.sparse[1]", f"'{missing}' is declared", "no column"
    )


def test_max_rows_from_table_defaults_points_at_table_defaults(tmp_path: Path) -> None:
    text = (
        CRITEO_FILE
        + CRITEO_FEATURES
        + "  tables: [{name: C1}]\n"
        + "  table_defaults: {eviction: {max_rows: 1000}}\n"
        + "store: {backend: redis, urls: ['redis://127.0.0.1:1']}\n"
    )
    result = run_validate(tmp_path, text)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # C2..C26 take table_defaults: one mistake, one line
    assert "features.table_defaults.eviction.max_rows" in lines[0]
    assert "(tables 'C2', 'C3', 'C4', 'C5', 'C6' and 20 more take table_defaults)" in lines[0]


def test_a_flag_column_or_join_key_that_does_not_exist(tmp_path: Path) -> None:
    (tmp_path / "items.csv").write_text("item,Action\n1,1\n")
    text = (
        f"source: {{kind: file, path: {CSV}, format: csv, csv: "
        "{label_column: click, sparse_columns: {cat1: cat1}, "
        "flag_columns: {genre: {columns: [Action, Drama]}}, "
        f"joins: [{{path: {tmp_path / 'items.csv'}, column: cat4, key: item}}]}}}}\n"
        "features: {sparse: [{name: cat1}, {name: genre}]}\n" + FS_PUBLISHER
    )
    line = _one_line_error(run_validate(tmp_path, text), "source.csv.flag_columns.genre", "'Drama'")
    assert "Action" in line  # the joined file's columns are listed as available
    missing_join = text.replace(str(tmp_path / "items.csv"), str(tmp_path / "gone.csv"))
    _one_line_error(
        run_validate(tmp_path, missing_join), "source.csv.joins[0].path", "gone.csv: no such file"
    )
