"""A snapshot channel that refuses the trainer's credentials stops the trainer with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from kelp.config import PublisherConfig
from kelp.daemon.train import TrainDaemon
from kelp.errors import RedisAuthError
from kelp.harness import RedisServer

from .conftest import base_config

pytestmark = pytest.mark.integration


def test_wrong_channel_password_is_fatal_not_retried_forever(tmp_path: Path) -> None:
    with RedisServer(password="right-pw") as server:
        cfg = base_config(tmp_path)
        cfg.publisher = PublisherConfig(
            channel="redis", interval_s=0.01, redis_url=f"redis://:wrong-pw@127.0.0.1:{server.port}"
        )
        daemon = TrainDaemon(cfg, http=False)
        with pytest.raises(RedisAuthError) as err:
            daemon.run()
    message = str(err.value)
    assert f"127.0.0.1:{server.port}" in message and "wrong-pw" not in message
    assert "\n" not in message
    assert daemon.report.steps >= 1  # it trained, then the first publish stopped it
