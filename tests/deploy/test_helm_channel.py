"""The chart can put the snapshot channel on its own Redis (one that never evicts its keys).

``config.publisher.redis_url`` takes a URL without credentials (the config is a
ConfigMap); ``secrets.publisher.redisUrl`` names a Secret holding the whole URL,
password included, which every Kelp pod receives as ``KELP_PUBLISHER__REDIS_URL``.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml
from chartkit import (
    NAMESPACE,
    PRODUCTION_VALUES,
    Manifest,
    Render,
    find,
    load_values,
    minimal_values,
    pod_spec,
)

from kelp.config.loader import parse_config

CHANNEL_URL = "redis://kelp-snapshots:6379"


def _kelp_containers(docs: list[Manifest]) -> list[tuple[Manifest, dict[str, Any]]]:
    return [
        (doc, container)
        for doc in docs
        if doc["kind"] in {"StatefulSet", "Deployment", "Pod"}
        for container in pod_spec(doc)["containers"]
    ]


def _secret_refs(container: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        var["name"]: var["valueFrom"]["secretKeyRef"]
        for var in container.get("env", [])
        if "secretKeyRef" in var.get("valueFrom", {})
    }


def test_a_channel_url_without_credentials_goes_into_the_config(render: Render) -> None:
    values = load_values(PRODUCTION_VALUES)
    values["config"]["publisher"] = {**values["config"].get("publisher", {}), "redis_url": CHANNEL_URL}
    docs = render(values)
    data = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    assert data["publisher"]["redis_url"] == CHANNEL_URL
    for _doc, container in _kelp_containers(docs):
        assert "KELP_PUBLISHER__REDIS_URL" not in _secret_refs(container)


def test_a_channel_url_with_a_password_is_refused_under_config(chart: helm.Chart) -> None:
    values = {"config": {"publisher": {"redis_url": "redis://:hunter2@kelp-snapshots:6379"}}}
    with pytest.raises(helm.HelmValuesError) as excinfo:
        chart.render(minimal_values(values), name="kelp", namespace=NAMESPACE, is_install=True)
    assert "at '/config/publisher/redis_url'" in str(excinfo.value)


def test_a_channel_url_secret_reaches_every_kelp_pod(render: Render) -> None:
    values = load_values(PRODUCTION_VALUES)
    values["secrets"]["publisher"] = {"redisUrl": {"existingSecret": "kelp-snapshots-redis", "key": "url"}}
    docs = render(values)
    data = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    containers = _kelp_containers(docs)
    assert {doc["kind"] for doc, _ in containers} == {"StatefulSet", "Deployment", "Pod"}
    for doc, container in containers:
        refs = _secret_refs(container)
        assert refs["KELP_PUBLISHER__REDIS_URL"] == {"name": "kelp-snapshots-redis", "key": "url"}
        env = {name: f"secret:{ref['name']}/{ref['key']}" for name, ref in refs.items()}
        env["KELP_PUBLISHER__REDIS_URL"] = "redis://:pw@kelp-snapshots:6379"  # what the Secret holds
        cfg = parse_config(data, doc["metadata"]["name"], env)
        assert cfg.publisher.redis_url == "redis://:pw@kelp-snapshots:6379"  # the env sets the field


def test_by_default_no_pod_gets_a_channel_url(production_manifests: list[Manifest]) -> None:
    for _doc, container in _kelp_containers(production_manifests):
        assert "KELP_PUBLISHER__REDIS_URL" not in _secret_refs(container)
