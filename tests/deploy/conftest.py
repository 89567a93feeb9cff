"""Fixtures for the deployment checks: the Helm chart rendered offline, and promtool.

Everything here runs without a cluster. The chart is loaded and rendered by
Helm's own Go library (``helm_python``, PyPI ``helm-python-sdk``), so template
and schema behaviour is what ``helm install`` does.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
from chartkit import CHART_DIR, NAMESPACE, RELEASE, VALUE_SETS, Manifest, Render, parse_rendered


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: helm.Chart) -> Render:
    """Render like ``helm template`` (schema validation included); returns the parsed objects."""

    def _render(values: dict[str, Any]) -> list[Manifest]:
        return parse_rendered(chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True))

    return _render


@pytest.fixture(scope="session", params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, VALUE_SETS[request.param]()


@pytest.fixture(scope="session")
def manifests(render: Render, value_set: tuple[str, dict[str, Any]]) -> list[Manifest]:
    return render(value_set[1])


@pytest.fixture(scope="session")
def production_manifests(render: Render) -> list[Manifest]:
    return render(VALUE_SETS["production"]())


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip(
            "promtool not found: run `bash scripts/install-system-deps.sh --with-test-tools` "
            "(Debian package prometheus); `make test` does this"
        )
    return found
