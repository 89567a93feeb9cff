#!/usr/bin/env bash
# Check the architecture contracts in pyproject.toml ([tool.importlinter]) with import-linter.
#
# Kelp maps each top-level folder into the `kelp` namespace (setuptools package-dir), so
# `kelp` on disk is only kelp/; import-linter walks one directory tree per package. This
# script builds that tree from symlinks (never copies, so nothing can go stale) and runs
# lint-imports on it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
"$PY" - "$tree" <<'PYTHON'
import os
import sys
import tomllib
from pathlib import Path

tree = Path(sys.argv[1])
package_dirs = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
(tree / "kelp").mkdir()
for module in Path(package_dirs["kelp"]).glob("*.py"):
    (tree / "kelp" / module.name).symlink_to(module.resolve())
for package, folder in package_dirs.items():
    if package.count(".") == 1:  # a room; its subpackages come with its folder
        (tree / package.replace(".", "/")).symlink_to(Path(folder).resolve())
PYTHON
# Run from the tree: import-linter puts the working directory on sys.path, and the repository
# root's own kelp/ folder would otherwise hide the other rooms.
config="$PWD/pyproject.toml"
bin="$(cd "$(dirname "$PY")" && pwd)"
cd "$tree" && PYTHONPATH="$tree" "$bin/lint-imports" --no-cache --config "$config"
