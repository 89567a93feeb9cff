"""The synthetic long-tail stream and the first-order comparison of ``kelp bench accuracy``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kelp.bench.accuracy import train_on_event_time
from kelp.bench.accuracy_first_order import VARIANTS, first_order_comparison, stream_config
from kelp.bench.longtail import LongTailSpec, longtail_stream


def test_the_longtail_stream_is_deterministic_rare_and_long_tailed() -> None:
    spec = LongTailSpec(n_events=20_000)
    stream = longtail_stream(spec)
    again = longtail_stream(spec)
    assert np.array_equal(stream.ids, again.ids) and np.array_equal(stream.labels, again.labels)
    assert not np.array_equal(stream.labels, longtail_stream(LongTailSpec(n_events=20_000, seed=1)).labels)
    assert stream.features == ("user", "ad", "site") and stream.ids.shape == (20_000, 3)
    assert 0.001 < stream.labels.mean() < 0.006  # a rare positive class, about positive_rate
    _, user_counts = np.unique(stream.ids[:, 0], return_counts=True)
    assert (user_counts == 1).mean() > 0.5  # most users are seen once
    assert np.all(np.diff(stream.ts) > 0)


def test_each_variant_trains_its_first_order_form(tmp_path: Path) -> None:
    stream = longtail_stream(LongTailSpec(n_events=3_000))
    data = Path("unused")  # the example's own data path is replaced by the stream's JSON Lines
    per_id = stream_config(stream, tmp_path, "per_id", min_count=3, seed=1, data_dir=data)
    unscaled = stream_config(stream, tmp_path, "per_id_unscaled", min_count=3, seed=1, data_dir=data)
    projection = stream_config(stream, tmp_path, "projection", min_count=3, seed=1, data_dir=data)
    assert {t.dim for t in per_id.features.tables} == {17}
    assert {t.dim for t in projection.features.tables} == {16}
    assert {t.admission.min_count for t in per_id.features.tables} == {3}
    assert per_id.trainer.model_args == {"first_order": "per_id"}
    assert unscaled.trainer.model_args == {"first_order": "per_id", "per_id_grad_scale": 1.0}
    out = first_order_comparison(
        [stream], work=tmp_path, data_dir=data, train=train_on_event_time, min_counts=(1,), seeds=(0,)
    )
    assert [e["variant"] for e in out] == list(VARIANTS)
    for entry in out:
        assert entry["samples"] == 3_000 and 0.0 < entry["auc"] < 1.0 and entry["log_loss"] > 0.0
    # the scale changes what the per-id weights learn: the two per_id forms differ
    assert out[1]["seed_aucs"] != out[2]["seed_aucs"] or out[1]["log_loss"] != out[2]["log_loss"]
