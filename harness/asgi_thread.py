"""An ASGI app served by uvicorn in a thread on a free loopback port: real HTTP over real sockets.

For tests that need a serving replica's HTTP surface without a child process
(they read its registry or swap its model in-process)::

    with AsgiThreadServer(create_app(replica)) as live:
        httpx.get(f"{live.url}/readyz")
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from kelp.harness.ports import free_port

__all__ = ["AsgiThreadServer"]


class AsgiThreadServer:
    """Starts on ``__enter__`` (waits until uvicorn listens), stops on ``__exit__``."""

    def __init__(self, app: Any, start_timeout_s: float = 20.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None, access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self._start_timeout_s = start_timeout_s

    def __enter__(self) -> AsgiThreadServer:
        self.thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
