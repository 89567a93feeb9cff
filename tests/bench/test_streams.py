"""The accuracy streams resolve their folders: ``--data DIR`` first, else the samples Kelp ships."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kelp.bench.accuracy_kelp import default_data_dir
from kelp.bench.streams import (
    CRITEO_ATTRIBUTION,
    CRITEO_ATTRIBUTION_TASKS,
    MOVIELENS,
    SHIPPED_DATA,
    TAOBAO,
    TAOBAO_FILE,
    TAOBAO_TASKS,
    load_stream,
    stream_folder,
)
from kelp.errors import UserError


def test_a_data_dir_without_criteo_attribution_falls_back_to_the_shipped_sample(tmp_path: Path) -> None:
    assert stream_folder(CRITEO_ATTRIBUTION, tmp_path) == SHIPPED_DATA / CRITEO_ATTRIBUTION
    stream = load_stream(CRITEO_ATTRIBUTION, tmp_path)
    assert len(stream.labels) == 115_382
    assert stream.features == ("cat1", "cat4", "cat6", "cat8", "cat9")


def test_a_data_dir_that_holds_the_stream_wins(tmp_path: Path) -> None:
    (tmp_path / CRITEO_ATTRIBUTION).mkdir()
    assert stream_folder(CRITEO_ATTRIBUTION, tmp_path) == tmp_path / CRITEO_ATTRIBUTION


def test_movielens_is_not_shipped_and_says_where_to_get_it(tmp_path: Path) -> None:
    assert not (SHIPPED_DATA / MOVIELENS).exists()
    with pytest.raises(UserError, match=r"grouplens\.org"):
        load_stream(MOVIELENS, tmp_path)


def test_the_shipped_criteo_attribution_sample_has_no_conversion_label(tmp_path: Path) -> None:
    stream = load_stream(CRITEO_ATTRIBUTION, tmp_path)
    assert stream.label == "click" and dict(stream.extra_labels) == {}
    assert not stream.has_labels(CRITEO_ATTRIBUTION_TASKS)
    with pytest.raises(KeyError, match="no label 'conversion'"):
        stream.task_labels(CRITEO_ATTRIBUTION_TASKS)
    head = stream.head(10)
    assert head.label == "click" and head.task_labels(["click"]).shape == (10, 1)


def test_taobao_is_not_shipped_and_says_why(tmp_path: Path) -> None:
    assert not (SHIPPED_DATA / TAOBAO).exists()
    with pytest.raises(UserError, match="Tianchi's terms"):
        load_stream(TAOBAO, tmp_path)


@pytest.mark.skipif(
    not (default_data_dir() / TAOBAO / TAOBAO_FILE).is_file(),
    reason=f"{default_data_dir() / TAOBAO} does not hold {TAOBAO_FILE} (Kelp does not ship it)",
)
def test_taobao_is_one_sample_per_event_in_time_order_with_engaged_and_buy() -> None:
    stream = load_stream(TAOBAO, default_data_dir())
    assert len(stream.labels) == 96_168 and stream.features == ("user", "item", "category")
    assert stream.label == "engaged" and stream.has_labels(TAOBAO_TASKS)
    labels = stream.task_labels(TAOBAO_TASKS)
    # the data README's counts: 5,292 cart + 2,959 fav + 2,144 buy beyond 85,773 page views
    assert labels[:, 0].sum() == 5_292 + 2_959 + 2_144 and labels[:, 1].sum() == 2_144
    assert np.all(labels[:, 1] <= labels[:, 0])  # a purchase is an engagement
    assert np.all(np.diff(stream.ts) >= 0)  # replayed in the file's (time) order
    assert stream.ids[0].tolist() == [543462, 1715, 1464116]
