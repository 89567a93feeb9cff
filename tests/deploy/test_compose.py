"""The local full stack (deploy/compose.yaml) is valid, checked offline: no Docker, no registry here.

* the compose file against the Compose specification's JSON schema (the copy
  ``check-jsonschema`` vendors, ``vendor/compose-spec.json``), plus what the
  schema cannot see: bind-mount sources exist, named volumes and
  ``depends_on`` targets are declared;
* Prometheus's config with ``promtool check config``, on a directory laid out
  exactly as the compose mounts lay out the container, so the rule file it
  loads is the Helm chart's own;
* Grafana's provisioning files against their documented shape (data source
  and dashboard provider keys), and the provider's folder holds the chart's
  dashboard;
* every Kelp config the stack runs with ``kelp config validate``, for the role
  of the service that reads it.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest
import yaml
from chartkit import ALERTS, DASHBOARD, ROOT

from kelp.cli.main import main as kelp_main

DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yaml"
KELP_IMAGE = "${KELP_IMAGE:-kelp:cpu}"  # what `make image` (scripts/image/build.sh) tags by default
# The role `kelp config validate --for` checks, per Kelp sub-command a service runs.
ROLE_OF_COMMAND = {"train": "train", "produce": "train", "serve": "serve"}

# https://grafana.com/docs/grafana/latest/administration/provisioning/ (data sources, dashboards).
GRAFANA_DATASOURCE_KEYS = {
    "name", "type", "access", "orgId", "uid", "url", "user", "database", "basicAuth", "basicAuthUser",
    "withCredentials", "isDefault", "jsonData", "secureJsonData", "version", "editable",
}  # fmt: skip
GRAFANA_DATASOURCE_FILE_KEYS = {"apiVersion", "datasources", "deleteDatasources", "prune"}
GRAFANA_PROVIDER_KEYS = {
    "name", "orgId", "folder", "folderUid", "type", "disableDeletion", "updateIntervalSeconds",
    "allowUiUpdates", "options",
}  # fmt: skip
GRAFANA_PROVIDER_OPTION_KEYS = {"path", "foldersFromFilesStructure"}
GRAFANA_PROVIDER_FILE_KEYS = {"apiVersion", "providers"}


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def _services() -> dict[str, dict[str, Any]]:
    return _compose()["services"]


def _bind_mounts(service: str) -> dict[PurePosixPath, Path]:
    """Container path -> host path of a service's bind mounts (short syntax, relative to deploy/)."""
    mounts: dict[PurePosixPath, Path] = {}
    for volume in _services()[service].get("volumes", []):
        assert isinstance(volume, str), f"{service}: use the short volume syntax: {volume!r}"
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[PurePosixPath(target)] = (DEPLOY / source).resolve()
    return mounts


def _host_path(service: str, container_path: str) -> Path:
    """The host file a container path of ``service`` resolves to through its bind mounts."""
    wanted = PurePosixPath(container_path)
    for target, source in sorted(_bind_mounts(service).items(), key=lambda kv: -len(kv[0].parts)):
        if wanted == target or target in wanted.parents:
            return source / wanted.relative_to(target)
    raise AssertionError(f"{service}: nothing mounted at {container_path}")


def _mounted_files(service: str, folder: str, pattern: str) -> list[Path]:
    """Host files a service sees in container ``folder`` (a mounted folder's files or files mounted in it)."""
    wanted = PurePosixPath(folder)
    found: list[Path] = []
    for target, source in _bind_mounts(service).items():
        if target == wanted or target in wanted.parents:
            inside = source / wanted.relative_to(target)
            found += sorted(inside.glob(pattern)) if inside.is_dir() else []
        elif target.parent == wanted and target.match(pattern):
            found.append(source)
    return found


def _lay_out(service: str, root: Path) -> None:
    """Copy a service's bind mounts under ``root`` at their container paths (the container's view)."""
    for target, source in _bind_mounts(service).items():
        dest = root / target.relative_to("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest)
        else:
            shutil.copyfile(source, dest)


# ------------------------------------------------------------------ the compose file


def test_compose_file_matches_the_compose_specification() -> None:
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    assert schema["title"] == "Compose Specification"
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(_compose())]
    assert errors == []
    # The validator does refuse what Compose refuses: a misspelt key in a service.
    broken = _compose()
    broken["services"]["redis"]["restrat"] = "always"
    assert any("restrat" in e.message for e in validator.iter_errors(broken))


def test_compose_runs_the_whole_stack() -> None:
    services = _services()
    images = {name: spec.get("image", "") for name, spec in services.items()}
    assert images["kafka"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft
    assert images["redis"].startswith("redis:")
    assert images["prometheus"].startswith("prom/prometheus:")
    assert images["grafana"].startswith("grafana/grafana:")
    commands = {
        name: spec["command"][0] for name, spec in services.items() if spec.get("image") == KELP_IMAGE
    }
    assert commands == {"train": "train", "serve": "serve", "produce": "produce"}


def test_compose_references_resolve() -> None:
    """What the schema cannot see: mounted files exist, volumes and dependencies are declared."""
    doc = _compose()
    services = doc["services"]
    declared = set(doc.get("volumes", {}))
    for name, spec in services.items():
        for volume in spec.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (DEPLOY / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
        assert set(spec.get("depends_on", [])) <= set(services), f"{name}: depends on an unknown service"


def test_monitoring_files_are_the_charts_own() -> None:
    """Prometheus and Grafana load the Helm chart's rule file and dashboard themselves, not copies."""
    assert _host_path("prometheus", "/etc/prometheus/rules/kelp-alerts.yaml") == ALERTS.resolve()
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/kelp.yaml").read_text())
    folder = provider["providers"][0]["options"]["path"]
    assert _host_path("grafana", f"{folder}/kelp-dashboard.json") == DASHBOARD.resolve()
    assert not list(DEPLOY.rglob("*.json")), "deploy/ must not carry its own copy of the dashboard"
    assert not list(DEPLOY.rglob("kelp-alerts*")), "deploy/ must not carry its own copy of the rules"


# ------------------------------------------------------------------ Prometheus


def test_prometheus_config_passes_promtool(promtool: str, tmp_path: Path) -> None:
    _lay_out("prometheus", tmp_path)
    config = tmp_path / "etc/prometheus/prometheus.yml"
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False, timeout=60
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # A rule_files glob that matches nothing passes silently; the chart's rules must really load.
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    n_rules = sum(len(group["rules"]) for group in groups)
    assert "kelp-alerts.yaml" in output and f"SUCCESS: {n_rules} rules found" in output, output


def test_prometheus_scrapes_every_kelp_process() -> None:
    """The scrape targets are the compose services on the ports their Kelp config opens."""
    prometheus = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text(encoding="utf-8"))
    targets = {
        target
        for job in prometheus["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    services = _services()
    kelp_cfg = yaml.safe_load(_host_path("train", services["train"]["command"][2]).read_text())
    assert {f"train:{kelp_cfg['metrics']['port']}", f"serve:{kelp_cfg['serving']['port']}"} <= targets


# ------------------------------------------------------------------ Grafana


def test_grafana_datasource_provisioning_shape() -> None:
    files = sorted((DEPLOY / "grafana/provisioning/datasources").glob("*.yaml"))
    assert files
    sources = []
    for path in files:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert doc["apiVersion"] == 1, path
        assert set(doc) <= GRAFANA_DATASOURCE_FILE_KEYS, path
        for source in doc["datasources"]:
            assert set(source) <= GRAFANA_DATASOURCE_KEYS, (
                f"{path}: unknown keys {set(source) - GRAFANA_DATASOURCE_KEYS}"
            )
            assert {"name", "type"} <= set(source), path
            assert source.get("access", "proxy") in {"proxy", "direct"}, path
            sources.append(source)
    assert sum(bool(s.get("isDefault")) for s in sources) == 1, "exactly one default data source"
    default = next(s for s in sources if s.get("isDefault"))
    # The dashboard's $datasource variable lists data sources of its type; the default is picked.
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variable = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    assert default["type"] == variable["query"] == "prometheus"
    assert default["url"] == "http://prometheus:9090"
    assert "prometheus" in _services()["grafana"].get("depends_on", [])


def test_grafana_dashboard_provider_shape() -> None:
    files = sorted((DEPLOY / "grafana/provisioning/dashboards").glob("*.yaml"))
    assert files
    for path in files:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert doc["apiVersion"] == 1, path
        assert set(doc) <= GRAFANA_PROVIDER_FILE_KEYS, path
        for provider in doc["providers"]:
            assert set(provider) <= GRAFANA_PROVIDER_KEYS, (
                f"{path}: unknown keys {set(provider) - GRAFANA_PROVIDER_KEYS}"
            )
            assert provider["name"] and provider.get("type", "file") == "file", path
            assert set(provider["options"]) <= GRAFANA_PROVIDER_OPTION_KEYS, path
            dashboards = _mounted_files("grafana", provider["options"]["path"], "*.json")
            assert dashboards, f"{path}: no dashboard mounted under {provider['options']['path']}"
            for dashboard in dashboards:
                assert json.loads(dashboard.read_text(encoding="utf-8"))["panels"], dashboard


# ------------------------------------------------------------------ Kelp configs


def _kelp_configs() -> list[tuple[str, str, Path]]:
    """(service, role, host path) of every ``--config`` a Kelp service of the stack runs with."""
    found = []
    for name, spec in _services().items():
        if spec.get("image") != KELP_IMAGE:
            continue
        command = spec["command"]
        config = command[command.index("--config") + 1]
        found.append((name, ROLE_OF_COMMAND[command[0]], _host_path(name, config)))
    return found


def test_every_stack_config_is_checked() -> None:
    """Every Kelp config beside the compose file is run by a service (none unused, none missing)."""
    used = {path for _, _, path in _kelp_configs()}
    assert used == {p.resolve() for p in (DEPLOY / "compose").glob("*.yaml")}


@pytest.fixture
def _root_logging() -> Iterator[None]:
    """The CLI installs its own root handler; give the test run's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers, root.level = handlers, level


@pytest.mark.parametrize(
    ("service", "role", "config"), _kelp_configs(), ids=[f"{s}-{r}" for s, r, _ in _kelp_configs()]
)
@pytest.mark.usefixtures("_root_logging")
def test_kelp_config_validate(
    service: str, role: str, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kelp_main(["config", "validate", "--for", role, str(config)]) == 0
    assert f"{config}: ok" in capsys.readouterr().out
