"""``kelp config validate`` warns, without failing, when the snapshot channel's Redis may evict its keys.

Each test starts its own redis-server with the ``maxmemory-policy`` under test.
The warning is one line naming the URL with its password redacted; a server
that cannot be reached, or that refuses ``CONFIG``, is a note, never a failure.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from validate_run import run_validate

from kelp.harness import RedisServer, free_port

pytestmark = pytest.mark.integration

CRITEO = Path(__file__).resolve().parents[1] / "consumers" / "data" / "criteo_sample.tsv"
BASE = (
    f"source: {{kind: file, path: {CRITEO}, format: criteo_tsv}}\n"
    "features:\n"
    "  dense: [" + ", ".join(f"{{name: I{i}}}" for i in range(1, 14)) + "]\n"
    "  sparse: [" + ", ".join(f"{{name: C{i}}}" for i in range(1, 27)) + "]\n"
)
PASSWORD = "s3cret-pw"


def _server(policy: str, password: str | None = None) -> Iterator[RedisServer]:
    with RedisServer(password=password, extra_args=["--maxmemory-policy", policy]) as server:
        yield server


@pytest.fixture
def lfu_server() -> Iterator[RedisServer]:
    yield from _server("allkeys-lfu", PASSWORD)


@pytest.fixture
def noeviction_server() -> Iterator[RedisServer]:
    yield from _server("noeviction", PASSWORD)


def _warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_a_channel_on_the_stores_evicting_redis_is_warned_about(
    tmp_path: Path, lfu_server: RedisServer
) -> None:
    # the store's URL carries the password: the channel uses it (no publisher.redis_url)
    text = BASE + f"store: {{backend: redis, urls: ['{lfu_server.url}']}}\n"
    lines = _warnings(run_validate(tmp_path, text))
    assert len(lines) == 1, lines
    line = lines[0]
    assert "warning:" in line and "shares the store's Redis" in line and "allkeys-lfu" in line
    assert f"redis://:**redacted**@127.0.0.1:{lfu_server.port}" in line
    assert "noeviction" in line and "layout marker" in line
    assert PASSWORD not in line


def test_a_redis_url_naming_the_stores_server_is_shared_too(tmp_path: Path, lfu_server: RedisServer) -> None:
    text = (
        BASE
        + f"store: {{backend: redis, urls: ['{lfu_server.url}']}}\n"
        + f"publisher: {{redis_url: '{lfu_server.url}/3'}}\n"  # another database, the same memory
    )
    lines = _warnings(run_validate(tmp_path, text))
    assert len(lines) == 1 and "shares the store's Redis" in lines[0], lines


def test_noeviction_says_nothing(tmp_path: Path, noeviction_server: RedisServer) -> None:
    text = BASE + f"store: {{backend: redis, urls: ['{noeviction_server.url}']}}\n"
    result = run_validate(tmp_path, text)
    assert _warnings(result) == []
    assert ": ok (" in result.stdout


def test_a_separate_channel_redis_is_checked_by_itself(
    tmp_path: Path, lfu_server: RedisServer, noeviction_server: RedisServer
) -> None:
    def config(store: RedisServer, channel: RedisServer) -> str:
        return (
            BASE
            + f"store: {{backend: redis, urls: ['{store.url}']}}\npublisher: {{redis_url: '{channel.url}'}}\n"
        )

    good = config(lfu_server, noeviction_server)
    assert _warnings(run_validate(tmp_path, good)) == []  # rows may be evicted, the channel's keys not
    bad = config(noeviction_server, lfu_server)
    lines = _warnings(run_validate(tmp_path, bad))
    assert len(lines) == 1 and "(publisher.redis_url) has maxmemory-policy allkeys-lfu" in lines[0], lines


def test_an_unreachable_redis_is_a_note_not_a_failure(tmp_path: Path) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}"
    lines = _warnings(run_validate(tmp_path, BASE + f"store: {{backend: redis, urls: ['{url}']}}\n"))
    assert len(lines) == 1 and "note:" in lines[0] and "could not reach it" in lines[0], lines
    assert PASSWORD not in lines[0]


def test_a_user_without_config_rights_is_a_note(tmp_path: Path, lfu_server: RedisServer) -> None:
    lfu_server.client().execute_command(
        "ACL", "SETUSER", "kelp-noconfig", "on", ">pw2", "~*", "+@all", "-config"
    )
    url = f"redis://kelp-noconfig:pw2@127.0.0.1:{lfu_server.port}"
    lines = _warnings(run_validate(tmp_path, BASE + f"store: {{backend: redis, urls: ['{url}']}}\n"))
    assert len(lines) == 1 and "note:" in lines[0] and "CONFIG GET was refused" in lines[0], lines
    assert "pw2" not in lines[0]
