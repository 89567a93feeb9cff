"""What a source config promises that only the filesystem can confirm, checked before anything starts.

``kelp config validate`` and ``kelp train`` call :func:`check_source` so a
file that is not there, a CSV column the header lacks, a declared feature
that no column feeds, or a task of ``features.labels`` that no column holds
fails at load with one line naming the field, instead of mid-run (or, worse,
training silently on no ids, or rejecting every row).

Each problem is ``(field, message)``; ``field`` is the config's dotted path.
"""

from __future__ import annotations

from pathlib import Path

from kelp.config import CsvMapping, FeatureSpec, FileSourceConfig, SourceConfig
from kelp.consumers.criteo import DENSE_NAMES, SPARSE_NAMES
from kelp.consumers.errors import SourceUserError

__all__ = ["Problem", "check_source"]

Problem = tuple[str, str]
"""``(field, message)``: the config field at fault and what is wrong with it."""


def check_source(source: SourceConfig, features: FeatureSpec) -> list[Problem]:
    """Problems a file source would hit at start-up or silently; a Kafka source has none checkable here."""
    if not isinstance(source, FileSourceConfig):
        return []
    path = Path(source.path)
    if not path.is_file():
        return [("source.path", f"{path}: no such file")]
    if source.format == "csv":
        return _check_csv(source, features)
    if source.format == "criteo_tsv":
        return _check_criteo(features)
    return []


def _check_csv(source: FileSourceConfig, features: FeatureSpec) -> list[Problem]:
    from kelp.consumers.csv_rows import csv_columns

    mapping = source.csv
    assert mapping is not None  # the config model requires it for format csv
    for i, join in enumerate(mapping.joins):
        if not Path(join.path).is_file():
            return [(f"source.csv.joins[{i}].path", f"{join.path}: no such file")]
    try:
        files = csv_columns(Path(source.path), mapping)
    except (OSError, SourceUserError, UnicodeDecodeError) as exc:
        return [("source.path", f"{source.path}: cannot read the CSV header: {exc}")]
    own = next(iter(files.values()))
    have = {c for columns in files.values() for c in columns}
    problems: list[Problem] = []

    def column(field: str, name: str, columns: list[str] | None = None) -> None:
        allowed = own if columns is not None else [c for cs in files.values() for c in cs]
        if name not in (set(columns) if columns is not None else have):
            shown = ", ".join(allowed[:40]) + (", ..." if len(allowed) > 40 else "")
            problems.append(
                (field, f"column {name!r} is not among the columns of {source.path} (columns: {shown})")
            )

    column("source.csv.label_column", mapping.label_column)
    problems += _check_csv_labels(mapping, features)
    for task, col in mapping.label_columns.items():
        column(f"source.csv.label_columns.{task}", col)
    if mapping.weight_column:
        column("source.csv.weight_column", mapping.weight_column)
    if mapping.sort_by:
        column("source.csv.sort_by", mapping.sort_by, own)
    if mapping.event_time_column:
        column("source.csv.event_time_column", mapping.event_time_column)
    for i, join in enumerate(mapping.joins):
        column(f"source.csv.joins[{i}].column", join.column, own)
    for name, flags in mapping.flag_columns.items():
        for col in flags.columns:
            column(f"source.csv.flag_columns.{name}", col)
    for kind, mapped, declared in (
        ("dense", mapping.dense_columns, [f.name for f in features.dense]),
        ("sparse", mapping.sparse_columns, [f.name for f in features.sparse]),
        ("flag", mapping.flag_columns, [f.name for f in features.sparse]),
    ):
        for name, col in mapped.items():
            if isinstance(col, str):
                column(f"source.csv.{kind}_columns.{name}", col)
            if name not in declared:
                what = "dense" if kind == "dense" else "sparse"
                problems.append(
                    (f"source.csv.{kind}_columns.{name}", f"{name!r} is not a declared {what} feature")
                )
    for i, feature in enumerate(features.sparse):
        if feature.name not in mapping.sparse_columns and feature.name not in mapping.flag_columns:
            problems.append(
                (
                    f"features.sparse[{i}]",
                    f"{feature.name!r} is declared but neither source.csv.sparse_columns nor flag_columns "
                    "maps a column to it (no column: it would train with no ids)",
                )
            )
    return problems


def _check_csv_labels(mapping: CsvMapping, features: FeatureSpec) -> list[Problem]:
    """``label_columns`` names exactly the tasks after the first: one left out would reject every row."""
    tasks = features.task_names()
    problems: list[Problem] = [
        (
            f"source.csv.label_columns.{task}",
            f"{task!r} is not a label after the first of features.labels "
            f"(the first, {tasks[0]!r}, is label_column)",
        )
        for task in mapping.label_columns
        if task not in tasks[1:]
    ]
    missing = [t for t in tasks[1:] if t not in mapping.label_columns]
    if missing:
        problems.append(("source.csv.label_columns", f"label(s) {', '.join(missing)} have no column"))
    return problems


def _check_criteo(features: FeatureSpec) -> list[Problem]:
    """Criteo TSV rows carry exactly I1..I13 and C1..C26: other names never get a value."""
    problems: list[Problem] = []
    for kind, declared, criteo in (
        ("dense", [f.name for f in features.dense], DENSE_NAMES),
        ("sparse", [f.name for f in features.sparse], SPARSE_NAMES),
    ):
        for i, name in enumerate(declared):
            if name not in criteo:
                problems.append(
                    (
                        f"features.{kind}[{i}]",
                        f"{name!r} is not a Criteo column; criteo_tsv rows carry {criteo[0]}..{criteo[-1]}",
                    )
                )
        missing = [n for n in criteo if n not in declared]
        if missing:
            problems.append(
                (
                    f"features.{kind}",
                    f"criteo_tsv rows carry {', '.join(missing)}, which are not declared: "
                    "every row would be rejected as unknown_feature",
                )
            )
    return problems
