"""A real Kubernetes control plane on loopback ports, with kwok's fake node, for installing the chart.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as child processes (built by
:mod:`kelp.harness.k8s_dist`) with throwaway certificates made by ``openssl``; kwok plays the
kubelet of one fake node, so the controllers create Pods, the scheduler binds them, and they become
Running and Ready without a container runtime. No container ever runs: what this shows is what the
API server accepts (schemas, admission, immutable fields) and what the controllers do with it
(Pods of StatefulSets and Deployments, Endpoints, rolling updates, PodDisruptionBudget status,
autoscaler minimums, ``helm --wait``).

Usage::

    with ControlPlane() as cluster:   # start() + wait_ready(); stop() on exit
        ns = cluster.create_namespace("demo")
        pods = cluster.get(f"/api/v1/namespaces/{ns}/pods")["items"]

``cluster.kubeconfig`` is an admin kubeconfig for ``helm`` and ``kubectl``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from kelp.errors import MissingBinaryError
from kelp.harness.k8s_dist import K8sBinaries, ensure_k8s_binaries
from kelp.harness.ports import free_port, wait_for_port
from kelp.harness.process import ManagedProcess

__all__ = ["ApiError", "ControlPlane", "KubeApi"]

Obj = dict[str, Any]

NODE_NAME = "kwok-node-0"
# Records only: no traffic reaches these addresses (kwok gives Pods IPs from its own range).
SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.0.1.0/24"
# The fake node's size: room for every Pod a test creates; GPUs for the chart's GPU trainers.
NODE_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
_START_TIMEOUT_S = 180.0

# kwok's stock stages complete only the Pods a Job owns. With this one a bare Pod with restartPolicy
# Never (a `helm test` hook) also runs to completion, as a kubelet whose container exits 0 reports it.
RUN_TO_COMPLETION_STAGE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-run-to-completion
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.spec.restartPolicy'
      operator: 'In'
      values: ['Never']
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""


class ApiError(Exception):
    """The API server answered with an error status; ``status`` and the server's message."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.message = message


class KubeApi:
    """A minimal JSON client of the API server, authenticated with the admin client certificate."""

    def __init__(self, port: int, pki: Path) -> None:
        self.port = port
        self._tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self._tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def raw(self, method: str, path: str, payload: str | None = None, content_type: str = "") -> str:
        """One request; the answer's text, or :class:`ApiError` for a status >= 400."""
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self._tls, timeout=30)
        try:
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = content_type or "application/json"
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        if response.status >= 400:
            raise ApiError(response.status, method, path, text)
        return text

    def request(self, method: str, path: str, body: Obj | None = None, content_type: str = "") -> Obj:
        """One request with a JSON body (or none); the decoded JSON answer."""
        text = self.raw(method, path, None if body is None else json.dumps(body), content_type)
        return json.loads(text) if text else {}

    def get(self, path: str) -> Obj:
        return self.request("GET", path)

    def create(self, path: str, obj: Obj) -> Obj:
        """POST ``obj`` to the collection ``path``; an object that exists already is left as it is."""
        try:
            return self.request("POST", path, obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return self.get(f"{path}/{obj['metadata']['name']}")


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, on free loopback ports.

    ``binaries``: from :func:`~kelp.harness.k8s_dist.ensure_k8s_binaries` by default (building them
    the first time). ``workdir`` holds the certificates, the kubeconfigs, etcd's data and each
    process's log (a temporary folder by default, removed by :meth:`stop`).
    """

    def __init__(self, binaries: K8sBinaries | None = None, workdir: Path | None = None) -> None:
        if shutil.which("openssl") is None:
            raise MissingBinaryError("openssl not found: the control plane's certificates are made with it")
        self.binaries = binaries or ensure_k8s_binaries()
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kelp-k8s-"))
        self.pki = self.workdir / "pki"
        self.kubeconfig = self.pki / "admin.kubeconfig"
        self.ports = {
            name: free_port() for name in ("etcd", "etcd_peer", "apiserver", "kcm", "sched", "kwok")
        }
        self.processes: list[ManagedProcess] = []
        self._api: KubeApi | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def api(self) -> KubeApi:
        """The admin client (once :meth:`start` made the certificates)."""
        if self._api is None:
            raise RuntimeError("the control plane is not started")
        return self._api

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Certificates, then each process in dependency order; returns once the API server is ready."""
        make_pki(self.pki, self.ports["apiserver"])
        self._api = KubeApi(self.ports["apiserver"], self.pki)
        self._start("etcd", self._etcd_argv())
        self._wait(lambda: wait_for_port(self.ports["etcd"], 1.0), "etcd to listen")
        self._start("kube-apiserver", self._apiserver_argv())
        self._wait(self._apiserver_ready, "kube-apiserver /readyz")
        self._start("kube-controller-manager", self._controller_manager_argv())
        self._start("kube-scheduler", self._scheduler_argv())
        self._start("kwok", self._kwok_argv(), env={"KUBE_FEATURE_WatchListClient": "false"})

    def wait_ready(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Register the fake node and wait until kwok reports it Ready and Pods can be admitted.

        A namespace's ``default`` ServiceAccount comes from the controller-manager, so a Pod
        created before it runs is refused; waiting for kube-system's proves the controllers run.
        """
        self.api.create("/api/v1/nodes", fake_node())
        self._wait(self._node_ready, f"node {NODE_NAME} Ready", timeout_s)
        sa = "/api/v1/namespaces/kube-system/serviceaccounts/default"
        self._wait(lambda: self._exists(sa), "the controller-manager's ServiceAccounts", timeout_s)

    def stop(self) -> None:
        """Stop every process this started (last started first), then remove an own workdir."""
        for process in reversed(self.processes):
            process.stop(timeout_s=20)
        self.processes.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------ API helpers

    def get(self, path: str) -> Obj:
        return self.api.get(path)

    def create_namespace(self, name: str) -> str:
        """A namespace for one test (``name`` must be a DNS label); returns its name."""
        self.api.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        sa = f"/api/v1/namespaces/{name}/serviceaccounts/default"
        self._wait(lambda: self._exists(sa), f"namespace {name}'s default ServiceAccount")
        return name

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        """``kubectl args...`` against this cluster; its stdout (raises on a non-zero exit)."""
        argv = [self.binaries.path("kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        done = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def wait_for(self, check: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
        """Poll ``check`` until it is true; a :class:`TimeoutError` naming ``what`` and the logs' tails."""
        self._wait(check, what, timeout_s)

    def logs(self, lines: int = 15) -> str:
        """The last lines of each process's log, for a failure message."""
        return "\n".join(f"--- {p.name}\n{p.log_tail(lines)}" for p in self.processes)

    # ------------------------------------------------------------------ internals

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        full_env = None if env is None else {**os.environ, **env}
        process = ManagedProcess(argv, name, workdir=self.workdir, env=full_env)
        self.processes.append(process)
        process.start()

    def _wait(self, check: Callable[[], bool], what: str, timeout_s: float = _START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p.name for p in self.processes if not p.alive()]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.logs()}")
            with contextlib.suppress(OSError, ApiError):
                if check():
                    return
            time.sleep(0.2)
        raise TimeoutError(f"no {what} after {timeout_s:.0f}s:\n{self.logs()}")

    def _exists(self, path: str) -> bool:
        try:
            self.api.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _apiserver_ready(self) -> bool:
        return self.api.raw("GET", "/readyz") == "ok"

    def _node_ready(self) -> bool:
        node = self.api.get(f"/api/v1/nodes/{NODE_NAME}")
        conditions = node.get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _etcd_argv(self) -> list[str]:
        client, peer = (f"http://127.0.0.1:{self.ports[k]}" for k in ("etcd", "etcd_peer"))
        return [
            self.binaries.path("etcd"), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}", "--listen-metrics-urls=",
            "--quota-backend-bytes=2147483648", "--unsafe-no-fsync=true", "--log-level=warn",
        ]  # fmt: skip

    def _apiserver_argv(self) -> list[str]:
        pki = self.pki
        return [
            self.binaries.path("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'admin.crt'}", f"--kubelet-client-key={pki / 'admin.key'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            # No kube-proxy or real endpoints for the apiserver's own Service: nothing routes here.
            "--endpoint-reconciler-type=none", "--profiling=false",
        ]  # fmt: skip

    def _controller_manager_argv(self) -> list[str]:
        pki, kubeconfig = self.pki, self.pki / "controller-manager.kubeconfig"
        return [
            self.binaries.path("kube-controller-manager"),
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kcm']}", "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true", "--controllers=*",
            # A HorizontalPodAutoscaler raises a Deployment to its minReplicas on its next sync.
            "--horizontal-pod-autoscaler-sync-period=1s", "--profiling=false",
        ]  # fmt: skip

    def _scheduler_argv(self) -> list[str]:
        kubeconfig = self.pki / "scheduler.kubeconfig"
        return [
            self.binaries.path("kube-scheduler"),
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['sched']}", "--leader-elect=false",
            "--profiling=false",
        ]  # fmt: skip

    def _kwok_argv(self) -> list[str]:
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text(f"{self.binaries.kwok_stages.read_text()}---\n{RUN_TO_COMPLETION_STAGE}")
        return [
            self.binaries.path("kwok"), f"--kubeconfig={self.kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-lease-duration-seconds=40", f"--cidr={POD_CIDR}", "--node-ip=10.0.1.1",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
        ]  # fmt: skip


def fake_node() -> Obj:
    """The Node kwok manages (its annotation): Ready once kwok's node stages ran, never tainted.

    Labelled like a GPU node in one zone, so values that select GPU nodes or spread over zones
    schedule on it.
    """
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE_NAME,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": NODE_NAME,
                "type": "kwok",
                "topology.kubernetes.io/zone": "zone-a",
                "nvidia.com/gpu.present": "true",
            },
        },
        "spec": {"taints": []},
        "status": {"allocatable": dict(NODE_CAPACITY), "capacity": dict(NODE_CAPACITY)},
    }


# ---------------------------------------------------------------------- certificates

_CLIENTS = {
    # file stem: (common name, organization): the identities RBAC knows.
    "admin": ("kubernetes-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", ""),
    "scheduler": ("system:kube-scheduler", ""),
}
_SERVER_NAMES = (
    "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
    "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
)


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")


def _ec_key_args() -> list[str]:
    # P-256 keys: generated in milliseconds, unlike RSA, and accepted everywhere Kubernetes wants a key.
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _signed(pki: Path, stem: str, subject: str, extensions: str) -> None:
    """``stem.key`` and ``stem.crt`` signed by the CA in ``pki``."""
    (pki / f"{stem}.ext").write_text(extensions)
    _openssl(
        "req",
        "-new",
        *_ec_key_args(),
        "-keyout",
        f"{stem}.key",
        "-out",
        f"{stem}.csr",
        "-subj",
        subject,
        cwd=pki,
    )
    _openssl(
        "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", f"{stem}.crt", "-days", "30", "-extfile", f"{stem}.ext", cwd=pki,
    )  # fmt: skip


def make_pki(pki: Path, apiserver_port: int) -> None:
    """A throwaway CA, the API server's serving certificate, client certificates and kubeconfigs."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *_ec_key_args(), "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
             "-subj", "/CN=kelp-test-ca", cwd=pki)  # fmt: skip
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key", cwd=pki
    )
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    usage = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    _signed(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        f"{usage}extendedKeyUsage=serverAuth\nsubjectAltName={_SERVER_NAMES}\n",
    )
    for stem, (name, org) in _CLIENTS.items():
        subject = f"/CN={name}/O={org}" if org else f"/CN={name}"
        _signed(pki, stem, subject, f"{usage}extendedKeyUsage=clientAuth\n")
        (pki / f"{stem}.kubeconfig").write_text(kubeconfig(pki, stem, apiserver_port))


def kubeconfig(pki: Path, stem: str, apiserver_port: int) -> str:
    """A kubeconfig for the client certificate ``stem`` (JSON, which is YAML)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kelp-test",
                "cluster": {
                    "certificate-authority": str(pki / "ca.crt"),
                    "server": f"https://127.0.0.1:{apiserver_port}",
                },
            }
        ],
        "users": [
            {
                "name": stem,
                "user": {
                    "client-certificate": str(pki / f"{stem}.crt"),
                    "client-key": str(pki / f"{stem}.key"),
                },
            }
        ],
        "contexts": [{"name": "kelp-test", "context": {"cluster": "kelp-test", "user": stem}}],
        "current-context": "kelp-test",
    }
    return json.dumps(config, indent=2)
