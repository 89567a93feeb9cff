"""``pythonPath`` puts a user model's folder on PYTHONPATH in the trainer and serving pods alike."""

from __future__ import annotations

from chartkit import Manifest, Render, minimal_values, pod_spec

KELP_KINDS = ("StatefulSet", "Deployment")


def _kelp_env(docs: list[Manifest]) -> dict[str, dict[str, str]]:
    """Per kelp workload (trainer, serving): its container's plain env values."""
    out = {}
    for doc in docs:
        if doc["kind"] in KELP_KINDS:
            container = pod_spec(doc)["containers"][0]
            out[doc["metadata"]["name"]] = {e["name"]: e.get("value") for e in container.get("env", [])}
    return out


def test_python_path_reaches_the_trainer_and_serving(render: Render) -> None:
    env = _kelp_env(render(minimal_values({"pythonPath": "/opt/kelp-models:/opt/shared"})))
    assert len(env) == 2, sorted(env)
    assert all(e.get("PYTHONPATH") == "/opt/kelp-models:/opt/shared" for e in env.values()), env


def test_no_python_path_by_default(render: Render) -> None:
    env = _kelp_env(render(minimal_values()))
    assert env and all("PYTHONPATH" not in e for e in env.values()), env
