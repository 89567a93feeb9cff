"""The suite registry lists exactly the suites that exist."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import kelp.bench
from kelp.bench import SUITES, run_suite
from kelp.errors import UserError

# helpers of the suites, not suites
NOT_SUITES = {"runner", "synth", "baseline", "scale_rank", "allreduce_probe", "reference", "streams", "plain"}
NOT_SUITES |= {"accuracy_kelp", "accuracy_tasks", "accuracy_admission", "accuracy_first_order", "two_heads"}
NOT_SUITES |= {"cost", "longtail"}
NOT_SUITES |= {
    f"chaos_{part}"
    for part in (
        "checks",
        "durability",
        "faults",
        "load",
        "poison",
        "procs",
        "rig",
        "soak",
        "hosts",
        "host_faults",
        "host_rig",
    )
}


def test_every_listed_suite_has_a_module_with_run() -> None:
    for name in SUITES:
        module = importlib.import_module(f"kelp.bench.{name}")
        assert callable(module.run), name


def test_every_suite_module_is_listed() -> None:
    modules = {m.name for m in pkgutil.iter_modules(kelp.bench.__path__)} - NOT_SUITES
    assert modules == set(SUITES)


def test_an_unknown_suite_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown benchmark suite 'speed'"):
        run_suite("speed", quick=True)


def test_an_option_a_suite_does_not_take_is_a_user_error() -> None:
    with pytest.raises(UserError, match="kelp bench store takes no --data"):
        run_suite("store", quick=True, data_dir="/somewhere")
