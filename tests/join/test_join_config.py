"""A join config is refused before anything starts, each problem in one line naming its field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kelp.config import parse_config
from kelp.daemon.preflight import preflight
from kelp.errors import ConfigError

from .helpers import join_config_dict

TOPICS = {"imp": "requests", "clicks": "clicks", "out": "events", "dlq": "join-dlq"}


def _validate(tmp_path: Path, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "kelp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", "config", "validate", str(path), "--for", "join"],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_complete_join_config_validates(tmp_path: Path) -> None:
    result = _validate(tmp_path, join_config_dict("127.0.0.1:9092", "redis://127.0.0.1:6379", TOPICS))
    assert result.returncode == 0, result.stderr
    # join.redis_url unset: the waiting state shares the store's Redis, which validate says out loud.
    assert "join.redis_url is not set" in result.stderr and "maxmemory-policy" in result.stderr


def test_a_join_with_its_own_redis_validates_without_the_shared_redis_note(tmp_path: Path) -> None:
    doc = join_config_dict("127.0.0.1:9092", "redis://127.0.0.1:6379", TOPICS)
    doc["join"]["redis_url"] = "redis://127.0.0.1:6380"
    result = _validate(tmp_path, doc)
    assert result.returncode == 0, result.stderr
    assert "join.redis_url is not set" not in result.stderr


def _set(section: str, **values: Any) -> Any:
    def change(doc: dict[str, Any]) -> None:
        doc[section] = {**doc[section], **values}

    return change


def _replace(section: str, value: dict[str, Any]) -> Any:
    def change(doc: dict[str, Any]) -> None:
        doc[section] = value

    return change


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_set("join", actions=[]), "join.actions: no action topic"),
        (_set("join", actions=[{"topic": "clicks", "task": "buy", "window_s": 60}]), "is not a label"),
        (_set("join", item_feature="price"), "join.item_feature: 'price' is not a sparse feature"),
        (_set("join", item_feature=None), "join.actions[0].item_field: matching an item needs"),
        (_set("join", output_topic="clicks"), "output_topic: 'clicks' is also an input"),
        (_set("join", negative_keep_rate=0), "join.negative_keep_rate"),
        (_set("join", max_future_skew_s=-1), "join.max_future_skew_s"),
        (_set("join", max_future_skew_s=float("inf")), "join.max_future_skew_s"),
        (_replace("store", {"backend": "memory"}), "join.redis_url: the waiting impressions need"),
        (_replace("source", {"kind": "file", "path": "x.tsv", "format": "criteo_tsv"}), "source.kind"),
    ],
)
def test_a_broken_join_config_is_refused_naming_the_field(change: Any, expected: str) -> None:
    doc = join_config_dict("127.0.0.1:9092", "redis://127.0.0.1:6379", TOPICS)
    change(doc)
    with pytest.raises(ConfigError) as refused:
        preflight(parse_config(doc, origin="kelp.yaml"), "kelp.yaml", role="join")
    assert expected in str(refused.value)


def test_the_command_line_refuses_it_in_one_line_with_exit_2(tmp_path: Path) -> None:
    doc = join_config_dict("127.0.0.1:9092", "redis://127.0.0.1:6379", TOPICS)
    doc["join"]["actions"] = []
    result = _validate(tmp_path, doc)
    assert result.returncode == 2
    assert "join.actions: no action topic" in result.stderr
    assert "Traceback" not in result.stderr
