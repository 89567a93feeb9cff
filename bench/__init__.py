"""Benchmarks: ``kelp bench <suite> [--quick] [--json]`` (see ../shared/BENCHMARKS.md).

Each suite is a module ``kelp.bench.<suite>`` with ``run(quick: bool) -> dict``.
A suite starts the services it needs itself, measures its own baseline in the
same run, reports progress on stderr, and returns the numbers; the runner adds
the machine description and prints one JSON object as the last stdout line.
"""

from kelp.bench.runner import SUITES, machine_info, run_suite

__all__ = ["SUITES", "machine_info", "run_suite"]
