"""The ``kelp`` command line: argument parsing, one module per sub-command, exit codes.

The top room: it may import every other room, and nothing imports it. The
processes it starts (``kelp.daemon``, ``kelp.serving``), the benchmarks
(``kelp.bench``) and the demo (``kelp.demo``) are importable without it.
Run it as the ``kelp`` console script or ``python -m kelp.cli``.
"""

from kelp.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
