"""A config mistake is answered before torch is imported.

torch takes seconds to import; an operator who mistyped a field should hear so at
once, and every command (``kelp --help`` too) registers every subcommand at start.
One interpreter runs each command on a broken file and reports whether torch was
loaded by then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_PROBE = r"""
import contextlib, io, json, sys
from kelp.cli.main import main
bad = sys.argv[1]
seen = {}
commands = (
    ["--help"], ["config", "validate", bad], ["train", "--config", bad], ["serve", "--config", bad],
    ["join", "--config", bad], ["model", "list", "--config", bad], ["store", "stats", "--config", bad],
    ["probe", "--config", bad, "--url", "http://127.0.0.1:9"],
)
for argv in commands:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    seen[" ".join(argv[:2])] = {"code": code, "torch": "torch" in sys.modules, "err": err.getvalue()[-300:]}
print(json.dumps(seen))
"""


def test_a_config_mistake_is_answered_without_importing_torch(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployment: x\nstore: {backend: redis, urls: ['redis://h:1']}\nbogus: 1\n")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(bad)], capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["--help"]["code"] == 0
    for command, result in seen.items():
        assert not result["torch"], (command, result)
        if command != "--help":
            assert result["code"] == 2, (command, result)
            assert "bogus: unknown field" in result["err"], (command, result)
