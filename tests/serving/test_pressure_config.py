"""The settings that bound a replica under pressure: validated, and handed to what they bound.

``serving.request_log.queue_bytes`` bounds the memory the request log holds
while Kafka is down; ``serving.worker_healthcheck_timeout_s`` is how long
uvicorn's supervisor waits for a worker's health ping before killing it (a
starting worker imports torch and loads its model first).
"""

from __future__ import annotations

from typing import Any

import pytest
import uvicorn

from kelp.config import ServingConfig
from kelp.errors import UserError
from kelp.serving.process import uvicorn_options


def _serving(**fields: Any) -> ServingConfig:
    return ServingConfig.model_validate(fields)


def test_defaults_bound_the_request_log_queue_and_give_workers_time_to_start() -> None:
    serving = _serving()
    assert serving.request_log.queue_bytes == 64 * 1024 * 1024
    assert serving.worker_healthcheck_timeout_s == 30


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"request_log": {"queue_bytes": 1000}}, "queue_bytes"),
        ({"worker_healthcheck_timeout_s": 0}, "worker_healthcheck_timeout_s"),
    ],
)
def test_a_bad_bound_is_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises((ValueError, UserError), match=named):
        _serving(**fields)


def test_uvicorn_gets_the_worker_healthcheck_timeout() -> None:
    options = uvicorn_options(_serving(worker_healthcheck_timeout_s=45))
    config = uvicorn.Config("kelp.serving.app:app_from_env", factory=True, workers=2, **options)
    assert config.timeout_worker_healthcheck == 45
