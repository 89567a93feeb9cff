"""``kelp bench accuracy``'s two-task runs on tiny slices: both sides train both tasks.

criteo-attribution: the sample Kelp ships has no conversion column, so the
slice here is the first rows of that sample with a **synthetic** conversion
label added (a click whose cat4 id is a multiple of 3). Taobao: the first rows
of the real UserBehavior file from the data folder (engaged and buy), skipped
where that folder lacks it. Enough to check that Kelp's daemon and the
reference train both labels on the same rows and every key is there and
finite. No threshold on any AUC (figures are measured by the bench, not
asserted by tests).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kelp.bench.accuracy_kelp import default_data_dir
from kelp.bench.accuracy_tasks import (
    CRITEO_ATTRIBUTION_RUN,
    TAOBAO_RUN,
    TaskStream,
    events_from_csv,
    multitask_parity,
)
from kelp.bench.reference import ReferenceOptions, train_reference
from kelp.bench.streams import (
    CRITEO_ATTRIBUTION,
    SHIPPED_DATA,
    TAOBAO,
    TAOBAO_FILE,
    TAOBAO_TASKS,
    load_stream,
)

PREFIX = CRITEO_ATTRIBUTION_RUN.prefix
ROWS = 2048
TAOBAO_ROWS = 4096
TAOBAO_DATA = default_data_dir() / TAOBAO / TAOBAO_FILE
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


def _assert_every_key_finite(run: TaskStream, out: dict[str, Any], samples: int) -> None:
    prefix = run.prefix
    assert out[f"{prefix}_samples"] == samples
    for task in run.tasks:
        for key in PER_TASK:
            value = out[f"{prefix}_{task}_{key}"]
            assert value is not None and math.isfinite(value), (task, key, value)
        assert 0.0 < out[f"{prefix}_{task}_auc"] < 1.0 and out[f"{prefix}_{task}_log_loss"] > 0.0
        assert out[f"{prefix}_{task}_auc_gap"] == pytest.approx(
            out[f"{prefix}_{task}_auc"] - out[f"{prefix}_{task}_reference_auc"], abs=2e-4
        )


def test_two_tasks_train_on_both_sides_and_every_key_is_finite(tmp_path: Path) -> None:
    data_dir = _slice(tmp_path / "data", conversion=True)
    stream = load_stream(CRITEO_ATTRIBUTION, data_dir)
    assert stream.has_labels(TASKS) and stream.extra_labels["conversion"].sum() > 0
    (tmp_path / "work").mkdir()
    out, curves = multitask_parity(CRITEO_ATTRIBUTION_RUN, data_dir, tmp_path / "work", None)
    _assert_every_key_finite(CRITEO_ATTRIBUTION_RUN, out, ROWS)
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
    out, curves = multitask_parity(CRITEO_ATTRIBUTION_RUN, data_dir, tmp_path, None)
    assert list(out) == [f"{PREFIX}_skipped"] and curves == []
    assert "no conversion column" in out[f"{PREFIX}_skipped"]


@pytest.mark.skipif(not TAOBAO_DATA.is_file(), reason=f"{TAOBAO_DATA} not found (Kelp does not ship it)")
def test_taobao_engaged_and_buy_train_on_both_sides_on_the_real_rows(tmp_path: Path) -> None:
    """The first rows of the real file, through the bench's own code; labels checked against the raw CSV."""
    data_dir = default_data_dir()
    out, curves = multitask_parity(TAOBAO_RUN, data_dir, tmp_path, TAOBAO_ROWS)
    _assert_every_key_finite(TAOBAO_RUN, out, TAOBAO_ROWS)
    with TAOBAO_DATA.open(encoding="utf-8") as fh:
        behaviors = [line.split(",")[3] for _, line in zip(range(TAOBAO_ROWS), fh, strict=False)]
    # the labels both sides trained (compared sample by sample inside the run) are the raw file's
    engaged = np.mean([b != "pv" for b in behaviors])
    buy = np.mean([b == "buy" for b in behaviors])
    assert out["taobao_multitask_engaged_positive_rate"] == pytest.approx(engaged, abs=1e-5)
    assert out["taobao_multitask_buy_positive_rate"] == pytest.approx(buy, abs=1e-5)
    assert 0.0 < buy < engaged < 0.5
    assert [c.label for c in curves] == [
        f"{side} {t}" for t in TAOBAO_TASKS for side in ("Kelp", "reference")
    ]
    # the JSON Lines Kelp reads and the reference's stream: the same ids and labels, row by row
    path = events_from_csv(TAOBAO_RUN, TAOBAO_DATA, tmp_path / "events.jsonl", TAOBAO_ROWS)
    events = [json.loads(line) for line in path.open(encoding="utf-8")]
    stream = load_stream(TAOBAO, data_dir).head(TAOBAO_ROWS)
    for task in TAOBAO_TASKS:
        assert np.array_equal([e[task] for e in events], stream.task_labels([task])[:, 0])
    for f, feature in enumerate(stream.features):
        assert [int(e[feature]) for e in events] == stream.ids[:, f].tolist()


def test_a_data_folder_without_taobao_is_skipped_with_the_reason(tmp_path: Path) -> None:
    out, curves = multitask_parity(TAOBAO_RUN, tmp_path, tmp_path, 100)
    assert list(out) == ["taobao_multitask_skipped"] and curves == []
    assert f"{TAOBAO_FILE} not found" in out["taobao_multitask_skipped"]


def test_the_reference_trains_one_head_per_task_on_the_named_labels(tmp_path: Path) -> None:
    stream = load_stream(CRITEO_ATTRIBUTION, _slice(tmp_path, conversion=True)).head(512)
    run = train_reference(stream, ReferenceOptions(kind="concat", tasks=TASKS))
    assert run.logits.shape == run.labels.shape == (512, 2)
    assert np.array_equal(run.labels[:, 0], stream.labels)
    assert np.array_equal(run.labels[:, 1], stream.extra_labels["conversion"])
    assert not np.allclose(run.logits[:, 0], run.logits[:, 1])  # two heads, not one logit twice
    with pytest.raises(ValueError, match="kind 'concat'"):
        train_reference(stream, ReferenceOptions(kind="deepfm", tasks=TASKS))
