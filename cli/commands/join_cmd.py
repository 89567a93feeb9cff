"""``kelp join --config FILE``: served requests and later actions in, labelled training events out.

Runs until SIGTERM or Ctrl-C, which finish the step under way (its events
acknowledged, its state applied, its offsets committed) and exit 0 after one
line saying what the run did and committed. Health
and metrics are on ``join.host:join.port`` (``/healthz``, ``/readyz``,
``/metrics``). The semantics are in docs/join.md.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from kelp.config import load_config

if TYPE_CHECKING:
    from kelp.join import JoinProcess

__all__ = ["register", "stopped_line"]

log = logging.getLogger("kelp.join")

_STUCK_S = 60.0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("join", help="label served requests with later actions (clicks, purchases)")
    parser.add_argument("--config", required=True, help="Kelp config file (YAML)")
    parser.set_defaults(handler=_join)


def _join(args: argparse.Namespace) -> int:
    from kelp.cli.startup_config import apply_config_logging, log_effective_config
    from kelp.daemon.health import HealthServer
    from kelp.daemon.listen import check_listen
    from kelp.daemon.preflight import preflight
    from kelp.join import JoinProcess

    cfg = load_config(args.config)
    apply_config_logging(args, cfg)
    preflight(cfg, args.config, role="join")
    log_effective_config(cfg, args.config, "join")
    check_listen(cfg.join.host, cfg.join.port, "join")
    stop = threading.Event()
    received: list[str] = []  # the handler only notes the signal: logging inside it could interleave lines

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
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
    log.info("%s", stopped_line(process, received[0] if received else None))
    return 0


def stopped_line(process: JoinProcess, signal_name: str | None) -> str:
    """What a stopped join did and committed, for the operator who sent the signal.

    Every finished step committed its offsets (unless counted as a failed
    commit); a step the signal cut short committed nothing, so a restart reads
    its records again and emits the same events.
    """
    m = process.metrics
    joiner = getattr(process, "joiner", None)  # there once the run has opened its inputs
    watermark = joiner.watermark.value if joiner is not None else None
    at = "none yet" if watermark is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(watermark))
    failed = _total(m.commit_failures)
    return (
        f"join stopped{f' on {signal_name}' if signal_name else ''}: {_total(m.step_seconds, '_count'):.0f} "
        f"steps finished, each with its events acknowledged, its state applied and its offsets committed"
        f"{f' (commit failures: {failed:.0f}, their records are read again)' if failed else ''}; a step cut "
        f"short is read again at restart. Since start: {_total(m.impressions):.0f} impressions and "
        f"{_total(m.actions):.0f} actions read, {_total(m.samples):.0f} labelled samples emitted; "
        f"watermark {at}"
    )


def _total(metric: Any, suffix: str = "_total") -> float:
    """A counter's (or a histogram's ``_count``) value summed over its labels."""
    return sum(s.value for family in metric.collect() for s in family.samples if s.name.endswith(suffix))
