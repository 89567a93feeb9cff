"""``kelp serve --config FILE``: a serving replica on ``serving.host:serving.port`` under uvicorn.

SIGTERM (and Ctrl-C) ask uvicorn to stop accepting connections and finish the
requests in flight; the replica then stops its watcher and closes the store,
and the command exits 0. ``serving.workers > 1`` runs that many uvicorn worker
processes, each a full replica (own store connections, own snapshot watcher).
Their metrics meet in prometheus-client's multiprocess mode: a fresh directory
(``PROMETHEUS_MULTIPROC_DIR``, unless the environment names one) that every
worker writes to, so ``/metrics`` from any worker counts the requests of all
of them. The directory is removed when the command ends.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from kelp.config import load_config

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="run a serving replica (HTTP scoring API)")
    parser.add_argument("--config", required=True, help="Kelp config file (YAML)")
    parser.set_defaults(handler=_serve)


@contextmanager
def _multiprocess_metrics() -> Iterator[None]:
    """The workers' shared metrics directory: given by the environment, or a fresh one removed at the end.

    The workers inherit the variable; prometheus-client reads it when they import it.
    """
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        yield
        return
    path = tempfile.mkdtemp(prefix="kelp-serve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    try:
        yield
    finally:
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        shutil.rmtree(path, ignore_errors=True)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from kelp.cli.startup_config import apply_config_logging, log_effective_config
    from kelp.daemon.listen import check_listen
    from kelp.daemon.preflight import preflight
    from kelp.daemon.startup import check_endpoints

    cfg = load_config(args.config)
    apply_config_logging(args, cfg)
    preflight(cfg, args.config, role="serve")
    log_effective_config(cfg, args.config, "serve")
    check_listen(cfg.serving.host, cfg.serving.port, "serving")  # a port in use: one line, exit 2
    check_endpoints(cfg, "serve")  # a wrong address fails within serving.startup_timeout_s
    # The replica imports torch (seconds): after the checks, so a mistake is answered at once.
    from kelp.serving.app import CONFIG_ENV, create_app
    from kelp.serving.process import tune_process, uvicorn_options
    from kelp.serving.replica import ServingReplica

    # uvicorn re-raises the signal it caught once it has shut down; a no-op handler turns SIGTERM's
    # default (death by signal, status 143) into a normal return, so the command exits 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    common = {
        "host": cfg.serving.host,
        "port": cfg.serving.port,
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": 30,
        **uvicorn_options(cfg.serving),  # bounds on request heads: kelp.serving.protocol
    }
    if cfg.serving.workers > 1:
        os.environ[CONFIG_ENV] = os.path.abspath(args.config)
        with _multiprocess_metrics():
            uvicorn.run("kelp.serving.app:app_from_env", factory=True, workers=cfg.serving.workers, **common)
        return 0
    replica = ServingReplica(cfg)
    server = uvicorn.Server(uvicorn.Config(create_app(replica), **common))
    tune_process()  # after imports and set-up: see kelp.serving.process
    server.run()
    return 0
