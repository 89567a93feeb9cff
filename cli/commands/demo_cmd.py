"""``kelp demo``: run the main job end to end on the shipped sample."""

from __future__ import annotations

import argparse
from pathlib import Path

from kelp.cli.signals import exit_cleanly_on_sigterm
from kelp.demo import run_demo

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="run Kelp end to end on the Criteo sample (starts its own services)")
    parser.add_argument("--config", type=Path, default=None, help="default: examples/criteo-kaggle.yaml")
    parser.add_argument("--limit", type=int, default=None, help="stream at most this many samples")
    parser.add_argument(
        "--loop",
        action="store_true",
        help="instead: close the online-learning loop (serve -> request log -> join -> train -> publish) "
        "on real services with simulated users",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="--loop: how long the loop runs")
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    exit_cleanly_on_sigterm()  # a stopped demo still stops the services it started
    if args.loop:
        from kelp.demo.loop import run_loop

        report = run_loop(seconds=args.seconds)
        return 0 if all(code == 0 for code in report.exits.values()) else 1
    run_demo(args.config, limit=args.limit)
    return 0
