"""A Kubernetes control plane's binaries, built from the Go module proxy into a cache this set-up owns.

The chart tests install the Helm chart on a real API server. No Kubernetes release is downloadable
here but through the Go module proxy, so everything is built from source with the machine's ``go``:

- kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from ``k8s.io/kubernetes``.
  That module cannot be ``go install``-ed (its go.mod replaces each ``k8s.io/*`` staging module with
  a local folder), so a generated wrapper module requires it and replaces each staging module with
  its published ``v0.<minor>.<patch>`` instead;
- etcd 3.6 the same way (Debian's etcd 3.4 starts but breaks the watches and node leases kwok needs);
- kwok, whose fake node makes Pods Running without a container runtime, and its stages file;
- the ``helm`` CLI the docs name (plain ``go install``).

Everything lives under ``$KELP_CACHE_DIR/k8s-<version>/`` (default ``~/.cache/kelp``), never in the
repository: ``bin/`` for the binaries, ``src/`` for the wrapper modules. Go's module and build
caches go to ``go/`` there and are removed after a successful build (several GB that only a
rebuild would read). A finished build leaves a stamp, so later runs cost nothing; a file lock makes
concurrent first builds wait for one another; a failed build leaves its log's tail in ``failed``
so that the tests that need the binaries skip with the reason.

Run ``python -m kelp.harness.k8s_dist`` to build ahead of time (``make k8s-binaries``, part of
``make test``, does).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kelp.errors import MissingBinaryError
from kelp.harness.kafka_dist import cache_root

__all__ = [
    "ALL_PARTS",
    "ETCD_VERSION",
    "HELM_VERSION",
    "K8S_VERSION",
    "KWOK_VERSION",
    "K8sBinaries",
    "build_failure",
    "ensure_k8s_binaries",
    "go_binary",
    "k8s_binaries",
]

K8S_VERSION = os.environ.get("KELP_K8S_VERSION", "v1.37.2")
ETCD_VERSION = os.environ.get("KELP_ETCD_VERSION", "v3.6.16")
KWOK_VERSION = os.environ.get("KELP_KWOK_VERSION", "v0.8.0")
HELM_VERSION = os.environ.get("KELP_HELM_VERSION", "v3.22.0")
# What ``make k8s-binaries`` builds, cheapest first (a failure costs the least time).
ALL_PARTS = ("helm", "etcd", "kwok", "kubernetes")

_KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# Staging modules that k8s.io/kubernetes replaces but the proxy does not serve at the release's
# version; nothing the four commands import needs them.
_UNPUBLISHED_STAGING = frozenset({"k8s.io/sample-cli-plugin", "k8s.io/sample-controller"})
# kwok's stock stages: the node comes up and keeps its lease; Pods become Ready, Job Pods complete,
# deleted Pods go away. (kelp.harness.k8s adds its own.)
_KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)
_BUILD_TIMEOUT_S = 3600
_GB = 1 << 30
# One compiler process of the Kubernetes build peaks near this much memory.
_COMPILE_PEAK_BYTES = 3 * _GB


class K8sBinaries:
    """Where the built binaries are: ``bin/<name>`` and the kwok stages file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.kwok_stages = root / "kwok-stages.yaml"  # kwok's stock stages

    def path(self, name: str) -> str:
        """Absolute path of one binary (``etcd``, ``kube-apiserver``, ``kwok``, ``helm``, ...)."""
        return str(self.bin / name)


def _root() -> Path:
    return cache_root() / f"k8s-{K8S_VERSION}"


def _stamp(part: str) -> Path:
    """Written once ``part`` is built at its pinned version (a new pin builds it again)."""
    return _root() / "stamps" / f"{part}-{_PARTS[part][0]}"


def _failed() -> Path:
    return _root() / "failed"


def go_binary() -> str | None:
    """The ``go`` on PATH, or the official tarball's /usr/local/go/bin/go."""
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if fallback.is_file() else None


def k8s_binaries(parts: Iterable[str] = ALL_PARTS) -> K8sBinaries | None:
    """The built binaries when every one of ``parts`` is built at its pinned version, else None."""
    return K8sBinaries(_root()) if all(_stamp(part).is_file() for part in parts) else None


def build_failure() -> str | None:
    """The tail of the last failed build's log (cleared by a successful build), or None."""
    try:
        return _failed().read_text()
    except OSError:
        return None


def _build_parallelism() -> int:
    """``go build -p``: the cores, but no more compilers at once than the free memory holds."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        kib = next(int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemAvailable:"))
        by_memory = max(1, kib * 1024 // _COMPILE_PEAK_BYTES)
    except (OSError, StopIteration, ValueError):
        by_memory = 1
    return max(1, min(os.cpu_count() or 1, by_memory))


class _GoBuild:
    """Runs ``go`` with this cache's module and build caches, low priority, logging to one file."""

    def __init__(self, go: str, root: Path, log: Path) -> None:
        self.go = go
        self.root = root
        self.log = log
        self.env = {
            **os.environ,
            "GOMODCACHE": str(root / "go" / "mod"),
            "GOCACHE": str(root / "go" / "build"),
            "GOFLAGS": "-trimpath",
            "GOTOOLCHAIN": "local",
            "CGO_ENABLED": "0",
            "GOBIN": str(root / "bin"),
        }
        self._nice = ["nice", "-n", "19"] if shutil.which("nice") else []

    def run(self, args: Iterable[str], cwd: Path) -> str:
        """``go args...`` in ``cwd``; its stdout, or :class:`MissingBinaryError` with the log's tail."""
        argv = [*self._nice, self.go, *args]
        started = time.monotonic()
        with open(self.log, "a") as log:
            log.write(f"$ {' '.join(argv)}  (in {cwd})\n")
            log.flush()
            done = subprocess.run(
                argv, cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=log, text=True,
                timeout=_BUILD_TIMEOUT_S, check=False,
            )  # fmt: skip
            log.write(f"# exit {done.returncode} after {time.monotonic() - started:.0f}s\n")
        if done.returncode != 0:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
            raise MissingBinaryError(f"`go {' '.join(args)}` failed (log {self.log}):\n{tail}")
        return done.stdout

    def module_dir(self, module: str) -> Path:
        """The extracted folder of ``module@version`` in the module cache (downloading it)."""
        with_dir = json.loads(self.run(["mod", "download", "-json", module], cwd=self.root))
        return Path(with_dir["Dir"])


def kubernetes_wrapper_gomod(kubernetes_gomod: str, version: str) -> str:
    """The wrapper module's go.mod: require ``k8s.io/kubernetes`` and replace each staging module.

    ``kubernetes_gomod`` is k8s.io/kubernetes's own go.mod, whose ``replace ( ... )`` block lists the
    staging modules (``k8s.io/api => ./staging/src/k8s.io/api``); each becomes ``k8s.io/api =>
    k8s.io/api v0.<minor>.<patch>``.

    >>> gomod = "module k8s.io/kubernetes\\nreplace (\\n\\tk8s.io/api => ./staging/src/k8s.io/api\\n)\\n"
    >>> print(kubernetes_wrapper_gomod(gomod, "v1.37.2"))  # doctest: +NORMALIZE_WHITESPACE
    module k8swrapper
    go 1.26.0
    require k8s.io/kubernetes v1.37.2
    replace (
        k8s.io/api => k8s.io/api v0.37.2
    )
    """
    staging = "v0." + version.removeprefix("v1.")
    modules: list[str] = []
    inside = False
    for line in kubernetes_gomod.splitlines():
        stripped = line.strip()
        if stripped.startswith("replace ("):
            inside = True
        elif inside and stripped == ")":
            inside = False
        elif inside and "=>" in stripped:
            modules.append(stripped.split()[0])
    if not modules:
        raise MissingBinaryError(f"k8s.io/kubernetes@{version}: its go.mod has no replace block")
    replaces = [f"\t{m} => {m} {staging}" for m in modules if m not in _UNPUBLISHED_STAGING]
    head = ["module k8swrapper", "", "go 1.26.0", "", f"require k8s.io/kubernetes {version}", ""]
    return "\n".join([*head, "replace (", *replaces, ")", ""])


def _tools_go(imports: Iterable[str]) -> str:
    lines = "\n".join(f'\t_ "{i}"' for i in imports)
    return f"//go:build tools\n\npackage tools\n\nimport (\n{lines}\n)\n"


def _version_ldflags(version: str) -> str:
    """What ``kubectl version`` and the API server's /version report (set by Kubernetes' own build)."""
    minor = version.split(".")[1]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor=1", f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean", f"-X {pkg}.gitCommit={'0' * 40}",
        ]  # fmt: skip
    return " ".join(flags)


def _build_kubernetes(go: _GoBuild, root: Path) -> None:
    src = root / "src" / "kubernetes"
    src.mkdir(parents=True, exist_ok=True)
    info = json.loads(go.run(["mod", "download", "-json", f"k8s.io/kubernetes@{K8S_VERSION}"], cwd=root))
    (src / "go.mod").write_text(kubernetes_wrapper_gomod(Path(info["GoMod"]).read_text(), K8S_VERSION))
    commands = [f"k8s.io/kubernetes/cmd/{c}" for c in _KUBE_COMMANDS]
    (src / "tools.go").write_text(_tools_go(commands))
    go.run(["mod", "tidy"], cwd=src)
    flags = ["-p", str(_build_parallelism()), "-ldflags", _version_ldflags(K8S_VERSION)]
    go.run(["build", *flags, "-o", f"{root / 'bin'}/", *commands], cwd=src)


def _build_etcd(go: _GoBuild, root: Path) -> None:
    src = root / "src" / "etcd"
    src.mkdir(parents=True, exist_ok=True)
    server = "go.etcd.io/etcd/server/v3"
    (src / "go.mod").write_text(f"module etcdwrapper\n\ngo 1.26.0\n\nrequire {server} {ETCD_VERSION}\n")
    (src / "tools.go").write_text(_tools_go([server]))
    go.run(["mod", "tidy"], cwd=src)
    go.run(["build", "-ldflags", "-s -w", "-o", str(root / "bin" / "etcd"), server], cwd=src)


def _build_kwok(go: _GoBuild, root: Path) -> None:
    """kwok (plain ``go install``: no replace directives), and its stock stages joined in one file."""
    go.run(["install", "-ldflags", "-s -w", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"], cwd=root)
    stages = go.module_dir(f"sigs.k8s.io/kwok@{KWOK_VERSION}") / "kustomize" / "stage"
    parts = [(stages / name).read_text() for name in _KWOK_STAGES]
    (root / "kwok-stages.yaml").write_text("".join(f"---\n{part}" for part in parts))


def _build_helm(go: _GoBuild, root: Path) -> None:
    helm_ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"
    go.run(["install", "-ldflags", helm_ldflags, f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"], cwd=root)


# How each of ALL_PARTS is built, and at which version.
_PARTS: dict[str, tuple[str, Callable[[_GoBuild, Path], None]]] = {
    "helm": (HELM_VERSION, _build_helm),
    "etcd": (ETCD_VERSION, _build_etcd),
    "kwok": (KWOK_VERSION, _build_kwok),
    "kubernetes": (K8S_VERSION, _build_kubernetes),
}


def _drop_go_caches(go: _GoBuild, root: Path) -> None:
    """Remove the module and build caches (GBs only a rebuild reads); the module cache is read-only."""
    if os.environ.get("KELP_K8S_KEEP_GO_CACHE"):
        return
    subprocess.run([go.go, "clean", "-modcache"], env=go.env, capture_output=True, timeout=600, check=False)
    shutil.rmtree(root / "go", ignore_errors=True)


def ensure_k8s_binaries(parts: Iterable[str] = ALL_PARTS) -> K8sBinaries:
    """The built binaries, building the missing ones (the Kubernetes part takes many minutes)."""
    wanted = tuple(parts)
    built = k8s_binaries(wanted)
    if built is not None:
        return built
    go = go_binary()
    if go is None:
        raise MissingBinaryError(
            "go not found: the Kubernetes control plane and helm are built from the Go module proxy "
            "(install Go >= 1.26 from https://go.dev/dl/ into /usr/local/go)"
        )
    root = _root()
    (root / "stamps").mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process's build finishes first; its stamps count
        build = _GoBuild(go, root, root / "build.log")
        for part in (p for p in ALL_PARTS if p in wanted and not _stamp(p).is_file()):
            try:
                _PARTS[part][1](build, root)
            except (MissingBinaryError, OSError, subprocess.TimeoutExpired) as exc:
                _failed().write_text(str(exc))
                raise MissingBinaryError(str(exc)) from exc
            _stamp(part).write_text(_PARTS[part][0] + "\n")
        _failed().unlink(missing_ok=True)
        _drop_go_caches(build, root)
    return K8sBinaries(root)


def _link(target: Path, link: Path) -> None:
    """``link`` -> ``target`` (``.venv/bin/helm`` -> the cached helm), replacing an old link."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def main(argv: list[str] | None = None) -> int:
    """Build now (``make k8s-binaries``, ``make helm``); a failure is reported and the k8s tests skip."""
    parser = argparse.ArgumentParser(description="Build the Kubernetes test control plane and helm.")
    parser.add_argument("--helm-only", action="store_true", help="build only the helm CLI")
    parser.add_argument("--link-helm", type=Path, help="make this path a symlink to the built helm")
    args = parser.parse_args(argv)
    parts = ("helm",) if args.helm_only else ALL_PARTS
    started = time.monotonic()
    try:
        built = ensure_k8s_binaries(parts)
    except MissingBinaryError as exc:
        print(f"kelp: {', '.join(parts)} not built; the k8s chart tests will skip:\n{exc}", file=sys.stderr)
        return 0
    took = time.monotonic() - started
    print(f"kelp: {', '.join(parts)} in {built.bin} ({took:.0f}s)", file=sys.stderr)
    if args.link_helm:
        _link(built.bin / "helm", args.link_helm)
        print(f"kelp: helm {HELM_VERSION} at {args.link_helm}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
