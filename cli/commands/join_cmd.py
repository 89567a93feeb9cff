"""``kelp join --config FILE``: served requests and later actions in, labelled training events out.

Runs until SIGTERM or Ctrl-C, which finish the step under way (its events
acknowledged, its state applied, its offsets committed) and exit 0. Health
and metrics are on ``join.host:join.port`` (``/healthz``, ``/readyz``,
``/metrics``). The semantics are in docs/join.md.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time

from kelp.config import load_config

__all__ = ["register"]

_STUCK_S = 60.0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("join", help="label served requests with later actions (clicks, purchases)")
    parser.add_argument("--config", required=True, help="Kelp config file (YAML)")
    parser.set_defaults(handler=_join)


def _join(args: argparse.Namespace) -> int:
    from kelp.daemon.health import HealthServer
    from kelp.daemon.listen import check_listen
    from kelp.daemon.preflight import preflight
    from kelp.join import JoinProcess

    cfg = load_config(args.config)
    preflight(cfg, args.config, role="join")
    check_listen(cfg.join.host, cfg.join.port, "join")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    process = JoinProcess(cfg)

    def alive() -> tuple[bool, str]:
        stuck = time.monotonic() - process.last_step_at
        return (stuck < _STUCK_S, "ok" if stuck < _STUCK_S else f"no step for {stuck:.0f}s")

    def ready() -> tuple[bool, str]:
        return (process.ready, "ok" if process.ready else "starting")

    health = HealthServer(cfg.join.host, cfg.join.port, process.metrics.registry, alive, ready).start()
    try:
        process.run(stop)
    finally:
        health.stop()
    return 0
