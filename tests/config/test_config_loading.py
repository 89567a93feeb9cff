"""Config loading: YAML, env overrides, field-level errors, redaction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kelp.config import FileSourceConfig, KelpConfig, effective_config, load_config, parse_config
from kelp.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

MINIMAL = {
    "source": {"kind": "file", "path": "data.tsv", "format": "criteo_tsv"},
    "publisher": {"channel": "filesystem", "path": "snapshots"},
    "features": {"sparse": [{"name": "C1"}], "dense": [{"name": "I1", "transforms": ["log1p"]}]},
}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kelp.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_shipped_examples_validate(example: Path) -> None:
    cfg = load_config(example, environ={})
    assert cfg.features.sparse  # MovieLens has no dense features
    assert {f.table_name for f in cfg.features.sparse} <= {t.name for t in cfg.features.tables}


def test_examples_exist_for_both_workloads() -> None:
    assert {p.name for p in EXAMPLES} >= {"criteo-kaggle.yaml", "criteo-synth.yaml", "movielens-100k.yaml"}


def test_the_movielens_example_passes_the_file_checks_where_the_data_is() -> None:
    """``kelp config validate`` also opens the files: every mapped and joined column must exist."""
    from kelp.daemon.preflight import preflight

    cfg = load_config(ROOT / "examples" / "movielens-100k.yaml", environ={})
    if not cfg.source.path.exists():  # type: ignore[union-attr]
        pytest.skip("MovieLens-100k is not beside this checkout (../shared/data); it is not redistributed")
    preflight(cfg, "movielens-100k.yaml", role="train")


def test_sparse_feature_gets_table_from_defaults() -> None:
    cfg = parse_config(MINIMAL)
    table = cfg.features.table("C1")
    assert table.dim == cfg.features.table_defaults.dim
    assert cfg.features.dense[0].transforms[0].kind == "log1p"


def test_relative_paths_resolve_against_config_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "source: {kind: file, path: data/x.tsv, format: criteo_tsv}\n"
        "publisher: {channel: filesystem, path: snapshots}\n",
    )
    cfg = load_config(path, environ={})
    assert isinstance(cfg.source, FileSourceConfig)
    assert cfg.source.path == tmp_path / "data" / "x.tsv"
    assert cfg.trainer.checkpoint_dir.is_absolute()


def test_default_checkpoints_are_per_deployment(tmp_path: Path) -> None:
    """Two deployments never resume each other's dense model by default."""
    source = "source: {kind: file, path: x.tsv, format: criteo_tsv}\npublisher: {enabled: false}\n"
    for deployment in ("ads-a", "ads-b"):
        cfg = load_config(_write(tmp_path, f"deployment: {deployment}\n{source}"), environ={})
        assert cfg.trainer.checkpoint_dir == tmp_path / "runs" / deployment / "checkpoints"


def test_env_overrides_nested_fields_lists_and_types() -> None:
    env = {
        "KELP_STORE__BACKEND": "redis",
        "KELP_STORE__URLS": "redis://a:6379,redis://b:6379",
        "KELP_STORE__RETRY__ATTEMPTS": "7",
        "KELP_FEATURES__SPARSE__0__MAX_IDS": "8",
        "KELP_DEPLOYMENT": "prod-eu",
        "KELP_CONFIG": "/ignored/not/a/field.yaml",
        "OTHER_VAR": "ignored",
    }
    cfg = parse_config(MINIMAL, environ=env)
    assert cfg.store.backend == "redis"
    assert cfg.store.urls == ["redis://a:6379", "redis://b:6379"]
    assert cfg.store.retry.attempts == 7
    assert cfg.features.sparse[0].max_ids == 8
    assert cfg.deployment == "prod-eu"


def test_env_yaml_values_for_lists() -> None:
    cfg = parse_config(MINIMAL, environ={"KELP_TRAINER__TOP_MLP": "[128, 32]"})
    assert cfg.trainer.top_mlp == [128, 32]


def test_env_error_names_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(MINIMAL, origin="f.yaml", environ={"KELP_STORE__RETRY__ATTEMPTS": "zero"})
    message = str(err.value)
    assert "store.retry.attempts" in message
    assert "'zero'" in message
    assert "KELP_STORE__RETRY__ATTEMPTS" in message
    assert "integer" in message


def test_env_index_out_of_range_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not an index"):
        parse_config(MINIMAL, environ={"KELP_FEATURES__SPARSE__5__MAX_IDS": "2"})


@pytest.mark.parametrize(
    ("patch", "field", "expected"),
    [
        ({"store": {"backend": "mysql"}}, "store.backend", "'memory', 'redis' or 'redis-cluster'"),
        ({"store": {"bakend": "redis"}}, "store.bakend", "unknown field; expected one of: backend"),
        ({"store": {"backend": "redis"}}, "store", "needs at least one url"),
        ({"store": {"urls": ["http://x"]}}, "store", "must start with redis://"),
        ({"trainer": {"device": "tpu"}}, "trainer.device", "expected auto, cpu, cuda or cuda:N"),
        (
            {"trainer": {"checkpoint_every_steps": 0}},
            "trainer.checkpoint_every_steps",
            "greater than or equal to 1",
        ),
        ({"deployment": "Bad_Name"}, "deployment", "lowercase"),
        ({"batching": {"batch_size": -1}}, "batching.batch_size", "greater than or equal to 1"),
        ({"features": {"sparse": [{"name": "C1"}, {"name": "C1"}]}}, "features", "duplicate sparse feature"),
        (
            {"features": {"dense": [{"name": "x", "transforms": ["cube"]}]}},
            "features.dense[0].transforms[0]",
            "got 'cube': expected one of 'log1p', 'clip', 'standardize'",
        ),
        ({"source": {"kind": "kafka"}}, "source.bootstrap_servers", "required field is missing"),
        ({"source": {"kind": "pigeon"}}, "source.kind", "got 'pigeon': expected one of 'kafka', 'file'"),
        (
            {"source": {"kind": "file", "topics": ["t"]}},
            "source.topics",
            "unknown field; expected one of: csv",
        ),
        (
            {"source": {"kind": "kafka", "bootstrap_servers": [], "topics": ["t"]}},
            "source.bootstrap_servers",
            "at least 1",
        ),
        (
            {
                "source": {
                    "kind": "kafka",
                    "bootstrap_servers": "b:9092",
                    "topics": "t",
                    "security": {"protocol": "SASL_SSL"},
                }
            },
            "source.security",
            "needs sasl_mechanism",
        ),
        (
            {"trainer": {"model": "fm"}},
            "trainer.model",
            "expected 'dlrm-small', 'dcn-v2', 'deepfm' or an import reference package.module:attr",
        ),
        (
            {"publisher": {"channel": "redis", "path": None}},
            "publisher.channel",
            "store.backend is 'memory' and publisher.redis_url is not set",
        ),
        ({"publisher": {"channel": "filesystem", "path": None}}, "publisher", "needs path"),
    ],
)
def test_invalid_configs_name_field_value_and_expectation(patch: dict, field: str, expected: str) -> None:
    data = _merge(MINIMAL, patch)
    with pytest.raises(ConfigError) as err:
        parse_config(data, origin="kelp.yaml")
    message = str(err.value)
    assert f"kelp.yaml: {field}" in message, message
    assert expected in message, message


def _merge(base: dict, patch: dict) -> dict:
    out = json.loads(json.dumps(base))
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def test_yaml_syntax_error_has_line_number(tmp_path: Path) -> None:
    path = _write(tmp_path, "store:\n  backend: [redis\n")
    with pytest.raises(ConfigError, match=r"line \d+, column \d+: invalid YAML"):
        load_config(path, environ={})


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"), environ={})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_secrets_are_redacted_but_missing_secrets_stay_visible() -> None:
    cfg = parse_config(
        _merge(MINIMAL, {"store": {"backend": "redis", "urls": ["redis://h:1"], "password": "s3cr3t"}})
    )
    shown = effective_config(cfg)
    assert shown["store"]["password"] == "**redacted**"
    assert "s3cr3t" not in json.dumps(shown)
    assert shown["source"]["kind"] == "file"
    assert cfg.store.password is not None
    assert cfg.store.password.get_secret_value() == "s3cr3t"


def test_every_field_has_a_description_or_is_self_explanatory() -> None:
    # Sections (models) document themselves with docstrings; a few scalar fields are obvious by name.
    assert KelpConfig.model_fields["deployment"].description


def _kelp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        check=False,
    )


def test_cli_validate_rejects_broken_config_with_one_line_per_field(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "source: {kind: file, path: x.tsv, format: criteo_tsv}\n"
        "store: {backend: mysql}\ntrainer: {device: tpu}\n",
    )
    result = _kelp("config", "validate", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "store.backend: got 'mysql': expected 'memory', 'redis' or 'redis-cluster'" in result.stderr
    assert "trainer.device: got 'tpu'" in result.stderr


def test_cli_validate_and_show_accept_example_with_env_override() -> None:
    example = str(ROOT / "examples" / "criteo-synth.yaml")
    ok = _kelp("config", "validate", example)
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout
    shown = _kelp("config", "show", "--format", "json", example, env={"KELP_STORE__PASSWORD": "pw-123"})
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["store"]["password"] == "**redacted**"
    assert "pw-123" not in shown.stdout


def test_layout_1_config_fails_with_one_hint_per_moved_setting(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "version: 1\n"
        "source: {kind: file, file: {path: x.tsv, format: criteo_tsv}}\n"
        "kafka: {bootstrap_servers: [b:9092], topics: [t]}\n",
    )
    result = _kelp("config", "validate", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    assert "version: got 1: this is a layout-1 config" in lines[0]
    assert "kafka: moved into source: write source: {kind: kafka" in lines[1]
    assert "KELP_SOURCE__X" in lines[1]
    assert "source.file: moved up one level: write source: {kind: file, path: ..." in lines[2]


def test_layout_1_env_override_gets_the_same_hint() -> None:
    with pytest.raises(ConfigError, match="kafka: moved into source"):
        parse_config(MINIMAL, environ={"KELP_KAFKA__GROUP_ID": "g"})


def test_source_without_kind_says_which_kinds_exist() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"source": {"path": "x.tsv"}}, origin="kelp.yaml")
    assert str(err.value) == (
        "kelp.yaml: source.kind: required field is missing: expected one of 'kafka', 'file'"
    )
