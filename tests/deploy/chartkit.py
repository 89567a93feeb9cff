"""Helpers shared by the deployment tests (imported by conftest and the test modules)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "kelp"
PRODUCTION_VALUES = CHART_DIR / "ci" / "production-values.yaml"
# values.yaml holds no Kelp config (Helm would merge it into the user's): this is the smallest one.
MINIMAL_VALUES = CHART_DIR / "ci" / "minimal-values.yaml"
# The chart's files/ is the one source of the dashboard and the alert rules (helm can only package
# files inside the chart); the promtool unit tests sit beside them and .helmignore leaves them out.
MONITORING_DIR = ROOT / "helm" / "kelp" / "files"
DASHBOARD = MONITORING_DIR / "kelp-dashboard.json"
ALERTS = MONITORING_DIR / "kelp-alerts.yaml"
ALERT_TESTS = MONITORING_DIR / "kelp-alerts.test.yaml"
RELEASE = "kelp"
NAMESPACE = "ml"
K8S_VERSION = "1.30.0"

Manifest = dict[str, Any]
# A function that renders the chart with some values (the `render` fixture).
Render = Callable[[dict[str, Any]], list[Manifest]]


def load_values(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path}: expected a mapping"
    return data


def parse_rendered(rendered: dict[str, str]) -> list[Manifest]:
    """Every non-empty YAML document of every rendered template (NOTES.txt excluded)."""
    docs: list[Manifest] = []
    for name, text in sorted(rendered.items()):
        if name.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def find(docs: list[Manifest], kind: str, suffix: str = "") -> Manifest:
    """The one object of ``kind`` whose name ends with ``suffix``."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    names = [d["metadata"]["name"] for d in found]
    assert len(found) == 1, f"expected one {kind} named *{suffix}, got {names}"
    return found[0]


def pod_spec(obj: Manifest) -> dict[str, Any]:
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def _chart_tool() -> ModuleType:
    """scripts/chart.py (``make chart``), loaded once: the tests layer values by its rule, not a copy."""
    spec = importlib.util.spec_from_file_location("kelp_chart_tool", ROOT / "scripts" / "chart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CHART_TOOL = _chart_tool()
merge_values = CHART_TOOL.merge_values


def minimal_values(over: dict[str, Any] | None = None) -> dict[str, Any]:
    """The minimal values (a Kelp config, nothing else) with ``over`` layered on top as ``-f`` would."""
    return merge_values(load_values(MINIMAL_VALUES), over or {})


GROUP_REPLICAS = 3


def group_values() -> dict[str, Any]:
    """The production values with a trainer group: 3 GPU pods under torchrun."""
    values = load_values(PRODUCTION_VALUES)
    values["trainer"]["replicas"] = GROUP_REPLICAS
    return values


def kelp_args(container: dict[str, Any]) -> list[str]:
    """The ``kelp`` arguments of a container: its args, or what torchrun runs after ``-m kelp.cli``."""
    args = list(container["args"])
    if container.get("command") == ["torchrun"]:
        start = args.index("-m")
        assert args[start + 1] == "kelp.cli", args
        return args[start + 2 :]
    assert "command" not in container, container["command"]  # the image's entrypoint: kelp
    return args


def join_values() -> dict[str, Any]:
    """The production values with the joiner on: serving's request log in, one click topic out of it.

    The store is a Redis Cluster, so the joiner's waiting impressions get a standalone Redis of their own.
    """
    values = load_values(PRODUCTION_VALUES)
    values["join"] = {"enabled": True}
    config = values["config"]
    config["serving"]["request_log"] = {"enabled": True, "topic": "ctr-requests"}
    config["join"] = {
        "impressions_topic": "ctr-requests",
        "actions": [{"topic": "ctr-clicks", "task": "click", "window_s": 1800}],
        "redis_url": "rediss://kelp-join-redis.redis.svc:6379",
    }
    return values


VALUE_SETS: dict[str, Callable[[], dict[str, Any]]] = {
    "minimal": minimal_values,
    "production": lambda: load_values(PRODUCTION_VALUES),
    "group": group_values,
    "join": join_values,
}
"""Every value set renders, lints and validates; those but "minimal" build on the production values."""
