"""A config file cannot exhaust memory, hang the reader, or hide a key: the bounds of kelp.config.yaml_reader.

Each refusal is one line naming the file and the limit; through the CLI it is
exit status 2 without a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from kelp.config import load_config
from kelp.config.yaml_reader import MAX_ALIAS_NODES, MAX_CONFIG_BYTES, MAX_DEPTH, MAX_NODES
from kelp.errors import ConfigError

SOURCE = "source: {kind: file, path: data.tsv, format: criteo_tsv}\n"
PUBLISHER = "publisher: {channel: filesystem, path: snapshots}\n"
VALID = SOURCE + PUBLISHER


def _laughs(levels: int) -> str:
    """The "billion laughs": each level is ten aliases of the one before, 10**levels strings in all."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return SOURCE + "\n".join(lines) + "\n"


def _write(tmp_path: Path, text: str, name: str = "kelp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(path: Path, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=environ or {})
    message = str(info.value)
    assert "\n" not in message, message
    return message


def _validate(path: Path | str) -> subprocess.CompletedProcess[str]:
    """``kelp config validate PATH`` in a child process: a reader that hangs fails the test, not the suite."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELP_")}
    try:
        return subprocess.run(
            [sys.executable, "-m", "kelp.cli", "config", "validate", str(path)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"kelp config validate {path} did not return: the reader blocked or ran unbounded")


def _one_line_exit_2(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


# --- aliases -------------------------------------------------------------------------------------


def test_a_billion_laughs_file_is_refused_in_one_line_by_the_cli(tmp_path: Path) -> None:
    path = _write(tmp_path, _laughs(9))
    assert path.stat().st_size < 1024  # a small file that stands for a billion strings
    _one_line_exit_2(_validate(path), str(path), f"more than {MAX_ALIAS_NODES:,} values")


def test_alias_expansion_is_refused_before_it_takes_memory(tmp_path: Path) -> None:
    path = _write(tmp_path, _laughs(6))  # a million strings once expanded
    tracemalloc.start()
    try:
        message = _error(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message.startswith(f"{path}: ")
    assert f"aliases expand to more than {MAX_ALIAS_NODES:,} values" in message
    assert peak < 50 * 1024 * 1024, peak


def test_a_few_aliases_still_work(tmp_path: Path) -> None:
    text = VALID + (
        "features:\n"
        "  sparse:\n"
        "    - &item {name: C1, max_ids: 4}\n"
        "    - {<<: *item, name: C2}\n"  # a merge key: name overrides the merged one, not a duplicate
        "  dense: [{name: I1}]\n"
    )
    cfg = load_config(_write(tmp_path, text), environ={})
    assert [(f.name, f.max_ids) for f in cfg.features.sparse] == [("C1", 4), ("C2", 4)]


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, VALID + "loop: &loop [1, *loop]\n"))
    assert "recursive alias" in message and "line 3" in message


def test_an_env_value_cannot_smuggle_in_a_billion_laughs(tmp_path: Path) -> None:
    nested = "[&l0 [x, x, x, x, x, x, x, x, x, x]"
    for i in range(1, 7):
        nested += f", &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]"
    nested += "]"
    message = _error(_write(tmp_path, VALID), {"KELP_FEATURES__SPARSE": nested})
    assert message.startswith("env KELP_FEATURES__SPARSE: ")
    assert f"more than {MAX_ALIAS_NODES:,} values" in message


# --- size, nesting, node count -------------------------------------------------------------------


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID + "#" * MAX_CONFIG_BYTES + "\n")
    assert _error(path) == (
        f"{path}: config file is larger than the 1 MiB ({MAX_CONFIG_BYTES} bytes) limit; a Kelp config "
        "is a few kilobytes: is this the right file?"
    )


def test_a_file_exactly_at_the_size_limit_loads(tmp_path: Path) -> None:
    filler = "#" * 99 + "\n"
    text = VALID + filler * ((MAX_CONFIG_BYTES - len(VALID)) // len(filler))
    text += "#" * (MAX_CONFIG_BYTES - len(text) - 1) + "\n"
    path = _write(tmp_path, text)
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert load_config(path, environ={}).source.kind == "file"


def test_deep_nesting_is_refused_with_its_line(tmp_path: Path) -> None:
    depth = 100_000
    message = _error(_write(tmp_path, VALID + "x: " + "[" * depth + "]" * depth + "\n"))
    assert f"nested more than {MAX_DEPTH} levels deep" in message and "line 3" in message


def test_too_many_values_are_refused(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, VALID + "x: [" + "1, " * MAX_NODES + "]\n"))
    assert f"holds more than {MAX_NODES:,} values" in message and "line 3" in message


# --- what is not a regular file ------------------------------------------------------------------


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "kelp.yaml"
    os.mkfifo(fifo)
    _one_line_exit_2(_validate(fifo), f"{fifo}: not a regular file but a FIFO (named pipe)")


def test_a_character_device_is_refused(tmp_path: Path) -> None:
    assert _error(Path("/dev/zero")) == (
        "/dev/zero: not a regular file but a character device; give the path of a YAML config file"
    )
    _one_line_exit_2(_validate("/dev/zero"), "/dev/zero: not a regular file")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    assert "not a regular file but a directory" in _error(tmp_path)


def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    """A Kubernetes ConfigMap mounts each key as a symlink into a ``..data`` directory."""
    target = _write(tmp_path, VALID, "real.yaml")
    link = tmp_path / "kelp.yaml"
    link.symlink_to(target)
    assert load_config(link, environ={}).publisher.channel == "filesystem"


# --- duplicate keys ------------------------------------------------------------------------------


def test_a_top_level_key_written_twice_names_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID + "store:\n  backend: memory\ndeployment: a\nstore:\n  backend: redis\n")
    assert _error(path) == (
        f"{path}: line 6: key 'store' is written twice in one mapping, on line 3 and line 6; keep one "
        "(a second one would silently replace the first)"
    )


def test_a_nested_key_written_twice_names_both_lines(tmp_path: Path) -> None:
    text = VALID + "features:\n  sparse:\n    - name: C1\n      max_ids: 4\n      max_ids: 8\n"
    message = _error(_write(tmp_path, text))
    assert "key 'max_ids' is written twice in one mapping, on line 6 and line 7" in message


def test_a_duplicate_key_in_a_flow_mapping_is_refused(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, VALID + "deployment: a\ntrainer: {seed: 1, seed: 2}\n"))
    assert "key 'seed' is written twice in one mapping, on line 4 and line 4" in message


def test_a_duplicate_key_is_refused_by_the_cli(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID + "deployment: a\ndeployment: b\n")
    _one_line_exit_2(_validate(path), "key 'deployment' is written twice", "line 3 and line 4")
