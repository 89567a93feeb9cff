"""Property-based fuzzing of the app's own OpenAPI spec: no input may produce a server error.

Runs in-process (ASGI) against a replica on the real Redis with a model
loaded, so valid cases go all the way through the store and the model.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from kelp.serving import ServingReplica, create_app

from .helpers import constant_model, publisher_for

pytestmark = pytest.mark.integration


@pytest.fixture
def fuzz_app(cfg) -> Iterator[object]:  # type: ignore[no-untyped-def]
    publisher = publisher_for(cfg)
    publisher.maybe_publish(constant_model(cfg, 0.1), step=1, offsets={})
    replica = ServingReplica(cfg, CollectorRegistry())
    replica.start()
    assert replica.slot.wait(10)
    yield create_app(replica, manage_lifecycle=False)
    replica.close()
    publisher.close()


def test_no_server_errors_and_responses_match_the_spec(fuzz_app) -> None:  # type: ignore[no-untyped-def]
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    cases = 0

    for operation in schema.get_all_operations():
        op = operation.ok()
        # Valid inputs through the whole path, and (for the POST bodies) deliberately invalid ones.
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if op.method.upper() == "POST" else [])
        for mode in modes:

            @given(op.as_strategy(generation_mode=mode))
            @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def run(case) -> None:  # type: ignore[no-untyped-def]
                nonlocal cases
                response = case.call()
                cases += 1
                assert response.status_code < 500, (
                    f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
                )
                if response.status_code != 413:  # a body-size refusal comes from middleware, before the route
                    case.validate_response(response, checks=checks)

            run()
    assert cases >= 100
