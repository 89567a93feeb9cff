"""Several labels and a sample weight from a CSV file: the mapping, its checks, the batch, a trained model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.config import (
    BatchingConfig,
    CsvMapping,
    FeatureSpec,
    FileSourceConfig,
    SparseFeature,
    load_config,
)
from kelp.consumers.checks import check_source
from kelp.consumers.csv_rows import iter_csv_numbered
from kelp.consumers.errors import SourceUserError
from kelp.consumers.file_source import FileSource
from kelp.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
MULTITASK_MODELS = ROOT / "tests" / "daemon" / "multitask_models"

# like: the first task, rating >= 4; buy: a 0/1 column; stars: the rating itself, a float task.
SPEC = FeatureSpec(
    labels=[{"name": "like"}, {"name": "buy"}, {"name": "stars", "kind": "float"}],
    sparse=[SparseFeature(name="user")],
)


def _mapping(**overrides: Any) -> CsvMapping:
    fields: dict[str, Any] = {
        "label_column": "rating",
        "label_threshold": 4,
        "label_columns": {"buy": "bought", "stars": "rating"},
        "weight_column": "w",
        "sparse_columns": {"user": "user_id"},
    }
    fields.update(overrides)
    return CsvMapping.model_validate(fields)


def _source(path: Path, **overrides: Any) -> FileSourceConfig:
    return FileSourceConfig(path=path, format="csv", csv=_mapping(**overrides))


def _read(cfg: FileSourceConfig, spec: FeatureSpec = SPEC) -> tuple[list[Any], CollectorRegistry]:
    registry = CollectorRegistry()
    return list(FileSource(cfg, spec, BatchingConfig(batch_size=64), registry)), registry


def test_two_more_labels_and_a_weight_land_in_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text("user_id,rating,bought,w\n7,5,1,2\n8,3,0,\n9,4.5,0,0.25\n7,1,1,0\n")
    (batch,) = _read(_source(path))[0]
    assert batch.labels.tolist() == [1.0, 0.0, 1.0, 0.0]  # the threshold makes the first label 0/1
    assert set(batch.extra_labels) == {"buy", "stars"}
    assert batch.extra_labels["buy"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert batch.extra_labels["stars"].tolist() == [5.0, 3.0, 4.5, 1.0]  # ...and only the first
    assert batch.weight is not None
    assert batch.weight.tolist() == [2.0, 1.0, 0.25, 0.0]  # an empty cell weighs 1
    assert batch.sparse["user"].values.tolist() == [7, 8, 9, 7]


def test_bad_later_labels_and_weights_are_rejected_at_their_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ratings.csv"
    rows = [
        "7,5,1,1",  # line 2: good
        "7,5,2,1",  # a binary label that is not 0/1
        "7,5,yes,1",  # not a number
        "7,5,,1",  # no label for buy
        "7,5,1,-1",  # a negative weight
        "7,5,1,nan",
        "7,5,1,inf",
        "7,5,1,heavy",  # not a number
        "7,5,0,0.5",  # line 10: good
    ]
    path.write_text("user_id,rating,bought,w\n" + "\n".join(rows) + "\n")
    spec = FeatureSpec(labels=[{"name": "like"}, {"name": "buy"}], sparse=[SparseFeature(name="user")])
    with caplog.at_level(logging.WARNING, logger="kelp.consumers.deadletter"):
        (batch,), registry = _read(_source(path, label_columns={"buy": "bought"}), spec)
    assert batch.extra_labels["buy"].tolist() == [1.0, 0.0]
    assert batch.weight is not None and batch.weight.tolist() == [1.0, 0.5]
    got = {
        int(r.source.rsplit(":", 1)[1]): (r.reason, r.error)
        for r in caplog.records
        if r.getMessage() == "rejected record"
    }
    assert {line: reason for line, (reason, _) in got.items()} == {
        3: "bad_label",
        4: "bad_type",
        5: "missing_label",
        6: "bad_weight",
        7: "bad_weight",
        8: "bad_weight",
        9: "bad_type",
    }
    assert "buy" in got[4][1] and got[5][1] == "no 'buy' field" and got[9][1] == "weight is str"
    rejected = registry.get_sample_value("kelp_records_rejected_total", {"reason": "bad_weight"})
    assert rejected == 3


def test_a_float_task_takes_any_finite_value(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text("user_id,rating,bought,w\n7,5,1,1\n7,inf,1,1\n")
    batches, registry = _read(_source(path, label_threshold=None, label_column="bought"))
    assert [b.extra_labels["stars"].tolist() for b in batches] == [[5.0]]
    assert registry.get_sample_value("kelp_records_rejected_total", {"reason": "bad_label"}) == 1


def test_a_one_label_csv_without_a_weight_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text("user_id,rating,w\n7,5,3\n8,3,3\n")
    mapping = CsvMapping(label_column="rating", label_threshold=4, sparse_columns={"user": "user_id"})
    messages = [msgpack.unpackb(m) for _line, m in iter_csv_numbered(path, mapping)]
    assert messages == [
        {"v": 1, "label": 1, "dense": {}, "sparse": {"user": 7}},
        {"v": 1, "label": 0, "dense": {}, "sparse": {"user": 8}},
    ]
    spec = FeatureSpec(sparse=[SparseFeature(name="user")])
    (batch,) = _read(FileSourceConfig(path=path, format="csv", csv=mapping), spec)[0]
    assert batch.labels.tolist() == [1.0, 0.0]
    assert batch.extra_labels == {} and batch.weight is None


def test_mapping_mistakes_are_one_line_each_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text("user_id,rating,bought,w\n7,5,1,1\n")

    def problems(spec: FeatureSpec = SPEC, **overrides: Any) -> list[tuple[str, str]]:
        return check_source(_source(path, **overrides), spec)

    assert problems() == []
    assert problems(label_columns={"buy": "bought"}) == [
        ("source.csv.label_columns", "label(s) stars have no column")
    ]
    ((field, message),) = problems(label_columns={"buy": "bought", "stars": "rating", "like": "rating"})
    assert field == "source.csv.label_columns.like"
    assert message == (
        "'like' is not a label after the first of features.labels (the first, 'like', is label_column)"
    )
    ((field, message),) = problems(label_columns={"buy": "purchased", "stars": "rating"})
    assert field == "source.csv.label_columns.buy" and "'purchased' is not among the columns" in message
    ((field, message),) = problems(weight_column="weight")
    assert field == "source.csv.weight_column" and "'weight' is not among the columns" in message
    assert "user_id, rating, bought, w" in message  # names what the header does have
    one_label = FeatureSpec(sparse=[SparseFeature(name="user")])
    ((field, _),) = problems(one_label, label_columns={"buy": "bought"})
    assert field == "source.csv.label_columns.buy"


def test_a_column_the_file_lacks_stops_the_source_when_not_checked_first(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text("user_id,rating,bought\n7,5,1\n")
    with pytest.raises(SourceUserError, match="column 'w' not in its columns"):
        _read(_source(path))


def test_the_daemon_trains_two_labels_from_a_weighted_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kelp.daemon.train import TrainDaemon

    rows = 2000
    rng = np.random.default_rng(5)
    lines = ["d0,d1,user,click,buy,w"]
    for i in range(rows):
        d0, d1 = rng.normal(size=2)
        click, buy = int(d0 + 0.3 * rng.normal() > 0), int(d1 + 0.3 * rng.normal() > 0)
        lines.append(f"{d0:.4f},{d1:.4f},{rng.integers(0, 50)},{click},{buy},{'2' if i % 2 else ''}")
    path = tmp_path / "events.csv"
    path.write_text("\n".join(lines) + "\n")

    monkeypatch.syspath_prepend(str(MULTITASK_MODELS))
    cfg = load_config(ROOT / "examples" / "criteo-kaggle.yaml")  # in-memory store, file source
    cfg.trainer.checkpoint_dir = tmp_path / "checkpoints"
    cfg.trainer.model = "two_heads:TwoHeads"
    cfg.trainer.model_args = {}
    cfg.trainer.dense_optimizer.lr = 0.05
    cfg.publisher.enabled = False
    cfg.metrics.port = free_port()
    cfg.features = FeatureSpec(
        labels=[{"name": "click"}, {"name": "buy"}],
        dense=[{"name": "d0"}, {"name": "d1"}],
        sparse=[{"name": "user"}],
    )
    cfg.source = FileSourceConfig(
        path=path,
        format="csv",
        csv=CsvMapping(
            label_column="click",
            label_columns={"buy": "buy"},
            weight_column="w",
            dense_columns={"d0": "d0", "d1": "d1"},
            sparse_columns={"user": "user"},
        ),
    )
    weights: list[np.ndarray] = []

    def on_step(_step: int, batch: Any, _result: Any) -> None:
        assert set(batch.extra_labels) == {"buy"} and batch.weight is not None
        weights.append(batch.weight)

    report = TrainDaemon(cfg, on_step=on_step).run()
    assert report.samples == rows
    assert sorted(set(np.concatenate(weights).tolist())) == [1.0, 2.0]
    summary = report.summary
    assert summary is not None and list(summary.tasks) == ["click", "buy"]
    for task, metrics in summary.tasks.items():
        assert metrics["auc"] > 0.7, (task, metrics)  # each head learned its own label


@pytest.mark.parametrize("batch_size", [1, 3])
def test_kelp_produce_keeps_every_label_and_weight_when_it_groups_rows(
    tmp_path: Path, batch_size: int
) -> None:
    """Grouped rows keep the first label under its own name, the other labels and the weights."""
    from kelp.consumers.decode import Decoder, Rec
    from kelp.consumers.produce import file_messages

    path = tmp_path / "ratings.csv"
    path.write_text("user_id,rating,bought,w\n7,5,1,2\n8,3,0,\n9,4.5,0,0.25\n7,1,1,0\n")
    messages = list(file_messages(path, "csv", batch_size, _source(path), label="like"))
    assert sum(n for _, n in messages) == 4 and len(messages) == (4 if batch_size == 1 else 2)
    chunk = Decoder(SPEC).decode([Rec("t", 0, i, m) for i, (m, _) in enumerate(messages)])
    assert [(r.reason, r.detail) for r in chunk.rejections] == []
    assert chunk.labels.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert {t: c.tolist() for t, c in chunk.extra_labels.items()} == {
        "buy": [1.0, 0.0, 0.0, 1.0],
        "stars": [5.0, 3.0, 4.5, 1.0],
    }
    assert chunk.weight is not None and chunk.weight.tolist() == [2.0, 1.0, 0.25, 0.0]
