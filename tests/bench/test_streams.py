"""The accuracy streams resolve their folders: ``--data DIR`` first, else the samples Kelp ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from kelp.bench.streams import (
    CRITEO_ATTRIBUTION,
    CRITEO_ATTRIBUTION_TASKS,
    MOVIELENS,
    SHIPPED_DATA,
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
