"""``kelp bench accuracy``'s two-task run on a tiny slice: both sides train click and conversion.

The sample Kelp ships has no conversion column, so the slice here is the first
rows of that sample with a **synthetic** conversion label added (a click whose
cat4 id is a multiple of 3): enough to check that Kelp's daemon and the
reference train both labels on the same rows and every key is there and
finite. No threshold on any AUC (figures are measured by the bench, not
asserted by tests).
"""

from __future__ import annotations

import csv
import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from kelp.bench.accuracy_tasks import PREFIX, multitask_parity
from kelp.bench.reference import ReferenceOptions, train_reference
from kelp.bench.streams import CRITEO_ATTRIBUTION, SHIPPED_DATA, load_stream

ROWS = 2048
TASKS = ("click", "conversion")
PER_TASK = (
    "auc",
    "reference_auc",
    "auc_gap",
    "log_loss",
    "reference_log_loss",
    "binned_auc",
    "positive_rate",
)


def _slice(data_dir: Path, *, conversion: bool) -> Path:
    """``data_dir/criteo-attribution/train.csv.gz``: the shipped sample's first rows, shuffled out of
    ``orig_row`` order (both sides must sort), with a synthetic conversion column if asked."""
    with gzip.open(
        SHIPPED_DATA / CRITEO_ATTRIBUTION / "train.csv.gz", "rt", encoding="utf-8", newline=""
    ) as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        rows = [row for _, row in zip(range(ROWS), reader, strict=False)]
    rows.reverse()
    if conversion:
        header.append("conversion")
        for row in rows:
            row["conversion"] = str(int(row["click"] == "1" and int(row["cat4"]) % 3 == 0))
    folder = data_dir / CRITEO_ATTRIBUTION
    folder.mkdir(parents=True)
    with gzip.open(folder / "train.csv.gz", "wt", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return data_dir


def test_two_tasks_train_on_both_sides_and_every_key_is_finite(tmp_path: Path) -> None:
    data_dir = _slice(tmp_path / "data", conversion=True)
    stream = load_stream(CRITEO_ATTRIBUTION, data_dir)
    assert stream.has_labels(TASKS) and stream.extra_labels["conversion"].sum() > 0
    (tmp_path / "work").mkdir()
    out, curves = multitask_parity(stream, data_dir, tmp_path / "work", None)
    assert out[f"{PREFIX}_samples"] == ROWS
    for task in TASKS:
        for key in PER_TASK:
            value = out[f"{PREFIX}_{task}_{key}"]
            assert value is not None and math.isfinite(value), (task, key, value)
        assert 0.0 < out[f"{PREFIX}_{task}_auc"] < 1.0 and out[f"{PREFIX}_{task}_log_loss"] > 0.0
        assert out[f"{PREFIX}_{task}_auc_gap"] == pytest.approx(
            out[f"{PREFIX}_{task}_auc"] - out[f"{PREFIX}_{task}_reference_auc"], abs=2e-4
        )
    assert out[f"{PREFIX}_conversion_positive_rate"] == pytest.approx(
        float(stream.extra_labels["conversion"].mean()), abs=1e-5
    )
    assert out[f"{PREFIX}_conversion_positive_rate"] < out[f"{PREFIX}_click_positive_rate"]
    assert [c.label for c in curves] == [
        "Kelp click",
        "reference click",
        "Kelp conversion",
        "reference conversion",
    ]


def test_a_stream_without_conversion_is_skipped_with_the_reason(tmp_path: Path) -> None:
    data_dir = _slice(tmp_path / "data", conversion=False)
    stream = load_stream(CRITEO_ATTRIBUTION, data_dir)
    out, curves = multitask_parity(stream, data_dir, tmp_path, None)
    assert list(out) == [f"{PREFIX}_skipped"] and curves == []
    assert "no conversion column" in out[f"{PREFIX}_skipped"]


def test_the_reference_trains_one_head_per_task_on_the_named_labels(tmp_path: Path) -> None:
    stream = load_stream(CRITEO_ATTRIBUTION, _slice(tmp_path, conversion=True)).head(512)
    run = train_reference(stream, ReferenceOptions(kind="concat", tasks=TASKS))
    assert run.logits.shape == run.labels.shape == (512, 2)
    assert np.array_equal(run.labels[:, 0], stream.labels)
    assert np.array_equal(run.labels[:, 1], stream.extra_labels["conversion"])
    assert not np.allclose(run.logits[:, 0], run.logits[:, 1])  # two heads, not one logit twice
    with pytest.raises(ValueError, match="kind 'concat'"):
        train_reference(stream, ReferenceOptions(kind="deepfm", tasks=TASKS))
