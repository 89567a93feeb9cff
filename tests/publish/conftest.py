"""Publish fixtures: a small config and both snapshot channels on real backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from serving.helpers import small_config

from kelp.config import KelpConfig
from kelp.publish import SnapshotChannel
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.redis_channel import RedisChannel


@pytest.fixture
def cfg(redis_url: str, tmp_path: Path) -> KelpConfig:
    return small_config(redis_url, tmp_path)


@pytest.fixture(params=["redis", "filesystem"])
def channel(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SnapshotChannel]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        ch: SnapshotChannel = RedisChannel(redis.Redis.from_url(url), "pubtest", url)
    else:
        ch = FilesystemChannel(tmp_path / "snapshots")
    yield ch
    ch.close()
