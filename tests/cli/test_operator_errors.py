"""Operator-facing fit and finish, each through the real CLI: exit code, one line, no secret.

* a password inside a URL never reaches any output (config show, logs, errors,
  /metrics, snapshot manifests, /v1/model, files the run writes), checked
  against a real password-protected redis-server;
* an endpoint that does not answer at start-up fails within the start-up
  budget, naming the setting and the (redacted) endpoint, for Redis under
  ``kelp train`` and ``kelp serve`` and for a Kafka bootstrap server;
* a rejected CSV row is reported as ``FILE:LINE`` with a documented reason, and
  the end-of-run summary counts rejections per reason;
* a declared feature no CSV column feeds is refused by ``kelp train`` as by
  ``kelp config validate`` (tests/cli/test_validate.py covers validate);
* an empty config file says it is empty;
* ``make demo`` installs no test-only system package;
* a deprecated config key loads, with one hint line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kelp.cli.startup_config import MESSAGE
from kelp.harness import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ROOT / "tests" / "daemon" / "data" / "criteo-2000.tsv"
SECRET = "Pw-issue17-7f3a"
WRONG = "Wrong-issue17-c41d"
REDACTED = "**redacted**"
EMPTY_MESSAGE = (
    "the config file is empty (nothing but whitespace or comments); a config needs at least a source: "
    "section, see examples/criteo-kaggle.yaml"
)


STARTUP_RECORD = MESSAGE  # logged by train, serve and join before anything can fail


def _kelp(
    *args: str, timeout_s: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=timeout_s,
        check=False,
    )


def _one_error(result: subprocess.CompletedProcess[str], code: int, *expected: str) -> str:
    """The command failed with ``code`` and printed exactly one line on stderr, ``kelp: error: ...``,
    besides the start-up record of the effective config that a long-running command logs first."""
    assert result.returncode == code, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if STARTUP_RECORD not in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("kelp: error: "), lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _criteo_config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """The shipped Criteo example on the 2000-row fixture, small batches, everything under ``tmp_path``."""
    cfg = yaml.safe_load((ROOT / "examples" / "criteo-kaggle.yaml").read_text())
    cfg["source"]["path"] = str(CRITEO)
    cfg["batching"] = {"batch_size": 64}
    cfg["trainer"] = {**cfg.get("trainer", {}), "checkpoint_dir": str(tmp_path / "ck"), "log_every_s": 0.1}
    cfg["metrics"] = {"enabled": False}
    for name, value in sections.items():
        cfg[name] = {**cfg.get(name, {}), **value} if isinstance(value, dict) else value
    return cfg


def _write(tmp_path: Path, cfg: dict[str, Any], name: str = "kelp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


# -- 1. secrets in URLs --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    with RedisServer(password=SECRET) as server:
        yield server


@pytest.mark.integration
def test_a_url_password_reaches_no_output(tmp_path: Path, locked_redis: RedisServer) -> None:
    """config show, train and serve logs, /metrics, /v1/model, manifests and run files: no password."""
    from prometheus_client import generate_latest

    from kelp.config import load_config
    from kelp.daemon.train import TrainDaemon

    url = locked_redis.url  # redis://:SECRET@127.0.0.1:PORT
    assert SECRET in url
    serving_port = free_port()
    cfg = _criteo_config(
        tmp_path,
        deployment="redact",
        store={"backend": "redis", "urls": [url]},
        publisher={"channel": "redis", "interval_s": 0.1, "redis_url": f"{url}/0"},
        trainer={"max_steps": 5},
        serving={"host": "127.0.0.1", "port": serving_port},
    )
    config = _write(tmp_path, cfg)
    outputs: dict[str, str] = {}

    for fmt in ("yaml", "json"):
        shown = _kelp("config", "show", str(config), "--format", fmt)
        assert shown.returncode == 0, shown.stderr
        outputs[f"config show {fmt}"] = shown.stdout + shown.stderr
        assert f"redis://:{REDACTED}@127.0.0.1:{locked_redis.port}" in shown.stdout

    trained = _kelp("--log-level", "debug", "train", "--config", str(config))
    assert trained.returncode == 0, trained.stderr[-3000:]
    outputs["kelp train"] = trained.stdout + trained.stderr

    # The trainer's /metrics text: the registry it serves, after an in-process run of the same config.
    daemon = TrainDaemon(load_config(config))
    daemon.run()
    outputs["trainer /metrics"] = generate_latest(daemon.registry).decode()
    assert "kelp_trainer_steps_total" in outputs["trainer /metrics"]

    client = locked_redis.client()
    manifests = [
        client.hget(k, "manifest") for k in client.keys("*redact:model*") if client.type(k) == b"hash"
    ]
    assert manifests, "the trainer published no snapshot"
    outputs["manifests"] = b"".join(m for m in manifests if m).decode()

    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kelp.cli", "--log-format", "json", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{serving_port}"
        deadline = time.monotonic() + 120
        while _http(f"{base}/readyz")[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        for path in ("/readyz", "/metrics", "/v1/model"):
            status, body = _http(base + path)
            assert status == 200, (path, body)
            outputs[f"serve {path}"] = body
        assert "kelp_serving_" in outputs["serve /metrics"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    outputs["serve log"] = log.read_text()

    for path in tmp_path.rglob("*"):  # checkpoints, progress record: everything the run wrote
        if path.is_file() and path != config:
            outputs[str(path)] = path.read_bytes().decode("latin-1")

    leaked = [where for where, text in outputs.items() if SECRET in text]
    assert not leaked, leaked


@pytest.mark.integration
def test_errors_about_a_url_hide_its_password(tmp_path: Path, locked_redis: RedisServer) -> None:
    wrong = _criteo_config(
        tmp_path, store={"backend": "redis", "urls": [f"redis://:{WRONG}@127.0.0.1:{locked_redis.port}"]}
    )
    line = _one_error(_kelp("train", "--config", str(_write(tmp_path, wrong))), 2, "authentication failed")
    assert WRONG not in line and SECRET not in line

    closed = free_port()
    gone = _criteo_config(
        tmp_path,
        store={"backend": "redis", "urls": [f"redis://kelp:{SECRET}@127.0.0.1:{closed}"]},
        trainer={"startup_timeout_s": 1},
    )
    line = _one_error(_kelp("train", "--config", str(_write(tmp_path, gone))), 1, "store.urls[0]")
    assert f"redis://kelp:{REDACTED}@127.0.0.1:{closed}" in line and SECRET not in line


# -- 2. fast start-up failures -------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("command", ["train", "serve"])
def test_an_unreachable_store_fails_at_start_up_naming_the_url_and_the_budget(
    tmp_path: Path, command: str
) -> None:
    """A trainer would otherwise retry for max_store_outage_s (an hour here: the test would time out)."""
    closed = free_port()
    cfg = _criteo_config(
        tmp_path,
        store={"backend": "redis", "urls": [f"redis://:{SECRET}@127.0.0.1:{closed}"]},
        trainer={"startup_timeout_s": 1, "max_store_outage_s": 3600},
        serving={"host": "127.0.0.1", "port": free_port(), "startup_timeout_s": 1},
    )
    result = _kelp(command, "--config", str(_write(tmp_path, cfg)), timeout_s=120)
    setting = "trainer.startup_timeout_s" if command == "train" else "serving.startup_timeout_s"
    line = _one_error(result, 1, "store.urls[0]", f"127.0.0.1:{closed}", "within 1s", setting)
    assert SECRET not in line and REDACTED in line


@pytest.mark.integration
def test_an_unreachable_kafka_bootstrap_fails_at_start_up(tmp_path: Path) -> None:
    closed = free_port()
    cfg = _criteo_config(tmp_path, trainer={"startup_timeout_s": 1}, publisher={"enabled": False})
    cfg["source"] = {"kind": "kafka", "bootstrap_servers": [f"127.0.0.1:{closed}"], "topics": ["events"]}
    result = _kelp("train", "--config", str(_write(tmp_path, cfg)), timeout_s=120)
    _one_error(result, 1, "source.bootstrap_servers", f"127.0.0.1:{closed}", "trainer.startup_timeout_s")


# -- 3. and 4. data errors point at the line -----------------------------------------------------

_CSV = (
    "label,price,user,note\n"  # line 1: the header
    "1,2.5,u1,a\n"  # 2
    "0,1.0,u2,b\n"  # 3
    "abc,1.0,u3,c\n"  # 4: label is text -> bad_type
    '1,1.5,u4,"spans\ntwo lines"\n'  # 5-6: one row over two lines
    "1,xyz,u5,d\n"  # 7: dense is text -> bad_type
    "7,1.0,u6,e\n"  # 8: binary label 7 -> bad_label
    "0,3,u7,f\n"  # 9
)


def _csv_config(
    tmp_path: Path, sparse: list[str], mapped: dict[str, str], dense_column: str = "price"
) -> Path:
    (tmp_path / "d.csv").write_text(_CSV)
    cfg = {
        "version": 2,
        "features": {
            "dense": [{"name": "price"}],
            "sparse": [{"name": s} for s in sparse],
            "table_defaults": {"dim": 4},
        },
        "source": {
            "kind": "file",
            "path": "d.csv",
            "format": "csv",
            "csv": {
                "label_column": "label",
                "dense_columns": {"price": dense_column},
                "sparse_columns": mapped,
            },
        },
        "trainer": {"checkpoint_dir": "ck"},
        "publisher": {"enabled": False},
        "metrics": {"enabled": False},
    }
    return _write(tmp_path, cfg)


def _documented_reasons() -> set[str]:
    text = (ROOT / "docs" / "consumers.md").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("Rejection reasons"))
    return set(re.findall(r"`(\w+)`", line))


def test_a_rejected_csv_row_is_reported_at_its_line_with_a_documented_reason(tmp_path: Path) -> None:
    config = _csv_config(tmp_path, ["user"], {"user": "user"})
    result = _kelp("train", "--config", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    data = tmp_path / "d.csv"
    rejected = {where: reason for reason, where in re.findall(r"reason=(\w+) .*?source=(\S+)", result.stderr)}
    assert rejected == {f"{data}:4": "bad_type", f"{data}:7": "bad_type", f"{data}:8": "bad_label"}, rejected
    assert set(rejected.values()) <= _documented_reasons()
    assert "records rejected: bad_label 1, bad_type 2" in result.stdout, result.stdout


def test_a_declared_feature_no_column_feeds_is_refused_by_train(tmp_path: Path) -> None:
    config = _csv_config(tmp_path, ["user", "item"], {"user": "user"})
    _one_error(_kelp("train", "--config", str(config)), 2, "features.sparse[1]", "'item' is declared")


def test_a_mapped_column_missing_from_the_header_lists_the_header(tmp_path: Path) -> None:
    config = _csv_config(tmp_path, ["user"], {"user": "user"}, dense_column="cost")
    line = _one_error(_kelp("config", "validate", str(config)), 2, "source.csv.dense_columns.price", "'cost'")
    assert "columns: label, price, user, note" in line


# -- 5. an empty config --------------------------------------------------------------------------


def test_an_empty_config_file_says_it_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "kelp.yaml"
    path.write_text("# only a comment\n\n")
    _one_error(_kelp("train", "--config", str(path)), 2, f"{path}: the config file is empty")


@pytest.mark.parametrize("text", ["", "\n  \n", "# only a comment\n"])
def test_an_empty_config_file_in_process(
    tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same through ``kelp.cli.main.main`` (no interpreter start per case)."""
    from kelp.cli.main import main

    for name in [n for n in os.environ if n.startswith("KELP_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "kelp.yaml"
    path.write_text(text)
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kelp: error: {path}: {EMPTY_MESSAGE}"], err


# -- 6. system packages --------------------------------------------------------------------------


def _deps(tmp_path: Path, *args: str) -> str:
    """What the installer would install on a machine that has none of the tools (an empty PATH)."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    result = subprocess.run(
        ["/bin/bash", str(ROOT / "scripts" / "install-system-deps.sh"), *args, "--dry-run"],
        capture_output=True,
        text=True,
        env={"PATH": str(empty)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_the_demo_installs_no_test_only_system_package(tmp_path: Path) -> None:
    assert "would install redis-server redis-tools with apt-get" in _deps(tmp_path)
    assert "prometheus" in _deps(tmp_path, "--with-test-tools")
    # Java and Maven for the Apache Kafka test broker: wanted by the tests, never by the demo.
    assert "openjdk-17-jre-headless maven" in _deps(tmp_path, "--with-test-tools")
    assert "openjdk" not in _deps(tmp_path) and "maven" not in _deps(tmp_path)

    def recipe(target: str) -> str:
        made = subprocess.run(
            ["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert made.returncode == 0, made.stderr
        return made.stdout

    assert "install-system-deps.sh" in recipe("demo") and "--with-test-tools" not in recipe("demo")
    assert "install-system-deps.sh --with-test-tools" in recipe("test")


# -- 7. deprecated keys --------------------------------------------------------------------------


def test_a_deprecated_key_loads_with_one_hint_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rename table is empty today, so the test registers a rename the way a release would."""
    from kelp.cli.main import main
    from kelp.config import loader

    cfg = _criteo_config(tmp_path, trainer={"outage_budget_s": 7})
    config = _write(tmp_path, cfg)
    for name in [n for n in os.environ if n.startswith("KELP_")]:
        monkeypatch.delenv(name)

    assert main(["config", "validate", str(config)]) == 2  # unknown until registered
    assert "trainer.outage_budget_s: unknown field" in capsys.readouterr().err

    monkeypatch.setitem(loader.DEPRECATED_KEYS, "trainer.outage_budget_s", "trainer.max_store_outage_s")
    assert main(["config", "show", str(config), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["trainer"]["max_store_outage_s"] == 7
    hints = err.strip().splitlines()
    assert len(hints) == 1, hints
    assert "trainer.outage_budget_s is deprecated: rename it to trainer.max_store_outage_s" in hints[0]


def test_kelp_probe_hides_a_password_in_the_replica_url(tmp_path: Path) -> None:
    config = _csv_config(tmp_path, ["user"], {"user": "user"})
    url = f"http://ops:{SECRET}@127.0.0.1:{free_port()}"
    result = _kelp("probe", "--config", str(config), "--url", url, "--timeout", "2")
    assert result.returncode == 1, result.stderr
    assert f"probe failed: http://ops:{REDACTED}@127.0.0.1:" in result.stdout, result.stdout
    assert SECRET not in result.stdout + result.stderr
