"""Every ``>>>`` example in the code runs: found by walking the rooms, never by a hand-kept list.

A docstring example is documentation that claims to be true; a list of modules to
check goes stale the day someone adds an example elsewhere, and the new example
is then silently never run. So every ``.py`` file under a room (the folders
``pyproject.toml`` maps into the ``kelp`` namespace, plus ``helm/tools``) that
holds ``>>>`` is one case here, and a file whose ``>>>`` the doctest finder does
not see as an example fails instead of passing with nothing checked.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import io
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from .source_files import python_files

ROOT = Path(__file__).resolve().parents[2]
EXTRA_FOLDERS = ("helm/tools",)
"""Folders with Python outside the ``kelp`` packages; their files are loaded by path."""


def _package_dirs() -> dict[Path, str]:
    """Folder -> package name, from ``[tool.setuptools] package-dir`` (the one source of the mapping)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {ROOT / folder: package for package, folder in setup["package-dir"].items()}


def _module_name(path: Path, packages: dict[Path, str]) -> str | None:
    """The dotted name ``path`` imports as, by the deepest package folder holding it; None outside them."""
    holders = [folder for folder in packages if path.parent.is_relative_to(folder)]
    if not holders:
        return None
    folder = max(holders, key=lambda f: len(f.parts))
    below = path.parent.relative_to(folder).parts  # sub-packages of the room, e.g. store/redis/_wire
    if any(not (folder.joinpath(*below[: i + 1]) / "__init__.py").is_file() for i in range(len(below))):
        return None
    package = ".".join((packages[folder], *below))
    return package if path.stem == "__init__" else f"{package}.{path.stem}"


def _cases() -> list[tuple[str, Path]]:
    """``(id, file)`` of every file under the rooms whose text holds ``>>>``."""
    packages = _package_dirs()
    folders = [*packages, *(ROOT / extra for extra in EXTRA_FOLDERS)]
    files = {path for folder in folders if folder.is_dir() for path in python_files(folder)}
    cases = []
    for path in sorted(files):
        if ">>>" in path.read_text(encoding="utf-8"):
            cases.append((_module_name(path, packages) or str(path.relative_to(ROOT)), path))
    return cases


def _load(case: str, path: Path) -> ModuleType:
    """Import a package module by name; load any other file by its path under a private name."""
    if not case.endswith(".py"):
        return importlib.import_module(case)
    spec = importlib.util.spec_from_file_location(f"_doctest_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = _cases()


def test_the_walk_finds_the_modules_with_examples() -> None:
    """A broken walk (a moved pyproject table, a git failure) must not pass with nothing checked."""
    names = {case for case, _ in CASES}
    assert len(CASES) >= 30, names
    assert {
        "kelp.store.redis._wire.packing",
        "kelp.consumers.offsets",
        "kelp.redaction",
        "kelp.bench.synth",
    } <= names


@pytest.mark.parametrize(("case", "path"), CASES, ids=[case for case, _ in CASES])
def test_every_example_runs(case: str, path: Path) -> None:
    module = _load(case, path)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests, f"{path.relative_to(ROOT)} holds '>>>' but no doctest example is found in it"
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test, out=out.write)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0, out.getvalue()
