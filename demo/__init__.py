"""``kelp demo``: the whole loop end to end on the shipped Criteo sample, for a person to watch.

A room of its own, above the processes: it starts real services through
``kelp.harness``, runs the ``kelp train`` daemon and a ``kelp serve`` process,
and prints what happened. Modules: :mod:`~kelp.demo.run` (profile, produce,
train) and :mod:`~kelp.demo.serving` (score requests, a row update without a
publish).
"""

from kelp.demo.run import DemoReport, default_config_path, run_demo

__all__ = ["DemoReport", "default_config_path", "run_demo"]
