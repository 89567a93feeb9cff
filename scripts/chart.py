"""Lint, render, check, install and uninstall the Kelp chart with Helm's own library: no helm binary.

``make chart``, ``make helm-install`` and ``make helm-uninstall`` call this. Helm here is the Go
library that ``helm-python-sdk`` ships (pinned in pyproject's dev extras, so ``make setup`` installs
it on a fresh machine; it imports as ``helm_python``), the same one the chart tests render with.

``check`` is what a user runs before installing: it lints the chart with the values files (Helm's
``-f`` rules: maps merge, lists and scalars replace, later files win), renders it, writes the
objects (``manifests.yaml``, without the ``helm test`` hook, ready for ``kubectl apply -f``) and the
Kelp config the pods will read (``kelp.yaml``, the ConfigMap's content), prints every config field
the chart set on top of the user's ``config:``, and checks that config with Kelp's own loader and
start-up checks for each workload (``kelp config validate --for train|serve|join`` without the
network and model checks), with the pods' environment overrides in place::

    .venv/bin/python scripts/chart.py check -f kelp-values.yaml --namespace ml
    .venv/bin/python scripts/chart.py install -f kelp-values.yaml --namespace ml --create-namespace --wait
    .venv/bin/python scripts/chart.py uninstall --namespace ml

``install`` installs the release, or upgrades it when it exists, through the current kubeconfig
(``KUBECONFIG``, else ``~/.kube/config``), keeping the release's history the way Helm does (a
Secret per revision in the namespace). ``--dry-run`` renders through the install action without
contacting the cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART_DIR = ROOT / "helm" / "kelp"
CONFIG_MAP_KEY = "kelp.yaml"
# The Kubernetes version the chart is linted for (the oldest the chart tests validate against).
KUBE_VERSION = "v1.30.0"
# Helm's severities: 2 = warning, 3 = error. Like `helm lint --strict`, a warning fails.
_LINT_FAILS_AT = 2
# The workloads that run Kelp, and the `kelp config validate --for` role each container is.
_ROLES = {"trainer": "train", "serving": "serve", "join": "join"}
_HOOK = "helm.sh/hook"

Manifest = dict[str, Any]


class ChartError(Exception):
    """A problem with the values or the rendered chart, one line per finding."""


def merge_values(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's rule for layering values files: maps merge, anything else (lists included) replaces."""
    out = dict(base)
    for key, value in over.items():
        mergeable = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge_values(out[key], value) if mergeable else value
    return out


def load_values(paths: list[Path]) -> dict[str, Any]:
    """The values files layered in order, as ``helm install -f A -f B`` layers them."""
    values: dict[str, Any] = {}
    for path in paths:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ChartError(f"{path}: a values file is a YAML mapping, got {type(data).__name__}")
        values = merge_values(values, data)
    return values


def lint(values: dict[str, Any]) -> None:
    """``helm lint --strict``: schema, templates and Kubernetes names; any warning or error raises."""
    report = helm.lint(CHART_DIR, values, strict=True, kube_version=KUBE_VERSION)
    messages = [m for m in report["messages"] if m["severity"] >= _LINT_FAILS_AT]
    found = [f"{m['path']}: {m['error'].strip()}" for m in messages]
    if found:
        raise ChartError("helm lint:\n" + "\n".join(found))


def render(values: dict[str, Any], release: str, namespace: str) -> list[Manifest]:
    """Every object ``helm install`` would create (its ``helm test`` hook included), parsed."""
    with helm.Chart.load(CHART_DIR) as chart:
        try:
            rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
        except helm.HelmError as exc:
            raise ChartError(str(exc).strip()) from None
    docs: list[Manifest] = []
    for name, text in sorted(rendered.items()):
        if not name.endswith("NOTES.txt"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def rendered_config(docs: list[Manifest]) -> dict[str, Any]:
    """The Kelp config the pods read: the ``kelp.yaml`` key of the release's config ConfigMap."""
    for doc in docs:
        if doc["kind"] == "ConfigMap" and CONFIG_MAP_KEY in doc.get("data", {}):
            config = yaml.safe_load(doc["data"][CONFIG_MAP_KEY])
            if not isinstance(config, dict):
                raise ChartError(f"{doc['metadata']['name']}: {CONFIG_MAP_KEY} is not a YAML mapping")
            return config
    raise ChartError(f"the chart rendered no ConfigMap with a {CONFIG_MAP_KEY} key")


def chart_set(given: Any, rendered: Any, path: str = "") -> list[str]:
    """``field = value`` for every config field the rendered config has that the user's differs in.

    These are the fields the chart owns (paths that must match its mounts); a user reads them here
    rather than finding them in a pod.
    """
    if isinstance(rendered, dict):
        given = given if isinstance(given, dict) else {}
        found: list[str] = []
        for key, value in rendered.items():
            found += chart_set(given.get(key), value, f"{path}.{key}" if path else key)
        return found
    return [] if given == rendered else [f"{path} = {rendered}"]


def _placeholder_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment, with each Secret or pod-field reference replaced by a placeholder.

    The placeholders are shaped like what the reference holds (a URL for ``*_URL``), so Kelp's loader
    checks the config as the pod will have it; the values themselves are never read.
    """
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "fieldRef" in var["valueFrom"]:
            env[var["name"]] = "pod-" + var["valueFrom"]["fieldRef"]["fieldPath"].replace(".", "-")
        elif var["name"].endswith("_URL"):
            env[var["name"]] = "redis://from-secret:6379"
        else:
            env[var["name"]] = "from-secret"
    return env


def config_problems(docs: list[Manifest]) -> tuple[list[str], list[str]]:
    """(roles checked, problems): Kelp's loader and start-up checks on each workload's view of the config."""
    from kelp.config.loader import parse_config
    from kelp.daemon.preflight import problems
    from kelp.errors import UserError

    config = rendered_config(docs)
    checked: list[str] = []
    found: list[str] = []
    for doc in docs:
        component = doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        if doc["kind"] not in ("StatefulSet", "Deployment") or component not in _ROLES:
            continue
        role = _ROLES[component]
        origin = f"{doc['kind']}/{doc['metadata']['name']}"
        env = _placeholder_env(doc["spec"]["template"]["spec"]["containers"][0])
        try:
            cfg = parse_config(config, origin, env)
        except UserError as exc:
            found.append(str(exc))
            continue
        found += [f"{origin}: {field}: {message}" for field, message in problems(cfg, role)]
        checked.append(role)
    return checked, found


def write_outputs(docs: list[Manifest], out: Path) -> tuple[Path, int, Path]:
    """``manifests.yaml`` (every object but the ``helm test`` hook; its path and object count) and
    ``kelp.yaml`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    objects = [d for d in docs if _HOOK not in d["metadata"].get("annotations", {})]
    manifests = out / "manifests.yaml"
    manifests.write_text(yaml.safe_dump_all(objects, sort_keys=False), encoding="utf-8")
    config = out / CONFIG_MAP_KEY
    config.write_text(yaml.safe_dump(rendered_config(docs), sort_keys=False), encoding="utf-8")
    return manifests, len(objects), config


def check(values_files: list[Path], release: str, namespace: str, out: Path) -> list[str]:
    """Lint, render, write and check; returns the report lines, raises :class:`ChartError` on a problem."""
    values = load_values(values_files)
    lint(values)
    docs = render(values, release, namespace)
    manifests, count, config = write_outputs(docs, out)
    checked, found = config_problems(docs)
    if found:
        raise ChartError("Kelp refuses the rendered config:\n" + "\n".join(found))
    added = chart_set(values.get("config", {}), rendered_config(docs))
    lines = [
        f"helm/kelp, release {release} in namespace {namespace}: lint ok",
        f"  {manifests}: {count} objects (`kubectl apply -f` it, or `make helm-install`)",
        f"  {config}: the Kelp config the pods read; Kelp accepts it for {', '.join(checked)}",
    ]
    lines += [f"  set by the chart: {line}" for line in added] or ["  set by the chart: nothing"]
    lines.append(f"  every field with its effective value: kelp config show {config}")
    return lines


def _kube(args: argparse.Namespace) -> helm.Config:
    storage = "memory" if args.dry_run else None  # a dry run reads and writes no release
    return helm.Config(namespace=args.namespace, storage_driver=storage)


def _exists(cfg: helm.Config, release: str) -> bool:
    try:
        cfg.history(release, max_revisions=1)
    except helm.HelmNotFoundError:
        return False
    return True


def cmd_check(args: argparse.Namespace) -> int:
    for line in check(args.values, args.release, args.namespace, args.out):
        print(line)
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    """Check first (a refused config never reaches the cluster), then install or upgrade."""
    for line in check(args.values, args.release, args.namespace, args.out):
        print(line)
    values = load_values(args.values)
    options: dict[str, Any] = {
        "namespace": args.namespace,
        "timeout": args.timeout,
        "wait": "watcher" if args.wait else None,
        "dry_run": "client" if args.dry_run else None,
    }
    with _kube(args) as cfg:
        if not args.dry_run and _exists(cfg, args.release):
            release = cfg.upgrade(CHART_DIR, args.release, values, **options)
            verb = "upgraded"
        else:
            create = args.create_namespace or None
            release = cfg.install(CHART_DIR, args.release, values, create_namespace=create, **options)
            verb = "rendered (dry run)" if args.dry_run else "installed"
    where = f"namespace {release['namespace']}, revision {release['revision']}"
    print(f"release {release['name']} {verb} in {where}")
    if release.get("notes") and not args.dry_run:
        print(release["notes"])
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    with helm.Config(namespace=args.namespace) as cfg:
        cfg.uninstall(args.release, wait="watcher" if args.wait else None, timeout=args.timeout)
    print(f"release {args.release} uninstalled from namespace {args.namespace}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    for name, handler in (("check", cmd_check), ("install", cmd_install), ("uninstall", cmd_uninstall)):
        verb = verbs.add_parser(name)
        verb.set_defaults(handler=handler)
        verb.add_argument("--release", default="kelp", help="release name (default kelp)")
        verb.add_argument("--namespace", default="kelp", help="namespace (default kelp)")
        if name == "uninstall":
            verb.add_argument("--wait", action="store_true", help="wait until the objects are gone")
            verb.add_argument("--timeout", type=int, default=300, help="seconds (default 300)")
            continue
        verb.add_argument(
            "-f", "--values", type=Path, action="append", required=True, help="values file (repeatable)"
        )
        verb.add_argument(
            "--out", type=Path, default=None, help="where to write the render (default build/chart/RELEASE)"
        )
        if name == "install":
            verb.add_argument("--create-namespace", action="store_true")
            verb.add_argument("--wait", action="store_true", help="wait until the workloads are ready")
            verb.add_argument("--timeout", type=int, default=600, help="seconds (default 600)")
            verb.add_argument("--dry-run", action="store_true", help="render through the install; no cluster")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "out", "unset") is None:
        args.out = ROOT / "build" / "chart" / args.release
    try:
        return int(args.handler(args))
    except (ChartError, OSError, helm.HelmError) as exc:
        print(f"chart: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
