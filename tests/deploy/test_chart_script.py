"""``make chart`` and ``make helm-install`` (scripts/chart.py): the chart checked and installed, no helm.

The make targets call scripts/chart.py with Helm's own library (``helm_python``, pinned in the dev
extras); these tests call the same functions. ``install --dry-run`` goes through Helm's install
action without a cluster (an unreachable kubeconfig, in-memory release storage).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from chartkit import CHART_TOOL, MINIMAL_VALUES, PRODUCTION_VALUES, ROOT, merge_values

_UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
users: [{name: none, user: {token: none}}]
"""


@pytest.fixture(scope="module")
def chart_tool() -> ModuleType:
    return CHART_TOOL


def _write(path: Path, values: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def test_make_targets_call_the_script() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for verb in ("check", "install", "uninstall"):
        assert f"$(PY) scripts/chart.py {verb} " in makefile, verb


def test_check_writes_what_the_pods_read_and_names_what_the_chart_set(
    chart_tool: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "render"
    status = chart_tool.main(["check", "-f", str(PRODUCTION_VALUES), "--namespace", "ml", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    given = yaml.safe_load(PRODUCTION_VALUES.read_text(encoding="utf-8"))["config"]
    written = yaml.safe_load((out / "kelp.yaml").read_text(encoding="utf-8"))
    assert chart_tool.chart_set(given, written) == [
        "serving.auth_token_file = /etc/kelp/auth/token",
        "source.security.ssl_cafile = /etc/kelp/tls/kafka/ca.crt",
        "store.tls.ca_file = /etc/kelp/tls/store/ca.crt",
        "trainer.checkpoint_dir = /var/lib/kelp/checkpoints",
    ]
    assert "set by the chart: trainer.checkpoint_dir = /var/lib/kelp/checkpoints" in printed
    assert "Kelp accepts it for serve, train" in printed
    objects = list(yaml.safe_load_all((out / "manifests.yaml").read_text(encoding="utf-8")))
    kinds = {doc["kind"] for doc in objects}
    assert {"StatefulSet", "Deployment", "ConfigMap", "ServiceMonitor"} <= kinds
    assert not [d for d in objects if "helm.sh/hook" in d["metadata"].get("annotations", {})]


def test_check_refuses_a_config_kelp_refuses(
    chart_tool: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The schema lets max_rows through; Kelp's own start-up checks refuse it on Redis: so does check."""
    over = {"config": {"features": {"table_defaults": {"eviction": {"max_rows": 1000}}}}}
    values = _write(tmp_path / "values.yaml", merge_values(yaml.safe_load(MINIMAL_VALUES.read_text()), over))
    status = chart_tool.main(["check", "-f", str(values), "--out", str(tmp_path / "render")])
    error = capsys.readouterr().err
    assert status == 1
    assert "Kelp refuses the rendered config" in error and "max_rows" in error


def test_files_layer_like_helm_f(chart_tool: ModuleType, tmp_path: Path) -> None:
    base = _write(tmp_path / "a.yaml", {"config": {"source": {"topics": ["a"], "group_id": "g"}}})
    over = _write(tmp_path / "b.yaml", {"config": {"source": {"topics": ["b"]}}})
    assert chart_tool.load_values([base, over]) == {"config": {"source": {"topics": ["b"], "group_id": "g"}}}


def test_install_dry_run_goes_through_helms_install_action(
    chart_tool: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(_write_text(tmp_path / "kubeconfig", _UNREACHABLE_KUBECONFIG)))
    argv = ["install", "-f", str(MINIMAL_VALUES), "--namespace", "ml", "--dry-run", "--out", str(tmp_path)]
    assert chart_tool.main(argv) == 0
    assert "release kelp rendered (dry run) in namespace ml" in capsys.readouterr().out


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
