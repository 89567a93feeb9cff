"""``kelp train --config FILE``: run the trainer daemon until stopped.

SIGTERM or SIGINT drains (see :mod:`kelp.daemon.train`) and exits 0; a second
signal exits at once with status 130 (what was not committed is read again on
restart). A fatal error exits 1 with one line; a bad config exits 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from kelp.config import load_config

__all__ = ["register"]

log = logging.getLogger("kelp.train")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="run the continual-learning trainer daemon")
    parser.add_argument(
        "--config", required=True, help="Kelp config file (YAML); KELP_A__B env vars override"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="stop (and drain) after this many steps")
    parser.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from kelp.daemon.train import TrainDaemon

    cfg = load_config(args.config)
    if args.max_steps is not None:
        cfg.trainer.max_steps = args.max_steps
    daemon = TrainDaemon(cfg, origin=args.config)
    signals_seen: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signals_seen.append(signum)
        if len(signals_seen) > 1:
            print("kelp: second signal, exiting without draining", file=sys.stderr)
            os._exit(130)
        log.info("received %s: draining", signal.Signals(signum).name)
        daemon.request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    report = daemon.run()
    print(
        f"kelp train: stopped by {report.stopped_by}; {report.steps} steps, {report.samples} samples "
        f"in {report.seconds:.1f}s; progressive AUC {report.auc:.4f}; checkpoint {report.checkpoint}"
    )
    return 0
