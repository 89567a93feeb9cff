"""What a source config promises that only the filesystem can confirm, checked before anything starts.

``kelp config validate`` and ``kelp train`` call :func:`check_source` so a
file that is not there, a CSV column the header lacks, or a declared feature
that no column feeds fails at load with one line naming the field, instead of
mid-run (or, worse, training silently on no ids).

Each problem is ``(field, message)``; ``field`` is the config's dotted path.
"""

from __future__ import annotations

import csv
from pathlib import Path

from kelp.config import FeatureSpec, FileSourceConfig, SourceConfig
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
    from kelp.consumers.file_source import open_text

    mapping = source.csv
    assert mapping is not None  # the config model requires it for format csv
    try:
        with open_text(Path(source.path)) as fh:
            header = next(csv.reader(fh, delimiter=mapping.delimiter), [])
    except (OSError, SourceUserError, UnicodeDecodeError) as exc:
        return [("source.path", f"{source.path}: cannot read the CSV header: {exc}")]
    have = set(header)
    shown = ", ".join(header[:40]) + (", ..." if len(header) > 40 else "")
    problems: list[Problem] = []

    def column(field: str, name: str) -> None:
        if name not in have:
            problems.append(
                (field, f"column {name!r} is not in the header of {source.path} (columns: {shown})")
            )

    column("source.csv.label_column", mapping.label_column)
    if mapping.sort_by:
        column("source.csv.sort_by", mapping.sort_by)
    for kind, mapped, declared in (
        ("dense", mapping.dense_columns, [f.name for f in features.dense]),
        ("sparse", mapping.sparse_columns, [f.name for f in features.sparse]),
    ):
        for name, col in mapped.items():
            column(f"source.csv.{kind}_columns.{name}", col)
            if name not in declared:
                problems.append(
                    (f"source.csv.{kind}_columns.{name}", f"{name!r} is not a declared {kind} feature")
                )
    for i, feature in enumerate(features.sparse):
        if feature.name not in mapping.sparse_columns:
            problems.append(
                (
                    f"features.sparse[{i}]",
                    f"{feature.name!r} is declared but source.csv.sparse_columns maps no column to it "
                    "(it would train with no ids)",
                )
            )
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
