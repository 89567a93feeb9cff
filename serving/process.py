"""Process-wide settings for a serving process (``kelp serve`` and its workers), not for library users.

* ``torch.set_num_threads(1)``: requests already run concurrently in threads;
  intra-op threads on top would oversubscribe the cores.
* ``gc.freeze()`` after start-up, and a larger generation-0 threshold: a
  scoring request allocates thousands of small objects, and every full
  collection otherwise re-scans everything torch and FastAPI allocated at import,
  which shows up as the tail latency (docs/performance.md).
* :func:`uvicorn_options`: the uvicorn settings of a replica (``kelp serve``
  and its worker processes): the bounded request head of
  :mod:`kelp.serving.protocol`, and the supervisor's patience with a worker's
  health ping (``serving.worker_healthcheck_timeout_s``). uvicorn starts its
  workers with ``spawn``, so each imports torch and loads its model itself
  (nothing imported before the start is inherited); on a busy machine that
  holds the interpreter past uvicorn's own 5 s, and the supervisor would kill
  a worker that is only starting.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from kelp.config import ServingConfig
from kelp.serving.protocol import HeadLimits, http_protocol

__all__ = ["tune_process", "uvicorn_options"]

GC_THRESHOLDS = (50_000, 50, 100)


def tune_process() -> None:
    torch.set_num_threads(1)
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def uvicorn_options(serving: ServingConfig) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` / ``uvicorn.run``: what bounds what a client can make
    the replica buffer or wait for (the request head, :mod:`kelp.serving.protocol`), and how long
    the supervisor of several workers waits for a worker's health ping."""
    limits = HeadLimits(serving.max_header_bytes, serving.max_headers, serving.header_timeout_s)
    return {
        "http": http_protocol(limits),
        "timeout_worker_healthcheck": serving.worker_healthcheck_timeout_s,
    }
