"""The chart installed on a real Kubernetes API server: install, upgrade, roll back, scale, ``helm test``.

One control plane for the module (:class:`kelp.harness.k8s.ControlPlane`: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok's fake node, built by ``make k8s-binaries``), one
namespace per release. The API server checks every object (schemas, admission, immutable fields on
upgrade); the controllers make the Pods, Endpoints and PodDisruptionBudget status; kwok makes Pods
Running and Ready. No container runs, so what a Pod would do is read from its spec: its environment
resolved the way the kubelet resolves it (:func:`resolved_env`).

The default values go through the ``helm`` CLI that ``make`` builds (the docs' commands); the
production values through Helm's library (``helm_python``), as ``scripts/chart.py`` drives it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from chartkit import CHART_DIR, ROOT, join_values, merge_values

from kelp.errors import MissingBinaryError
from kelp.harness import k8s_dist
from kelp.harness.k8s import ApiError, ControlPlane
from kelp.harness.k8s_dist import (
    K8sBinaries,
    build_failure,
    go_binary,
    k8s_binaries,
    kubernetes_wrapper_gomod,
)

pytestmark = pytest.mark.integration

RELEASE = "kelp"
CRD_DIR = Path(__file__).parent / "data" / "prometheus-operator-crds"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
HELM_TIMEOUT_S = 180
Obj = dict[str, Any]


# ---------------------------------------------------------------------- fixtures


def _binaries_or_skip() -> K8sBinaries:
    """The built control plane, or a skip that says in one line why there is none."""
    binaries = k8s_binaries()
    if binaries is not None:
        return binaries
    if go_binary() is None:
        pytest.skip("go not found: no Kubernetes control plane to install the chart on (needs Go >= 1.26)")
    failure = build_failure()
    if failure:
        pytest.skip(f"building the Kubernetes control plane failed: {failure.strip().splitlines()[-1]}")
    pytest.skip("Kubernetes binaries not built yet: run `make k8s-binaries` (part of `make test`)")


@pytest.fixture(scope="module")
def cluster() -> Iterator[ControlPlane]:
    with ControlPlane(_binaries_or_skip()) as plane:
        _install_crds(plane)
        yield plane


def _install_crds(plane: ControlPlane) -> None:
    """The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, as its release publishes them."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    names = []
    for crd_file in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(crd_file.read_text())
        plane.api.create(path, crd)
        names.append(crd["metadata"]["name"])

    def established() -> bool:
        for name in names:
            conditions = plane.get(f"{path}/{name}").get("status", {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    plane.wait_for(established, "the Prometheus Operator CRDs to be established")


def production_values(trainers: int = 2) -> Obj:
    """The production values (helm/kelp/ci) with a trainer group, the joiner and the request log on."""
    values = join_values()
    values["trainer"]["replicas"] = trainers
    return values


@pytest.fixture(scope="module")
def production(cluster: ControlPlane) -> Iterator[tuple[helm.Config, str]]:
    """A release of the production values in namespace ``prod``, with what those values expect to exist."""
    ns = cluster.create_namespace("prod")
    _production_prerequisites(cluster, ns, production_values())
    with helm.Config(kubeconfig_path=cluster.kubeconfig, namespace=ns) as cfg:
        cfg.install(CHART_DIR, RELEASE, production_values(), wait="watcher", timeout=HELM_TIMEOUT_S)
        yield cfg, ns


def _production_prerequisites(cluster: ControlPlane, ns: str, values: Obj) -> None:
    """What a production cluster has before the install: the priority class, the storage class and its
    volumes (one per trainer, a spare for the scale-up), the Secrets the values name."""
    trainer = values["trainer"]
    cluster.api.create(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": trainer["priorityClassName"]}, "value": 1000},
    )  # fmt: skip
    persistence = trainer["checkpoints"]["persistence"]
    cluster.api.create(
        "/apis/storage.k8s.io/v1/storageclasses",
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": persistence["storageClassName"]},
         "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate"},
    )  # fmt: skip
    for index in range(4):
        cluster.api.create(
            "/api/v1/persistentvolumes",
            {"apiVersion": "v1", "kind": "PersistentVolume",
             "metadata": {"name": f"{ns}-checkpoints-{index}"},
             "spec": {"capacity": {"storage": persistence["size"]}, "accessModes": ["ReadWriteOnce"],
                      "storageClassName": persistence["storageClassName"],
                      "hostPath": {"path": f"/var/lib/kelp-test/{ns}-{index}"}}},
        )  # fmt: skip
    for name, keys in _secret_keys(values).items():
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": keys}
        cluster.api.create(f"/api/v1/namespaces/{ns}/secrets", secret)
    for pull in values.get("imagePullSecrets", []):
        secret = {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": pull["name"]},
            "type": "kubernetes.io/dockerconfigjson", "stringData": {".dockerconfigjson": '{"auths": {}}'},
        }  # fmt: skip
        cluster.api.create(f"/api/v1/namespaces/{ns}/secrets", secret)


def _secret_keys(values: Obj) -> dict[str, dict[str, str]]:
    """Every ``{existingSecret, key}`` the values name, as ``{secret: {key: placeholder}}``."""
    found: dict[str, dict[str, str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("existingSecret"):
                keys = [v for k, v in node.items() if k == "key" or k.endswith("Key")]
                found.setdefault(node["existingSecret"], {}).update({k: "placeholder" for k in keys})
            for child in node.values():
                walk(child)

    walk(values.get("secrets", {}))
    return found


# ---------------------------------------------------------------------- reading the cluster


def pods(cluster: ControlPlane, ns: str, component: str) -> list[Obj]:
    """The release's live Pods of one component (terminating ones left out), by name."""
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
    items = cluster.get(f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")["items"]
    live = [p for p in items if "deletionTimestamp" not in p["metadata"]]
    return sorted(live, key=lambda p: p["metadata"]["name"])


def pod_names(cluster: ControlPlane, ns: str, component: str) -> list[str]:
    return [p["metadata"]["name"] for p in pods(cluster, ns, component)]


def running(pod: Obj) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return pod.get("status", {}).get("phase") == "Running" and ready


def wait_pods(cluster: ControlPlane, ns: str, component: str, count: int, annotation: str = "") -> list[Obj]:
    """Wait for exactly ``count`` Running, Ready Pods of ``component`` (with the config checksum
    ``annotation``, when given); returns them."""

    def settled() -> bool:
        found = pods(cluster, ns, component)
        checksums = {p["metadata"].get("annotations", {}).get("checksum/config") for p in found}
        right_config = not annotation or checksums == {annotation}
        return len(found) == count and all(running(p) for p in found) and right_config

    cluster.wait_for(settled, f"{count} running {component} pods in {ns}")
    return pods(cluster, ns, component)


def resolved_env(pod: Obj) -> dict[str, str]:
    """The first container's environment as the kubelet sets it: plain values (with ``$(VAR)``
    expanded), Pod fields, and ``secret:<name>/<key>`` for a Secret reference."""
    env: dict[str, str] = {}
    for var in pod["spec"]["containers"][0].get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            section, field = source["fieldRef"]["fieldPath"].split(".", 1)
            env[var["name"]] = pod[section][field]
        else:
            ref = source["secretKeyRef"]
            env[var["name"]] = f"secret:{ref['name']}/{ref['key']}"
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in args and env values (unknown names are left as they are)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def resolved_args(pod: Obj) -> list[str]:
    env = resolved_env(pod)
    return [expand(arg, env) for arg in pod["spec"]["containers"][0].get("args", [])]


def selected_pods(cluster: ControlPlane, ns: str, service: str) -> set[str]:
    """The Pods the Service's EndpointSlices (made by the controller from its selector) point at."""
    slices = cluster.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=kubernetes.io/service-name={service}"
    )["items"]
    return {e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or [] if e.get("targetRef")}


def assert_services_select(cluster: ControlPlane, ns: str, expected: dict[str, str]) -> None:
    """Each Service (name -> component) ends up with exactly that component's Pods as endpoints."""
    for service, component in expected.items():
        want = set(pod_names(cluster, ns, component))
        assert want, f"no {component} pods"
        cluster.wait_for(
            lambda s=service, w=want: selected_pods(cluster, ns, s) == w,  # type: ignore[misc]
            f"Service {service} to select exactly {sorted(want)}",
        )


def disruptions_allowed(cluster: ControlPlane, ns: str, name: str) -> int:
    """What the disruption controller says the PodDisruptionBudget lets an eviction take now."""

    def current() -> bool:
        pdb = cluster.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")
        status = pdb.get("status", {})
        return status.get("observedGeneration") == pdb["metadata"]["generation"] and status.get(
            "currentHealthy"
        ) == status.get("expectedPods")

    cluster.wait_for(current, f"PodDisruptionBudget {name} status")
    pdb = cluster.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")
    return int(pdb["status"]["disruptionsAllowed"])


def config_checksums(cluster: ControlPlane, ns: str) -> dict[str, str]:
    """The config checksum annotation of each workload's Pod template."""
    out = {}
    for kind, name in (
        ("statefulsets", "kelp-trainer"),
        ("deployments", "kelp-serving"),
        ("deployments", "kelp-join"),
    ):
        obj = cluster.get(f"/apis/apps/v1/namespaces/{ns}/{kind}/{name}")
        out[name] = obj["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    return out


def configmap(cluster: ControlPlane, ns: str) -> Obj:
    data = cluster.get(f"/api/v1/namespaces/{ns}/configmaps/{RELEASE}-config")["data"]["kelp.yaml"]
    loaded = yaml.safe_load(data)
    assert isinstance(loaded, dict)
    return loaded


def run_helm(cluster: ControlPlane, *args: str) -> str:
    """The built ``helm`` CLI against the cluster; its output (the failure's output in the assertion)."""
    argv = [cluster.binaries.path("helm"), f"--kubeconfig={cluster.kubeconfig}", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=HELM_TIMEOUT_S + 60, check=False)
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}\n{cluster.logs()}"
    return done.stdout


# ---------------------------------------------------------------------- tests


def test_without_go_the_build_says_why_and_the_tests_skip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No Go: `make k8s-binaries` prints why and succeeds (the rest of `make test` runs); these tests
    skip with one line."""
    monkeypatch.setenv("KELP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(k8s_dist, "go_binary", lambda: None)
    monkeypatch.setattr(sys.modules[__name__], "go_binary", lambda: None)
    with pytest.raises(MissingBinaryError, match="go not found"):
        k8s_dist.ensure_k8s_binaries()
    assert k8s_dist.main([]) == 0
    assert "not built; the k8s chart tests will skip" in capsys.readouterr().err
    with pytest.raises(pytest.skip.Exception, match="go not found"):
        _binaries_or_skip()


def test_wrapper_module_replaces_each_published_staging_module() -> None:
    gomod = (
        "module k8s.io/kubernetes\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n"
        "\tk8s.io/sample-controller => ./staging/src/k8s.io/sample-controller\n)\n"
    )
    wrapper = kubernetes_wrapper_gomod(gomod, "v1.37.2")
    assert "require k8s.io/kubernetes v1.37.2" in wrapper
    assert "\tk8s.io/api => k8s.io/api v0.37.2" in wrapper
    assert "sample-controller" not in wrapper  # not served by the proxy at the release's version


def docs_values_file(tmp_path: Path) -> Path:
    """The quick start's values file (``# file: kelp-values.yaml`` in docs/deploy.md): the chart's default
    values but for the Kelp config every install needs, and the Redis password's Secret."""
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    block = re.search(r"```yaml\n# file: kelp-values.yaml\n(.*?)```", text, re.DOTALL)
    assert block, f"{DEPLOY_DOC}: no kelp-values.yaml block"
    path = tmp_path / "kelp-values.yaml"
    path.write_text(block.group(1), encoding="utf-8")
    return path


def test_quick_start_install_and_helm_test(cluster: ControlPlane, tmp_path: Path) -> None:
    """docs/deploy.md's commands with the built helm: every object accepted; Pods, Services, the PDB;
    ``helm test`` runs to completion."""
    ns = "ml"
    wait = f"--timeout={HELM_TIMEOUT_S}s"
    values = ("-f", str(docs_values_file(tmp_path)))
    run_helm(
        cluster, "install", RELEASE, str(CHART_DIR), "-n", ns, "--create-namespace", *values, "--wait", wait
    )
    manifest = run_helm(cluster, "get", "manifest", RELEASE, "-n", ns)
    listed = yaml.safe_load(cluster.kubectl("get", "-n", ns, "-f", "-", "-o", "json", input_text=manifest))
    rendered = [d for d in yaml.safe_load_all(manifest) if d]
    assert len(listed["items"]) == len(rendered), "an object of the release is missing in the cluster"

    (trainer,) = wait_pods(cluster, ns, "trainer", 1)
    assert trainer["metadata"]["name"] == "kelp-trainer-0"
    env = resolved_env(trainer)
    assert env["KELP_SOURCE__GROUP_INSTANCE_ID"] == "kelp-trainer-0"  # static membership by Pod name
    assert resolved_args(trainer) == ["train", "--config", "/etc/kelp/kelp.yaml"]
    serving = wait_pods(cluster, ns, "serving", 2)
    assert all(p["metadata"]["name"].startswith("kelp-serving-") for p in serving)
    assert_services_select(cluster, ns, {"kelp-trainer": "trainer", "kelp-serving": "serving"})
    # Two Ready replicas, maxUnavailable 1: a node drain may evict one of them.
    assert disruptions_allowed(cluster, ns, "kelp-serving") == 1

    # The hook Pod (restartPolicy Never) is created, runs to completion (kwok stands in for the kubelet
    # whose probe container exits 0) and is deleted by its hook-delete-policy.
    out = run_helm(cluster, "test", RELEASE, "-n", ns, wait)
    assert "TEST SUITE:     kelp-probe" in out and "Phase:          Succeeded" in out, out
    cluster.wait_for(lambda: not pods(cluster, ns, "test"), "the helm test Pod to be deleted")


def test_production_install(cluster: ControlPlane, production: tuple[helm.Config, str]) -> None:
    """Production values with a trainer group and the joiner: names, env, volumes, probes, Services, PDBs."""
    _, ns = production
    trainers = wait_pods(cluster, ns, "trainer", 2)
    assert [p["metadata"]["name"] for p in trainers] == ["kelp-trainer-0", "kelp-trainer-1"]
    for pod in trainers:
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        assert container["command"] == ["torchrun"]
        labels = pod["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "kelp" and labels["app.kubernetes.io/part-of"] == "kelp"
        assert labels["statefulset.kubernetes.io/pod-name"] == name
        args = resolved_args(pod)
        assert f"--local-addr={name}.kelp-trainer.{ns}.svc.cluster.local" in args  # its rank's address
        assert f"--rdzv-endpoint=kelp-trainer-0.kelp-trainer.{ns}.svc.cluster.local:29400" in args
        assert "--nnodes=2:2" in args
        assert resolved_env(pod)["KELP_SOURCE__GROUP_INSTANCE_ID"] == name  # Kelp appends -<RANK>
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == f"checkpoints-{name}"
        assert volumes["config"]["configMap"]["name"] == "kelp-config"
        assert {"store-tls", "kafka-tls", "tmp"} <= set(volumes)
        assert_probes_name_ports(container)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    claims = cluster.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims")["items"]
    assert {c["metadata"]["name"]: c["status"]["phase"] for c in claims} == {
        "checkpoints-kelp-trainer-0": "Bound",
        "checkpoints-kelp-trainer-1": "Bound",
    }

    serving = wait_pods(cluster, ns, "serving", 3)  # the autoscaler's minReplicas
    for pod in serving:
        env = resolved_env(pod)
        assert env["KELP_SOURCE__SECURITY__SASL_PASSWORD"] == "secret:kelp-trainer/password"  # request log
        assert_probes_name_ports(pod["spec"]["containers"][0])
        assert "serving-auth" in {v["name"] for v in pod["spec"]["volumes"]}
    (joiner,) = wait_pods(cluster, ns, "join", 1)
    assert resolved_args(joiner)[0] == "join"
    assert_probes_name_ports(joiner["spec"]["containers"][0])

    assert_services_select(
        cluster, ns, {"kelp-trainer": "trainer", "kelp-serving": "serving", "kelp-join": "join"}
    )
    assert disruptions_allowed(cluster, ns, "kelp-trainer") == 1  # maxUnavailable 1 of the group
    assert disruptions_allowed(cluster, ns, "kelp-serving") == 1  # minAvailable 2 of 3
    # A node drain's evictions go through: one Pod of each, replaced by its controller.
    evict_one(cluster, ns, "trainer", 2)
    evict_one(cluster, ns, "serving", 3)

    policies = cluster.get(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies")["items"]
    assert sorted(p["metadata"]["name"] for p in policies) == ["kelp-join", "kelp-serving", "kelp-trainer"]


def evict_one(cluster: ControlPlane, ns: str, component: str, count: int) -> None:
    """Evict the last Pod of ``component`` as ``kubectl drain`` does (the Eviction API, which a
    PodDisruptionBudget refuses with 429), then wait until its controller has ``count`` Pods again."""
    meta = pods(cluster, ns, component)[-1]["metadata"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta["name"], "namespace": ns},
    }
    cluster.api.request("POST", f"/api/v1/namespaces/{ns}/pods/{meta['name']}/eviction", eviction)
    cluster.wait_for(
        lambda: meta["uid"] not in {p["metadata"]["uid"] for p in pods(cluster, ns, component)},
        f"{meta['name']} evicted",
    )
    wait_pods(cluster, ns, component, count)


def assert_probes_name_ports(container: Obj) -> None:
    """Every probe's named port is one of the container's ports (else the kubelet cannot probe it)."""
    ports = {p["name"] for p in container.get("ports", [])}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ports, (container["name"], probe)


def test_prometheus_operator_objects_accepted(
    cluster: ControlPlane, production: tuple[helm.Config, str]
) -> None:
    """The ServiceMonitor and PrometheusRule passed the operator's own schemas (which do refuse bad ones)."""
    _, ns = production
    base = f"/apis/monitoring.coreos.com/v1/namespaces/{ns}"
    monitor = cluster.get(f"{base}/servicemonitors/kelp")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule = cluster.get(f"{base}/prometheusrules/kelp")
    assert rule["spec"]["groups"], "the PrometheusRule has no alert groups"
    broken = {
        **monitor,
        "metadata": {"name": "broken"},
        "spec": {**monitor["spec"], "scrapeProtocols": ["Nope"]},
    }
    with pytest.raises(ApiError) as refused:
        cluster.api.create(f"{base}/servicemonitors", broken)
    assert refused.value.status == 422


def test_upgrade_with_changed_config_rolls_pods_then_rollback(
    cluster: ControlPlane, production: tuple[helm.Config, str]
) -> None:
    """A config change rolls every Pod that reads it; rollback restores the config and the Pods."""
    cfg, ns = production
    before = config_checksums(cluster, ns)
    changed = merge_values(production_values(), {"config": {"batching": {"batch_size": 4096}}})
    cfg.upgrade(CHART_DIR, RELEASE, changed, wait="watcher", timeout=HELM_TIMEOUT_S)
    after = config_checksums(cluster, ns)
    assert all(after[name] != before[name] for name in before), (before, after)
    assert configmap(cluster, ns)["batching"]["batch_size"] == 4096
    wait_pods(cluster, ns, "trainer", 2, after["kelp-trainer"])
    wait_pods(cluster, ns, "serving", 3, after["kelp-serving"])
    wait_pods(cluster, ns, "join", 1, after["kelp-join"])

    cfg.rollback(RELEASE, version=1, wait="watcher", timeout=HELM_TIMEOUT_S)
    assert [(h["revision"], h["status"]) for h in cfg.history(RELEASE)][-1] == (3, "deployed")
    assert cfg.get_all(RELEASE)["info"]["description"] == "Rollback to 1"
    assert config_checksums(cluster, ns) == before
    assert (
        configmap(cluster, ns)["batching"]["batch_size"]
        == production_values()["config"]["batching"]["batch_size"]
    )
    wait_pods(cluster, ns, "trainer", 2, before["kelp-trainer"])
    wait_pods(cluster, ns, "serving", 3, before["kelp-serving"])


def test_scale_trainer_group(cluster: ControlPlane, production: tuple[helm.Config, str]) -> None:
    """replicas 2 -> 3: every rank's rendezvous settings follow, the new Pod gets its own identity and
    volume; and back to 2."""
    cfg, ns = production
    cfg.upgrade(CHART_DIR, RELEASE, production_values(trainers=3), wait="watcher", timeout=HELM_TIMEOUT_S)
    trainers = wait_pods(cluster, ns, "trainer", 3)
    assert [p["metadata"]["name"] for p in trainers] == ["kelp-trainer-0", "kelp-trainer-1", "kelp-trainer-2"]
    for pod in trainers:
        assert "--nnodes=3:3" in resolved_args(pod), pod["metadata"]["name"]
    new = trainers[2]
    assert resolved_env(new)["KELP_SOURCE__GROUP_INSTANCE_ID"] == "kelp-trainer-2"
    assert f"--local-addr=kelp-trainer-2.kelp-trainer.{ns}.svc.cluster.local" in resolved_args(new)
    assert f"--rdzv-endpoint=kelp-trainer-0.kelp-trainer.{ns}.svc.cluster.local:29400" in resolved_args(new)
    # Running means scheduled, which needs its claim bound (the spare volume).
    claim = cluster.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/checkpoints-kelp-trainer-2")
    assert claim["status"]["phase"] == "Bound"
    assert_services_select(cluster, ns, {"kelp-trainer": "trainer"})

    cfg.upgrade(CHART_DIR, RELEASE, production_values(trainers=2), wait="watcher", timeout=HELM_TIMEOUT_S)
    trainers = wait_pods(cluster, ns, "trainer", 2)
    assert all("--nnodes=2:2" in resolved_args(p) for p in trainers)


def test_switching_autoscaling_on_keeps_the_serving_pods(cluster: ControlPlane, tmp_path: Path) -> None:
    """An upgrade that turns the autoscaler on leaves the running replicas alone (the chart used to drop
    ``replicas``, which reset the Deployment to 1 until the autoscaler's next sync)."""
    ns = "autoscaling"
    values = docs_values_file(tmp_path)
    wait = ("--wait", f"--timeout={HELM_TIMEOUT_S}s")
    run_helm(
        cluster, "install", RELEASE, str(CHART_DIR), "-n", ns, "--create-namespace", "-f", str(values), *wait
    )
    before = {p["metadata"]["uid"] for p in wait_pods(cluster, ns, "serving", 2)}

    hpa = ("--set", "serving.autoscaling.enabled=true", "--set", "serving.autoscaling.minReplicas=2")
    run_helm(cluster, "upgrade", RELEASE, str(CHART_DIR), "-n", ns, "-f", str(values), *hpa, *wait)
    path = f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{RELEASE}-serving"
    cluster.wait_for(lambda: _hpa_synced(cluster, path), "the autoscaler's first sync")
    after = {p["metadata"]["uid"] for p in wait_pods(cluster, ns, "serving", 2)}
    assert after == before, "switching the autoscaler on replaced serving pods"


def _hpa_synced(cluster: ControlPlane, path: str) -> bool:
    """The autoscaler has looked at its Deployment at least once (it reports conditions)."""
    return bool(cluster.get(path).get("status", {}).get("conditions"))


def test_changing_checkpoint_volumes_fails_naming_the_values(
    cluster: ControlPlane, production: tuple[helm.Config, str]
) -> None:
    """A StatefulSet's volumeClaimTemplates are immutable: the upgrade fails before touching anything,
    naming the values and the way out, and the release keeps running as it was."""
    cfg, ns = production
    revisions = len(cfg.history(RELEASE))
    bigger = merge_values(
        production_values(), {"trainer": {"checkpoints": {"persistence": {"size": "100Gi"}}}}
    )
    with pytest.raises(helm.HelmError) as refused:
        cfg.upgrade(CHART_DIR, RELEASE, bigger, wait="watcher", timeout=HELM_TIMEOUT_S)
    message = str(refused.value)
    assert "trainer.checkpoints.persistence cannot change on a running release" in message, message
    assert f"kubectl -n {ns} delete statefulset kelp-trainer --cascade=orphan" in message, message
    assert len(cfg.history(RELEASE)) == revisions
    sts = cluster.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets/kelp-trainer")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "50Gi"
