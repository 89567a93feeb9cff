"""Generate the ``config`` part of ``helm/kelp/values.schema.json`` from the config models in ``config/``.

The chart's ``config`` value *is* the Kelp config file, so its JSON schema comes
from the pydantic models (unknown keys, enums and ranges then fail at
``helm install`` with the field's path, not later in a crash-looping pod).
The chart then narrows a few fields to what works across pods: the store must be
Redis (serving replicas read the trainer's rows), the source Kafka, the
publisher channel Redis (its ``redis_url``, like the joiner's, without credentials,
which belong in a Secret), and the trainer's HTTP endpoint enabled (its probes).

Run after changing a config model under ``config/`` (``tests/deploy`` fails until you do)::

    .venv/bin/python helm/tools/values_schema.py
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "helm" / "kelp" / "values.schema.json"
CHART_DEF_PREFIX = "Chart"

# Transform shorthand the config loader accepts: `transforms: [log1p]`.
_TRANSFORM_NAMES = ["log1p", "clip", "standardize"]


def _strip_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items() if k != "title" or not isinstance(v, str)}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def _url_without_credentials(description: str) -> dict[str, Any]:
    """An optional URL with no ``@`` (so no password): the config is rendered into a ConfigMap."""
    return {
        "anyOf": [{"type": "string", "pattern": "^[^@]*$"}, {"type": "null"}],
        "default": None,
        "description": description,
    }


def _narrow(config: dict[str, Any], defs: dict[str, Any]) -> None:
    """What the chart needs beyond what Kelp accepts (each with the reason in its description)."""
    config["required"] = ["features", "source", "store"]
    config["properties"]["source"] = {
        "$ref": "#/$defs/KafkaSourceConfig",
        "description": "The chart deploys the Kafka trainer group (file replay is for local runs).",
    }

    store = defs["StoreConfig"]["properties"]
    store["backend"] = {
        "enum": ["redis", "redis-cluster"],
        "description": "redis: client-sharded nodes; redis-cluster: Redis Cluster seed nodes. "
        "(memory cannot be used with this chart: serving replicas read the rows the trainer writes.)",
    }
    store["urls"]["minItems"] = 1
    for secret in ("password",):
        store[secret] = {
            "type": "null",
            "description": f"Never set here (the config is a ConfigMap): use secrets.store.{secret}.",
        }
    security = defs["KafkaSecurity"]["properties"]
    security["sasl_password"] = {
        "type": "null",
        "description": "Never set here (the config is a ConfigMap): use secrets.kafka.saslPassword.",
    }
    security["ssl_password"] = {
        "type": "null",
        "description": "Never set here (the config is a ConfigMap): use secrets.kafka.sslKeyPassword.",
    }
    defs["KafkaSourceConfig"]["properties"]["kind"] = {"const": "kafka"}
    defs["KafkaSourceConfig"].setdefault("required", []).insert(0, "kind")
    for unused in ("FileSourceConfig", "CsvMapping"):
        defs.pop(unused, None)
    defs["PublisherConfig"]["properties"]["channel"] = {
        "const": "redis",
        "description": "Trainer and serving pods share no filesystem, so snapshots travel through Redis.",
    }
    defs["PublisherConfig"]["properties"]["redis_url"] = _url_without_credentials(
        "The snapshot channel's own Redis (default: the store's first url); use one with "
        "maxmemory-policy noeviction. No credentials here (the config is a ConfigMap): put a URL with a "
        "password in secrets.publisher.redisUrl."
    )
    defs["JoinConfig"]["properties"]["redis_url"] = _url_without_credentials(
        "Redis of the joiner's waiting impressions (default: the store's first url; a Redis Cluster "
        "store needs a standalone one here). No credentials here (the config is a ConfigMap): put a URL "
        "with a password in secrets.join.redisUrl."
    )
    defs["MetricsConfig"]["properties"]["enabled"] = {
        "const": True,
        "description": "The trainer's liveness/readiness probes use /healthz and /readyz on metrics.port.",
    }
    transforms = defs["DenseFeature"]["properties"]["transforms"]
    transforms["items"] = {"anyOf": [{"enum": _TRANSFORM_NAMES}, transforms["items"]]}
    _named_paths_shorthand(defs["JsonMapping"]["properties"])


def _named_paths_shorthand(mapping: dict[str, Any]) -> None:
    """Shorthand the config loader accepts: ``dense_fields: [age, price]`` (each name is its own path).

    The models turn the list into a map before validating, so the schema pydantic writes knows only
    the map; without this a json mapping written the short way passes ``kelp config validate`` and
    fails ``helm install``.
    """
    for name in ("dense_fields", "sparse_fields"):
        field = mapping[name]
        kept = {k: v for k, v in field.items() if k in ("default", "description")}
        shape = {k: v for k, v in field.items() if k not in kept}
        mapping[name] = {"anyOf": [shape, {"type": "array", "items": {"type": "string"}}], **kept}


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The schema of the chart's ``config`` value and the ``$defs`` it refers to."""
    from kelp.config import KelpConfig

    full = _strip_titles(copy.deepcopy(KelpConfig.model_json_schema()))
    defs = full.pop("$defs")
    _narrow(full, defs)
    return full, defs


def render(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` (the committed values.schema.json) with the generated parts replaced."""
    config, defs = config_schema()
    out = copy.deepcopy(current)
    out["properties"]["config"] = config
    chart_defs = {k: v for k, v in out.get("$defs", {}).items() if k.startswith(CHART_DEF_PREFIX)}
    clash = sorted(set(chart_defs) & set(defs))
    if clash:
        raise SystemExit(f"config model names clash with the chart's $defs: {clash}")
    out["$defs"] = {**chart_defs, **dict(sorted(defs.items()))}
    return out


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    current = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    SCHEMA_PATH.write_text(dumps(render(current)), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
