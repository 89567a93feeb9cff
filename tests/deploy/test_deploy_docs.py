"""The values files and snippets in the deployment docs render and give a config Kelp accepts.

``# file: NAME`` blocks are complete values files (and the doc must install
them with ``helm install ... -f NAME``); ``# values snippet`` blocks are
layered on top of the doc's values file, the way a user would add them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import ROOT, Render, find

from kelp.config.loader import parse_config
from kelp.daemon.preflight import problems

DOCS = [ROOT / "docs" / "deploy.md", ROOT / "helm" / "README.md"]
_YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.DOTALL)


def _blocks(doc: Path) -> tuple[str, dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """(values file name, values file, [(snippet title, snippet)]) of one document."""
    files, snippets = [], []
    for block in _YAML_BLOCK.findall(doc.read_text(encoding="utf-8")):
        first = block.splitlines()[0]
        if first.startswith("# file:"):
            files.append((first.removeprefix("# file:").strip(), yaml.safe_load(block)))
        elif first.startswith("# values snippet"):
            snippets.append((first.removeprefix("# values snippet:").strip(), yaml.safe_load(block)))
    assert len(files) == 1, f"{doc}: expected one '# file:' values block, found {len(files)}"
    return files[0][0], files[0][1], snippets


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's rule: maps merge, anything else (lists included) replaces."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _assert_kelp_accepts(docs: list[dict[str, Any]], origin: str) -> None:
    """The trainer (and the joiner, where the values run one) would start with the rendered config."""
    data = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    workloads = [("train", find(docs, "StatefulSet", "-trainer"))]
    workloads += [
        ("join", d) for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-join")
    ]
    for role, workload in workloads:
        container = workload["spec"]["template"]["spec"]["containers"][0]
        env = {var["name"]: var.get("value", "from-secret") for var in container["env"]}
        assert problems(parse_config(data, origin, env), role) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_values_file_installs(doc: Path, render: Render) -> None:
    name, values, _ = _blocks(doc)
    text = doc.read_text(encoding="utf-8")
    assert re.search(rf"helm install \S+ \./helm/kelp .*-f {re.escape(name)}", text), "no helm install -f"
    _assert_kelp_accepts(render(values), f"{doc.name}: {name}")


SNIPPETS = [(doc, title) for doc in DOCS for title, _ in _blocks(doc)[2]]


@pytest.mark.parametrize(("doc", "title"), SNIPPETS, ids=[t for _, t in SNIPPETS])
def test_values_snippet_renders_on_top_of_the_values_file(doc: Path, title: str, render: Render) -> None:
    _, values, snippets = _blocks(doc)
    snippet = dict(snippets)[title]
    _assert_kelp_accepts(render(_merge(values, snippet)), f"{doc.name}: {title}")
