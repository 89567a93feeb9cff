"""The trainer's HTTP side: ``/healthz`` (liveness), ``/readyz`` (readiness) and ``/metrics``.

A small threaded ``http.server``: the trainer has no request traffic, only
probes and scrapes, so no web framework is needed. Probes answer from plain
callables so the endpoints always report the daemon's real state:

* ``/healthz`` is 200 while the main loop keeps ticking (it ticks at least
  every few hundred ms, also when idle); 503 when it is stuck, which makes
  Kubernetes restart the pod;
* ``/readyz`` is 200 once the store, the source and the model are up and the
  trainer is not draining or riding out a store outage; 503 with the reason
  otherwise;
* ``/metrics`` is the Prometheus text format of the daemon's one registry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kelp.daemon.listen import listen_error
from kelp.metrics import LabelledRegistry

__all__ = ["HealthServer", "Probe"]

log = logging.getLogger("kelp.health")

Probe = Callable[[], tuple[bool, str]]
"""Returns ``(ok, reason)``; the reason is the response body."""


class HealthServer:
    """Serves the three endpoints on ``host:port`` from a daemon thread (port 0 picks a free one)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry | LabelledRegistry,
        liveness: Probe,
        readiness: Probe,
    ) -> None:
        handler = _handler(registry, liveness, readiness)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:  # a port in use, a foreign host: the operator's to fix (exit 2)
            raise listen_error(exc, host, port, "metrics") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kelp-health", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        """``host:port`` as bound (``127.0.0.1:9400`` is reachable from this machine only)."""
        host = str(self._server.server_address[0])
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("health and metrics on %s (/healthz /readyz /metrics)", self.address)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    registry: CollectorRegistry | LabelledRegistry, liveness: Probe, readiness: Probe
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, reason = (liveness if path == "/healthz" else readiness)()
                self._send(200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found: try /healthz, /readyz or /metrics\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("health: " + format, *args)

    return Handler
