"""The Helm chart lints, renders valid Kubernetes 1.30 objects and a config Kelp accepts.

Rendering uses Helm's own library (``helm_python``): ``helm.lint`` is
``helm lint --strict``, ``Chart.render`` is ``helm template`` including the
``values.schema.json`` check that ``helm install`` runs. Objects are validated
against the Kubernetes 1.30 OpenAPI schemas in strict mode (unknown fields
are errors) with ``kubernetes_validate``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from chartkit import (
    ALERT_TESTS,
    ALERTS,
    CHART_DIR,
    DASHBOARD,
    GROUP_REPLICAS,
    K8S_VERSION,
    NAMESPACE,
    PRODUCTION_VALUES,
    RELEASE,
    ROOT,
    VALUE_SETS,
    Manifest,
    Render,
    find,
    group_values,
    kelp_args,
    load_values,
    merge_values,
    minimal_values,
    parse_rendered,
    pod_spec,
)
from torch.distributed.run import config_from_args, get_args_parser

from kelp.config.loader import parse_config
from kelp.daemon.preflight import Role, problems

# Custom resources of the Prometheus Operator: no upstream Kubernetes schema, checked separately.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _kelp_containers(docs: list[Manifest]) -> list[tuple[Manifest, dict[str, Any]]]:
    return [
        (doc, container)
        for doc in docs
        if doc["kind"] in {"StatefulSet", "Deployment", "Pod"}
        for container in pod_spec(doc)["containers"]
    ]


def _role(doc: Manifest) -> Role:
    """What ``kelp config validate --for`` checks for the object's containers."""
    if doc["kind"] == "StatefulSet":
        return "train"
    return "join" if doc["metadata"]["labels"]["app.kubernetes.io/component"] == "join" else "serve"


def _fake_secret_env(container: dict[str, Any], pod_name: str = "kelp-trainer-0") -> dict[str, str]:
    """The container's environment, with every Secret (or pod field) reference replaced by a placeholder.

    ``metadata.name`` becomes ``pod_name``: the config checks what it feeds (the consumer's instance id).
    """
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "fieldRef" in var["valueFrom"]:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = pod_name if path == "metadata.name" else f"field:{path}"
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = f"secret:{ref['name']}/{ref['key']}"
    return env


def _torchrun(container: dict[str, Any], pod_name: str) -> argparse.Namespace:
    """The container's torchrun command line as torchrun itself parses it (Kubernetes' $(VAR) expanded)."""
    assert container["command"] == ["torchrun"]
    args = [arg.replace("$(POD_NAME)", pod_name) for arg in container["args"]]
    assert all("$(" not in arg for arg in args), args
    return get_args_parser().parse_args(args)


# ------------------------------------------------------------------ lint and schema


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict(name: str) -> None:
    report = helm.lint(CHART_DIR, VALUE_SETS[name](), strict=True, kube_version=f"v{K8S_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 = warning, 3 = error
    assert report["errors"] == [] and problems == [], json.dumps(report, indent=2)


def test_values_schema_config_part_is_generated_from_kelp_config() -> None:
    sys.path.insert(0, str(ROOT / "helm" / "tools"))
    try:
        import values_schema
    finally:
        sys.path.pop(0)
    committed = json.loads((CHART_DIR / "values.schema.json").read_text(encoding="utf-8"))
    assert values_schema.render(committed) == committed, (
        "helm/kelp/values.schema.json is out of date with the config models: "
        "run `.venv/bin/python helm/tools/values_schema.py`"
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"trainer": {"replicas": -1}}, "at '/trainer/replicas': minimum: got -1, want 0"),
        ({"serving": {"replicas": -2}}, "at '/serving/replicas': minimum"),
        (
            {"config": {"store": {"backend": "cassandra"}}},
            "at '/config/store/backend': value must be one of 'redis', 'redis-cluster'",
        ),
        ({"config": {"store": {"backend": "memory"}}}, "at '/config/store/backend'"),
        ({"config": {"store": {"urls": []}}}, "at '/config/store/urls'"),
        ({"config": {"trainer": {"modle": "dcn-v2"}}}, "at '/config/trainer': additional properties 'modle'"),
        ({"config": {"trainer": {"model": "gpt"}}}, "at '/config/trainer/model'"),
        ({"config": {"store": {"password": "hunter2"}}}, "at '/config/store/password'"),
        ({"config": {"source": {"max_poll_records": 0}}}, "at '/config/source/max_poll_records'"),
        ({"config": {"publisher": {"channel": "filesystem"}}}, "at '/config/publisher/channel'"),
        ({"trainer": {"gpu": "one"}}, "at '/trainer/gpu'"),
        ({"trainer": {"distributed": {"rdzvPort": 0}}}, "at '/trainer/distributed/rdzvPort'"),
        ({"trainer": {"distributed": {"minReplicas": 0}}}, "at '/trainer/distributed/minReplicas'"),
        ({"trainer": {"distributed": {"nnodes": 3}}}, "additional properties 'nnodes'"),
        ({"trainer": {"podDisruptionBudget": {"minAvailable": 3}}}, "additional properties 'minAvailable'"),
        ({"serving": {"replica": 3}}, "at '/serving': additional properties 'replica'"),
        ({"networkPolicy": {"enable": True}}, "at '/networkPolicy': additional properties 'enable'"),
        ({"networkPolicy": {"enabled": True, "serving": {"fromNamespaces": "shop"}}}, "fromNamespaces"),
        (
            {"secrets": {"store": {"trainerAuth": {"existingSecret": "x", "key": "password"}}}},
            "at '/secrets/store/trainerAuth'",
        ),
        (
            {"monitoring": {"serviceMonitor": {"interval": "30 seconds"}}},
            "at '/monitoring/serviceMonitor/interval'",
        ),
        ({"join": {"enabled": True, "replicas": 2}}, "at '/join': additional properties 'replicas'"),
        ({"config": {"join": {"redis_url": "redis://:hunter2@redis:6379"}}}, "at '/config/join/redis_url'"),
        ({"config": {"join": {"actions": [{"topic": "clicks", "task": "click"}]}}}, "window_s"),
    ],
)
def test_invalid_values_are_rejected_by_the_schema(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as excinfo:
        chart.render(minimal_values(values), name="kelp", namespace=NAMESPACE, is_install=True)
    assert message in str(excinfo.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"config": {"source": {"security": {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"}}}},
            "needs a password: set secrets.kafka.saslPassword.existingSecret",
        ),
        (
            {"secrets": {"kafka": {"tls": {"ca": {"existingSecret": "cluster-ca", "key": "ca.crt"}}}}},
            "config.source.security.protocol is not SSL or SASL_SSL",
        ),
        (
            {"secrets": {"store": {"tls": {"cert": {"existingSecret": "client", "key": "tls.crt"}}}}},
            "secrets.store.tls: set both cert and key",
        ),
        (
            {"serving": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
            "minReplicas (5) must not exceed maxReplicas (2)",
        ),
        (
            {"trainer": {"replicas": 3, "distributed": {"minReplicas": 4}}},
            "trainer.distributed.minReplicas (4) must not exceed trainer.replicas (3)",
        ),
        (
            {"trainer": {"replicas": 2, "distributed": {"rdzvPort": 9400}}},
            "trainer.distributed.rdzvPort (9400) must differ from config.metrics.port",
        ),
        ({"join": {"enabled": True}}, "join.enabled needs config.join.actions"),
        (
            {
                "join": {"enabled": True},
                "config": {
                    "store": {"backend": "redis-cluster"},
                    "join": {"actions": [{"topic": "clicks", "task": "click", "window_s": 600}]},
                },
            },
            "set config.join.redis_url (or secrets.join.redisUrl)",
        ),
    ],
)
def test_cross_field_mistakes_fail_with_a_message(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError) as excinfo:
        chart.render(minimal_values(values), name="kelp", namespace=NAMESPACE, is_install=True)
    assert message in str(excinfo.value)


# ------------------------------------------------------------------ rendered objects


def test_rendered_objects_are_valid_kubernetes_1_30(manifests: list[Manifest]) -> None:
    errors = []
    for doc in manifests:
        if doc["kind"] in OPERATOR_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {where}: {exc.message}")
    assert errors == []


def test_default_and_production_render_the_expected_objects(
    manifests: list[Manifest], value_set: tuple[str, dict[str, Any]]
) -> None:
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in manifests)
    expected = [
        "ConfigMap/kelp-config",
        "ConfigMap/kelp-dashboard",
        "Deployment/kelp-serving",
        "PodDisruptionBudget/kelp-serving",
        "Pod/kelp-probe",
        "Service/kelp-serving",
        "Service/kelp-trainer",
        "ServiceAccount/kelp",
        "StatefulSet/kelp-trainer",
    ]
    if value_set[0] != "minimal":
        expected += [
            "HorizontalPodAutoscaler/kelp-serving",
            "NetworkPolicy/kelp-serving",
            "NetworkPolicy/kelp-trainer",
            "PrometheusRule/kelp",
            "ServiceMonitor/kelp",
        ]
    if value_set[0] == "group":
        expected += ["PodDisruptionBudget/kelp-trainer"]
    if value_set[0] == "join":
        expected += ["Deployment/kelp-join", "NetworkPolicy/kelp-join", "Service/kelp-join"]
    assert kinds == sorted(expected)


def test_every_object_has_the_standard_labels(manifests: list[Manifest]) -> None:
    required = {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/managed-by",
        "helm.sh/chart",
    }
    for doc in manifests:
        labels = doc["metadata"].get("labels", {})
        assert required <= set(labels), f"{doc['kind']}/{doc['metadata']['name']}: {sorted(labels)}"
        if doc["kind"] in {"StatefulSet", "Deployment"}:
            template = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= template.items()


def test_rendered_config_is_accepted_by_kelp(manifests: list[Manifest]) -> None:
    """Each container's view: the ConfigMap plus its KELP_... env overrides, through Kelp's own loader.

    And what the process would refuse at start (``kelp config validate --for train|serve|join``): nothing.
    """
    config_map = find(manifests, "ConfigMap", "-config")
    data = yaml.safe_load(config_map["data"]["kelp.yaml"])
    for doc, container in _kelp_containers(manifests):
        cfg = parse_config(data, f"{doc['kind']}/{doc['metadata']['name']}", _fake_secret_env(container))
        assert cfg.store.backend in {"redis", "redis-cluster"}
        assert cfg.source.kind == "kafka"
        assert problems(cfg, _role(doc)) == []
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        args = kelp_args(container)
        assert mounts["config"] == "/etc/kelp" and args[args.index("--config") + 1] == "/etc/kelp/kelp.yaml"


# What the chart adds to the user's config: the paths of its own mounts, nothing that changes learning.
CHART_OWNED: dict[str, dict[str, Any]] = {
    "minimal": {"trainer": {"checkpoint_dir": "/var/lib/kelp/checkpoints"}},
    "production": {
        "trainer": {"checkpoint_dir": "/var/lib/kelp/checkpoints"},
        "store": {"tls": {"enabled": True, "ca_file": "/etc/kelp/tls/store/ca.crt"}},
        "source": {"security": {"ssl_cafile": "/etc/kelp/tls/kafka/ca.crt"}},
        "serving": {"auth_token_file": "/etc/kelp/auth/token"},
    },
}


@pytest.mark.parametrize("name", sorted(CHART_OWNED))
def test_the_config_map_is_the_users_config_plus_the_chart_owned_paths(render: Render, name: str) -> None:
    """Helm merges maps: any config in values.yaml would join the user's and train differently from
    what `kelp config validate` accepted (admission, eviction, batching...)."""
    values = VALUE_SETS[name]()
    rendered = yaml.safe_load(find(render(values), "ConfigMap", "-config")["data"]["kelp.yaml"])
    assert rendered == merge_values(values["config"], CHART_OWNED[name])


def test_without_a_config_the_install_fails_naming_what_is_missing(chart: helm.Chart) -> None:
    assert load_values(CHART_DIR / "values.yaml")["config"] == {}
    with pytest.raises(helm.HelmValuesError, match="at '/config': missing properties 'features', 'source'"):
        chart.render({}, name="kelp", namespace=NAMESPACE, is_install=True)


def test_no_secret_lands_in_the_config_map(production_manifests: list[Manifest]) -> None:
    def keys(node: object) -> set[str]:
        if isinstance(node, dict):
            return set(node) | {k for v in node.values() for k in keys(v)}
        if isinstance(node, list):
            return {k for v in node for k in keys(v)}
        return set()

    config = yaml.safe_load(find(production_manifests, "ConfigMap", "-config")["data"]["kelp.yaml"])
    assert config["source"]["security"]["sasl_mechanism"] == "SCRAM-SHA-512"  # a password is in use...
    assert not {k for k in keys(config) if "password" in k}  # ...and comes from the env, not the file


def _secret_refs(container: dict) -> dict[str, dict]:
    return {
        var["name"]: var["valueFrom"]["secretKeyRef"]
        for var in container["env"]
        if "secretKeyRef" in var.get("valueFrom", {})
    }


def test_secrets_become_kelp_env_overrides(production_manifests: list[Manifest]) -> None:
    values = load_values(PRODUCTION_VALUES)["secrets"]
    for doc, container in _kelp_containers(production_manifests):
        refs = _secret_refs(container)
        assert refs["KELP_STORE__PASSWORD"] == {
            "name": values["store"]["password"]["existingSecret"],
            "key": values["store"]["password"]["key"],
        }
        if doc["kind"] == "StatefulSet":
            assert refs["KELP_SOURCE__SECURITY__SASL_PASSWORD"] == {
                "name": values["kafka"]["saslPassword"]["existingSecret"],
                "key": values["kafka"]["saslPassword"]["key"],
            }
        else:  # serving pods never talk to Kafka unless they log requests: no Kafka secret there
            assert not [name for name in refs if name.startswith("KELP_SOURCE__")]


def test_serving_pods_get_the_kafka_secret_only_with_the_request_log(render: Render) -> None:
    values = VALUE_SETS["production"]()
    values.setdefault("config", {}).setdefault("serving", {})["request_log"] = {"enabled": True}
    manifests = render(values)
    serving = find(manifests, "Deployment", "-serving")
    refs = _secret_refs(pod_spec(serving)["containers"][0])
    secret = load_values(PRODUCTION_VALUES)["secrets"]["kafka"]["saslPassword"]["existingSecret"]
    assert refs["KELP_SOURCE__SECURITY__SASL_PASSWORD"]["name"] == secret


def test_tls_files_are_mounted_where_the_config_points(production_manifests: list[Manifest]) -> None:
    cfg = yaml.safe_load(find(production_manifests, "ConfigMap", "-config")["data"]["kelp.yaml"])
    assert cfg["store"]["tls"]["enabled"] is True
    trainer = find(production_manifests, "StatefulSet", "-trainer")
    spec = pod_spec(trainer)
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for path in (cfg["store"]["tls"]["ca_file"], cfg["source"]["security"]["ssl_cafile"]):
        mount = next(m for m in container["volumeMounts"] if str(Path(path).parent) == m["mountPath"])
        projected = [
            item["path"]
            for source in volumes[mount["name"]]["projected"]["sources"]
            for item in source["secret"]["items"]
        ]
        assert Path(path).name in projected


def test_probes_use_the_real_endpoints_and_ports(manifests: list[Manifest]) -> None:
    data = yaml.safe_load(find(manifests, "ConfigMap", "-config")["data"]["kelp.yaml"])
    cfg = parse_config(data, "kelp.yaml", {})  # the ports Kelp will listen on, its defaults included
    expected = {
        "trainer": ("metrics", cfg.metrics.port),
        "serving": ("http", cfg.serving.port),
    }
    for component, (port_name, port) in expected.items():
        workload = find(manifests, "StatefulSet" if component == "trainer" else "Deployment", f"-{component}")
        container = pod_spec(workload)["containers"][0]
        assert kelp_args(container)[0] == ("train" if component == "trainer" else "serve")
        assert {"name": port_name, "containerPort": port, "protocol": "TCP"} in container["ports"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port_name}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port_name}
        assert container["startupProbe"]["httpGet"]["port"] == port_name
        service = find(manifests, "Service", f"-{component}")
        assert (
            service["spec"]["selector"].items() <= workload["spec"]["template"]["metadata"]["labels"].items()
        )
        in_group = component == "trainer" and container.get("command") == ["torchrun"]
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port_name, *(["rdzv"] * in_group)]


@pytest.mark.parametrize(("drain", "margin", "grace"), [(30, 15, 45), (60, 15, 75), (12.5, 5, 18)])
def test_trainer_grace_period_covers_the_drain(render: Render, drain: float, margin: int, grace: int) -> None:
    docs = render(
        minimal_values(
            {
                "config": {"trainer": {"drain_timeout_s": drain}},
                "trainer": {"terminationGraceMarginSeconds": margin},
            }
        )
    )
    trainer = find(docs, "StatefulSet", "-trainer")
    assert pod_spec(trainer)["terminationGracePeriodSeconds"] == grace == math.ceil(drain) + margin


# ------------------------------------------------------------------ the trainer group (replicas > 1)


@pytest.mark.parametrize("name", ["minimal", "production"])
def test_one_trainer_runs_kelp_train_without_torchrun(render: Render, name: str) -> None:
    """trainer.replicas 1 (default and production): the image's `kelp` entrypoint, as before the group."""
    manifests = render(VALUE_SETS[name]())
    trainer = find(manifests, "StatefulSet", "-trainer")
    assert trainer["spec"]["replicas"] == 1
    container = pod_spec(trainer)["containers"][0]
    assert "command" not in container
    assert container["args"] == ["train", "--config", "/etc/kelp/kelp.yaml"]
    assert [p["name"] for p in container["ports"]] == ["metrics"]
    assert not {"POD_NAME", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"} & {var["name"] for var in container["env"]}
    assert [p["name"] for p in find(manifests, "Service", "-trainer")["spec"]["ports"]] == ["metrics"]
    assert [
        d for d in manifests if d["kind"] == "PodDisruptionBudget" and "trainer" in d["metadata"]["name"]
    ] == []


def test_trainer_group_runs_torchrun_with_a_c10d_rendezvous_on_pod_0(render: Render) -> None:
    docs = render(minimal_values({"trainer": {"replicas": 3}}))
    trainer = find(docs, "StatefulSet", "-trainer")
    spec = pod_spec(trainer)
    (container,) = spec["containers"]
    assert trainer["spec"]["replicas"] == 3
    assert trainer["spec"]["podManagementPolicy"] == "Parallel"

    args = _torchrun(container, f"{trainer['metadata']['name']}-1")
    launch, entry, entry_args = config_from_args(args)
    assert container["args"][0] == "--nnodes=3:3" and (launch.min_nodes, launch.max_nodes) == (3, 3)
    assert launch.nproc_per_node == 1
    assert launch.rdzv_backend == "c10d"
    assert launch.run_id == RELEASE
    assert launch.max_restarts == 10
    assert launch.rdzv_configs["join_timeout"] == "240"
    assert launch.shutdown_timeout == spec["terminationGracePeriodSeconds"]  # the drain is never cut short
    assert entry_args[-5:] == ["-m", "kelp.cli", "train", "--config", "/etc/kelp/kelp.yaml"]
    assert Path(entry).name.startswith("python")

    # The endpoint is pod 0 through the headless Service that is the StatefulSet's serviceName.
    service = find(docs, "Service", "-trainer")
    assert trainer["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= trainer["spec"]["template"]["metadata"]["labels"].items()
    domain = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    host, port = launch.rdzv_endpoint.rsplit(":", 1)
    assert host == f"{trainer['metadata']['name']}-0.{domain}"
    assert {"name": "rdzv", "containerPort": int(port), "protocol": "TCP"} in container["ports"]
    assert {"name": "rdzv", "port": int(port), "targetPort": "rdzv", "protocol": "TCP"} in service["spec"][
        "ports"
    ]
    assert launch.local_addr == f"{trainer['metadata']['name']}-1.{domain}"
    pod_name = next(v for v in container["env"] if v["name"] == "POD_NAME")
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # A pod restarted alone must find the others' next round (kelp train --nnodes does the same).
    assert {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"} in container["env"]

    # Every rank still reads the one config and joins the one consumer group.
    data = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    assert parse_config(data, "kelp.yaml", {}).source.group_id == "kelp-trainer"


@pytest.mark.parametrize(("values", "replicas"), [({}, 1), ({"trainer": {"replicas": 3}}, 3)])
def test_trainer_pods_are_static_group_members_named_after_the_pod(
    render: Render, values: dict[str, Any], replicas: int
) -> None:
    """KIP-345: the pod name (stable across a StatefulSet pod's restarts) is the consumer's instance id.

    A restarted pod then rejoins the group as the same member and no partition moves. With several
    ranks each rank's id gets its rank, so the ids are distinct within the group.
    """
    docs = render(minimal_values(values))
    trainer = find(docs, "StatefulSet", "-trainer")
    (container,) = pod_spec(trainer)["containers"]
    env = {var["name"]: var for var in container["env"]}
    assert env["KELP_SOURCE__GROUP_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    data = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    ids = set()
    for rank in range(replicas):
        pod = f"{trainer['metadata']['name']}-{rank}"
        cfg = parse_config(data, pod, _fake_secret_env(container, pod))
        assert cfg.source.kind == "kafka" and cfg.source.group_instance_id == pod
        ids.add(cfg.source.for_rank(rank, replicas).group_instance_id)
    assert len(ids) == replicas


def test_an_instance_id_in_the_config_replaces_the_pod_name(render: Render) -> None:
    docs = render(minimal_values({"config": {"source": {"group_instance_id": "trainer-a"}}}))
    (container,) = pod_spec(find(docs, "StatefulSet", "-trainer"))["containers"]
    assert "KELP_SOURCE__GROUP_INSTANCE_ID" not in {var["name"] for var in container["env"]}
    cfg = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    assert cfg["source"]["group_instance_id"] == "trainer-a"


@pytest.mark.parametrize("replicas", [2, 3, 12])
def test_pod_0_is_rank_0(render: Render, replicas: int) -> None:
    """torchrun's c10d rendezvous numbers nodes in sorted (--local-addr, pid, id) order.

    Each pod joins under its own DNS name, so pod 0 is node rank 0 (the rank that
    checkpoints and publishes) also with ten or more pods (…-trainer-10 sorts after …-trainer-0.).
    """
    trainer = find(render(minimal_values({"trainer": {"replicas": replicas}})), "StatefulSet", "-trainer")
    (container,) = pod_spec(trainer)["containers"]
    pods = [f"{trainer['metadata']['name']}-{i}" for i in range(replicas)]
    addrs = {pod: _torchrun(container, pod).local_addr for pod in pods}
    assert len(set(addrs.values())) == replicas
    assert min(addrs, key=addrs.__getitem__) == pods[0]
    endpoint_host = _torchrun(container, pods[1]).rdzv_endpoint.rsplit(":", 1)[0]
    assert endpoint_host == addrs[pods[0]]  # pod 0's torchrun recognises the endpoint as its own name


def test_trainer_group_min_replicas_makes_it_elastic(render: Render) -> None:
    trainer = find(
        render(
            minimal_values({"trainer": {"replicas": 4, "distributed": {"minReplicas": 2, "maxRestarts": 3}}})
        ),
        "StatefulSet",
        "-trainer",
    )
    launch, _, _ = config_from_args(_torchrun(pod_spec(trainer)["containers"][0], "kelp-trainer-0"))
    assert (launch.min_nodes, launch.max_nodes, launch.max_restarts) == (2, 4, 3)


def test_trainer_group_pod_disruption_budget_allows_one_pod_down(render: Render) -> None:
    docs = render(minimal_values({"trainer": {"replicas": 3}}))
    trainer = find(docs, "StatefulSet", "-trainer")
    pdb = find(docs, "PodDisruptionBudget", "-trainer")
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": trainer["spec"]["selector"]["matchLabels"]},
    }
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= trainer["spec"]["template"]["metadata"]["labels"].items()
    )
    serving = find(docs, "Deployment", "-serving")["spec"]["template"]["metadata"]["labels"]
    assert not pdb["spec"]["selector"]["matchLabels"].items() <= serving.items()

    docs = render(minimal_values({"trainer": {"replicas": 3, "podDisruptionBudget": {"enabled": False}}}))
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "PodDisruptionBudget"] == ["kelp-serving"]


def test_trainer_group_gets_gpus_per_pod(render: Render) -> None:
    """group_values: production (1 GPU, CUDA image, node selector) with 3 pods; every pod asks for its GPU."""
    docs = render(group_values())
    trainer = find(docs, "StatefulSet", "-trainer")
    assert trainer["spec"]["replicas"] == GROUP_REPLICAS
    spec = pod_spec(trainer)
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith(":0.1.0-cu126")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert (
        config_from_args(_torchrun(container, "kelp-trainer-0"))[0].nproc_per_node == 1
    )  # one GPU, one rank
    cfg = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    assert cfg["trainer"]["device"] == "cuda"


def test_replicas_do_not_change_the_config(render: Render) -> None:
    """Rank, world size and rendezvous come from torchrun's env: every pod count renders the same config."""
    renders = [render(minimal_values({"trainer": {"replicas": n}})) for n in (1, 2, 5)]
    configs = {find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"] for docs in renders}
    assert len(configs) == 1


def test_checkpoints_on_emptydir_by_default_and_pvc_in_production(
    manifests: list[Manifest], value_set: tuple[str, dict[str, Any]]
) -> None:
    trainer = find(manifests, "StatefulSet", "-trainer")
    cfg = yaml.safe_load(find(manifests, "ConfigMap", "-config")["data"]["kelp.yaml"])
    container = pod_spec(trainer)["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "checkpoints")
    assert mount["mountPath"] == cfg["trainer"]["checkpoint_dir"]
    volumes = {v["name"]: v for v in pod_spec(trainer)["volumes"]}
    if value_set[0] != "minimal":
        assert "checkpoints" not in volumes
        (claim,) = trainer["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "checkpoints"
        assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    else:
        assert "emptyDir" in volumes["checkpoints"]
        assert "volumeClaimTemplates" not in trainer["spec"]


def test_gpu_trainer_requests_nvidia_gpus(production_manifests: list[Manifest]) -> None:
    trainer = find(production_manifests, "StatefulSet", "-trainer")
    container = pod_spec(trainer)["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith(":0.1.0-cu126")
    serving = pod_spec(find(production_manifests, "Deployment", "-serving"))["containers"][0]
    assert "nvidia.com/gpu" not in serving["resources"].get("limits", {})


def test_hpa_owns_serving_replicas_when_enabled(production_manifests: list[Manifest]) -> None:
    deployment = find(production_manifests, "Deployment", "-serving")
    hpa = find(production_manifests, "HorizontalPodAutoscaler", "-serving")
    # Without a live Deployment to read (install, helm template): the autoscaler's minimum. An upgrade
    # renders the live count (tests/deploy/test_chart_on_k8s.py): never the field's default of 1.
    assert deployment["spec"]["replicas"] == hpa["spec"]["minReplicas"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    pdb = find(production_manifests, "PodDisruptionBudget", "-serving")
    assert pdb["spec"] == {
        "minAvailable": 2,
        "selector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }


def test_pods_run_non_root_with_read_only_root_filesystem(manifests: list[Manifest]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "USER 10001:10001" in dockerfile
    for doc, container in _kelp_containers(manifests):
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and sc["runAsNonRoot"] is True
        assert not sc.get("privileged") and "add" not in sc["capabilities"]
        writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        assert "/tmp" in writable, f"{doc['metadata']['name']}: no writable /tmp"


def test_helm_test_hook_probes_the_serving_service(manifests: list[Manifest]) -> None:
    pod = find(manifests, "Pod", "-probe")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = find(manifests, "Service", "-serving")
    (port,) = service["spec"]["ports"]
    url = f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{port['port']}"
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["probe", "--config", "/etc/kelp/kelp.yaml", "--url", url]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert (
        volumes["config"]["configMap"]["name"] == find(manifests, "ConfigMap", "-config")["metadata"]["name"]
    )
    assert pod["spec"]["restartPolicy"] == "Never"


def test_config_change_rolls_the_pods(render: Render) -> None:
    def checksums(docs: list[Manifest]) -> list[str]:
        return [
            find(docs, kind, suffix)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for kind, suffix in (("StatefulSet", "-trainer"), ("Deployment", "-serving"))
        ]

    before = checksums(render(minimal_values()))
    after = checksums(render(minimal_values({"config": {"batching": {"batch_size": 1024}}})))
    assert before[0] == before[1] and after[0] == after[1] and before != after


# ------------------------------------------------------------------ monitoring objects


def test_service_monitor_scrapes_trainer_and_serving(production_manifests: list[Manifest]) -> None:
    monitor = find(production_manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]
    scraped = {}
    for service in (d for d in production_manifests if d["kind"] == "Service"):
        labels = service["metadata"]["labels"]
        if selector["matchLabels"].items() <= labels.items() and all(
            labels.get(e["key"]) in e["values"] for e in selector["matchExpressions"]
        ):
            scraped[labels["app.kubernetes.io/component"]] = {p["name"] for p in service["spec"]["ports"]}
    assert set(scraped) == {"trainer", "serving"}
    endpoint_ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert endpoint_ports == scraped["trainer"] | scraped["serving"]
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_service_monitor_labels_every_series_with_its_deployment(
    production_manifests: list[Manifest],
) -> None:
    """The label the dashboard's deployment variable and the alerts group by: the pod's release."""
    monitor = find(production_manifests, "ServiceMonitor")
    for endpoint in monitor["spec"]["endpoints"]:
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
            "targetLabel": "deployment",
        } in endpoint["relabelings"], endpoint["port"]
    for workload in (d for d in production_manifests if d["kind"] in ("StatefulSet", "Deployment")):
        assert workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_prometheus_rule_carries_the_alert_file(production_manifests: list[Manifest]) -> None:
    rule = find(production_manifests, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text(encoding="utf-8"))


def test_dashboard_config_map_carries_the_dashboard(manifests: list[Manifest]) -> None:
    dashboard = find(manifests, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["kelp-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_monitoring_files_have_one_source() -> None:
    """The dashboard and alert rules live only in the chart's files/ (no second copy to drift)."""
    assert not (ROOT / "monitoring").exists()
    for path in (DASHBOARD, ALERTS, ALERT_TESTS):
        assert path.is_file() and not path.is_symlink(), path


def test_helm_lint_reports_invalid_values() -> None:
    report = helm.lint(CHART_DIR, {"config": {"store": {"backend": "cassandra"}}}, strict=True)
    assert any("/config/store/backend" in error for error in report["errors"]), report


def test_packaged_chart_renders_the_same(tmp_path: Path, production_manifests: list[Manifest]) -> None:
    """`helm package` output (what users install) carries the monitoring files and leaves out ci/."""
    archive = helm.package(CHART_DIR, destination=tmp_path)
    with helm.Chart.load(archive) as packaged:
        names = {f["name"] for f in packaged.files}
        assert {"files/kelp-dashboard.json", "files/kelp-alerts.yaml"} <= names
        assert "files/kelp-alerts.test.yaml" not in names  # promtool's unit tests are not shipped
        assert not any(name.startswith("ci/") for name in names)
        rendered = packaged.render(
            load_values(PRODUCTION_VALUES), name="kelp", namespace=NAMESPACE, is_install=True
        )
    assert parse_rendered(rendered) == production_manifests


# ------------------------------------------------------------------ least privilege


def _env_refs(container: dict[str, Any]) -> dict[str, dict[str, str]]:
    names = [var["name"] for var in container["env"]]
    assert len(names) == len(set(names)), f"duplicate env vars: {names}"
    return {
        var["name"]: var["valueFrom"]["secretKeyRef"]
        for var in container["env"]
        if "secretKeyRef" in var.get("valueFrom", {})  # not the pod fields (fieldRef)
    }


def test_trainer_and_serving_log_in_as_their_own_redis_users(render: Render) -> None:
    """secrets.store.trainerAuth / servingAuth: each workload gets its ACL user's name and password."""
    values = load_values(PRODUCTION_VALUES)
    values["secrets"]["store"]["trainerAuth"] = {
        "existingSecret": "redis-trainer", "usernameKey": "user", "passwordKey": "pass",
    }  # fmt: skip
    values["secrets"]["store"]["servingAuth"] = {
        "existingSecret": "redis-serving", "usernameKey": "username", "passwordKey": "password",
    }  # fmt: skip
    docs = render(values)
    data = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    expected = {
        "StatefulSet": ("redis-trainer", "user", "pass"),
        "Deployment": ("redis-serving", "username", "password"),
    }
    for doc, container in _kelp_containers(docs):
        refs = _env_refs(container)
        if doc["kind"] == "Pod":  # the helm test probe talks HTTP only: the shared settings
            assert (
                "KELP_STORE__USERNAME" not in refs
                and refs["KELP_STORE__PASSWORD"]["name"] == "kelp-redis-auth"
            )
            continue
        secret, user_key, password_key = expected[doc["kind"]]
        assert refs["KELP_STORE__USERNAME"] == {"name": secret, "key": user_key}
        assert refs["KELP_STORE__PASSWORD"] == {"name": secret, "key": password_key}
        cfg = parse_config(data, doc["metadata"]["name"], _fake_secret_env(container))
        assert cfg.store.username == f"secret:{secret}/{user_key}"  # the env wins over config.store.username
        assert cfg.store.password is not None
        assert cfg.store.password.get_secret_value() == f"secret:{secret}/{password_key}"


def test_without_acl_users_every_pod_shares_the_store_password(production_manifests: list[Manifest]) -> None:
    for _doc, container in _kelp_containers(production_manifests):
        refs = _env_refs(container)
        assert (
            "KELP_STORE__USERNAME" not in refs and refs["KELP_STORE__PASSWORD"]["name"] == "kelp-redis-auth"
        )


def test_serving_bearer_token_is_a_mounted_secret(production_manifests: list[Manifest]) -> None:
    cfg = yaml.safe_load(find(production_manifests, "ConfigMap", "-config")["data"]["kelp.yaml"])
    token_file = Path(cfg["serving"]["auth_token_file"])
    secret = load_values(PRODUCTION_VALUES)["secrets"]["serving"]["authToken"]
    for suffix, kind in (("-serving", "Deployment"), ("-probe", "Pod")):
        spec = pod_spec(find(production_manifests, kind, suffix))
        (container,) = spec["containers"]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(token_file.parent))
        assert mount["readOnly"] is True
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == secret["existingSecret"]
        assert volume["secret"]["items"] == [{"key": secret["key"], "path": token_file.name}]
    trainer = pod_spec(find(production_manifests, "StatefulSet", "-trainer"))
    assert all(m["mountPath"] != str(token_file.parent) for m in trainer["containers"][0]["volumeMounts"])


def _peers(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return rule.get("from", [])


def test_network_policies_admit_only_the_release_prometheus_and_clients(
    production_manifests: list[Manifest],
) -> None:
    release = {"app.kubernetes.io/name": "kelp", "app.kubernetes.io/instance": RELEASE}
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    trainer_pod = pod_spec(find(production_manifests, "StatefulSet", "-trainer"))
    trainer_ports = {p["name"] for p in trainer_pod["containers"][0]["ports"]}
    serving_pod = pod_spec(find(production_manifests, "Deployment", "-serving"))
    serving_ports = {p["name"] for p in serving_pod["containers"][0]["ports"]}

    trainer = find(production_manifests, "NetworkPolicy", "-trainer")["spec"]
    assert trainer["policyTypes"] == ["Ingress"]
    assert trainer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "trainer"
    own, scrape = trainer["ingress"]
    assert (
        _peers(own) == [{"podSelector": {"matchLabels": release}}] and "ports" not in own
    )  # rendezvous, ranks
    assert _peers(scrape) == [prometheus] and [p["port"] for p in scrape["ports"]] == ["metrics"]
    assert "metrics" in trainer_ports

    serving = find(production_manifests, "NetworkPolicy", "-serving")["spec"]
    assert serving["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "serving"
    (rule,) = serving["ingress"]  # storefront is configured: no open rule
    assert _peers(rule) == [
        {"podSelector": {"matchLabels": release}},
        prometheus,
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "storefront"}}},
    ]
    assert [p["port"] for p in rule["ports"]] == ["http"] and "http" in serving_ports


def test_network_policy_off_by_default_and_open_serving_without_client_namespaces(render: Render) -> None:
    assert not [d for d in render(minimal_values()) if d["kind"] == "NetworkPolicy"]
    docs = render(minimal_values({"networkPolicy": {"enabled": True}}))
    serving = find(docs, "NetworkPolicy", "-serving")["spec"]
    assert serving["ingress"][-1] == {"ports": [{"port": "http", "protocol": "TCP"}]}
    for doc in docs:
        if doc["kind"] == "NetworkPolicy":
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_grpc_port_in_the_config_is_opened_on_pod_and_service(render: Render) -> None:
    values = VALUE_SETS["production"]()
    values.setdefault("config", {}).setdefault("serving", {})["grpc_port"] = 8081
    manifests = render(values)
    container = pod_spec(find(manifests, "Deployment", "-serving"))["containers"][0]
    assert {"name": "grpc", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    service = find(manifests, "Service", "-serving")
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["port"] == 8081 and grpc["targetPort"] == "grpc"
    kubernetes_validate.validate(service, K8S_VERSION, strict=True)
    policy = find(manifests, "NetworkPolicy", "-serving")
    assert all({"port": "grpc", "protocol": "TCP"} in rule["ports"] for rule in policy["spec"]["ingress"])


# ------------------------------------------------------------------ the joiner (join.enabled)


def _join_pod(docs: list[Manifest]) -> tuple[Manifest, dict[str, Any]]:
    join = find(docs, "Deployment", "-join")
    (container,) = pod_spec(join)["containers"]
    return join, container


@pytest.mark.parametrize("name", ["minimal", "production", "group"])
def test_join_is_off_by_default(render: Render, name: str) -> None:
    docs = render(VALUE_SETS[name]())
    components = {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in docs}
    assert "join" not in components


def test_join_runs_one_kelp_join_with_probes_on_its_metrics_port(render: Render) -> None:
    docs = render(VALUE_SETS["join"]())
    join, container = _join_pod(docs)
    assert join["spec"]["replicas"] == 1
    assert join["spec"]["strategy"] == {"type": "Recreate"}  # the old joiner stops before the new one starts
    assert "command" not in container  # the image's entrypoint: kelp
    assert container["args"] == ["join", "--config", "/etc/kelp/kelp.yaml"]
    cfg = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    assert "port" not in cfg["join"]  # the config's default, which the chart must match
    assert container["ports"] == [{"name": "metrics", "containerPort": 9410, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]

    spec = pod_spec(join)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == find(docs, "ConfigMap", "-config")["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    # The TLS files the chart wrote into the config (Redis, Kafka) are mounted where it points.
    for path in (cfg["store"]["tls"]["ca_file"], cfg["source"]["security"]["ssl_cafile"]):
        assert str(Path(path).parent) in mounts.values()
    trainer = find(docs, "StatefulSet", "-trainer")
    annotations = join["spec"]["template"]["metadata"]["annotations"]
    assert (
        annotations["checksum/config"]
        == trainer["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    )

    service = find(docs, "Service", "-join")
    assert service["spec"]["selector"].items() <= join["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9410, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_join_port_follows_the_config(render: Render) -> None:
    values = VALUE_SETS["join"]()
    values["config"]["join"]["port"] = 9500
    docs = render(values)
    _, container = _join_pod(docs)
    assert container["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    (port,) = find(docs, "Service", "-join")["spec"]["ports"]
    assert port["port"] == 9500 and port["targetPort"] == "metrics"


def test_join_gets_the_kafka_and_redis_secrets(render: Render) -> None:
    """Like the trainer: the Kafka password and the store's; its own ACL user and Redis URL when set."""
    secrets = load_values(PRODUCTION_VALUES)["secrets"]
    _, container = _join_pod(render(VALUE_SETS["join"]()))
    refs = _env_refs(container)
    assert refs["KELP_SOURCE__SECURITY__SASL_PASSWORD"] == {
        "name": secrets["kafka"]["saslPassword"]["existingSecret"],
        "key": secrets["kafka"]["saslPassword"]["key"],
    }
    assert refs["KELP_STORE__PASSWORD"]["name"] == secrets["store"]["password"]["existingSecret"]
    assert "KELP_STORE__USERNAME" not in refs and "KELP_JOIN__REDIS_URL" not in refs

    values = VALUE_SETS["join"]()
    values["secrets"]["store"]["joinAuth"] = {
        "existingSecret": "redis-join", "usernameKey": "user", "passwordKey": "pass",
    }  # fmt: skip
    values["secrets"]["join"] = {"redisUrl": {"existingSecret": "join-redis", "key": "url"}}
    del values["config"]["join"]["redis_url"]  # the Secret's URL stands in for it
    docs = render(values)
    _, container = _join_pod(docs)
    refs = _env_refs(container)
    assert refs["KELP_STORE__USERNAME"] == {"name": "redis-join", "key": "user"}
    assert refs["KELP_STORE__PASSWORD"] == {"name": "redis-join", "key": "pass"}
    assert refs["KELP_JOIN__REDIS_URL"] == {"name": "join-redis", "key": "url"}
    data = yaml.safe_load(find(docs, "ConfigMap", "-config")["data"]["kelp.yaml"])
    cfg = parse_config(data, "join", _fake_secret_env(container))
    assert cfg.join.redis_url == "secret:join-redis/url" and problems(cfg, "join") == []
    for doc, other in _kelp_containers(docs):
        if other is not container:  # the joiner's Redis and user are the joiner's alone
            assert "KELP_JOIN__REDIS_URL" not in _env_refs(other), doc["metadata"]["name"]
            assert _env_refs(other).get("KELP_STORE__USERNAME", {}).get("name") != "redis-join"


def test_join_is_scraped_and_admits_only_prometheus(render: Render) -> None:
    docs = render(VALUE_SETS["join"]())
    monitor = find(docs, "ServiceMonitor")
    service = find(docs, "Service", "-join")
    labels = service["metadata"]["labels"]
    selector = monitor["spec"]["selector"]
    assert selector["matchLabels"].items() <= labels.items()
    assert all(labels.get(e["key"]) in e["values"] for e in selector["matchExpressions"])
    assert {p["name"] for p in service["spec"]["ports"]} <= {e["port"] for e in monitor["spec"]["endpoints"]}

    policy = find(docs, "NetworkPolicy", "-join")["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "join"
    assert policy["policyTypes"] == ["Ingress"]  # egress to Kafka and Redis stays open
    (rule,) = policy["ingress"]
    assert _peers(rule) == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
