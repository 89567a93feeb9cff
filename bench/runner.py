"""Suite registry and the machine description attached to every result."""

from __future__ import annotations

import importlib
import inspect
import os
import platform
import sys
import time
from typing import Any

from kelp.errors import UserError

__all__ = ["SUITES", "machine_info", "progress", "run_suite"]

# suite name -> one-line description; the module is kelp.bench.<name>.
SUITES: dict[str, str] = {
    "store": "batched pull/push through the Redis store vs raw MGET/MSET and a naive loop",
    "ingest": "Kafka -> decoded, validated, deduplicated micro-batches vs plain kafka-python poll",
    "train": "the whole trainer on criteo-synth vs an in-memory single-process baseline",
    "freshness": "seconds from produce to servable rows and to a live dense snapshot",
    "serve": "closed-loop serving latency under hot swaps vs raw MGET + bare forward",
    "scale": "the same records through 1 and 2 trainer ranks (torch.distributed): equality, lost rows, AUC",
    "accuracy": "progressive AUC vs a plain PyTorch reference on real streams; admission/eviction sweep",
}
"""Only suites that exist: a test keeps this equal to the ``kelp.bench.<suite>`` modules."""


def progress(message: str) -> None:
    """Benchmarks talk to humans on stderr; stdout's last line is the JSON result."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": _cpu_model(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover - torch is a hard dependency
        info["torch"] = None
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_suite(name: str, quick: bool, **options: Any) -> dict[str, Any]:
    """Run suite ``name``; ``options`` (``data_dir``, ``out_dir``) go to suites that take them."""
    if name not in SUITES:
        raise UserError(f"unknown benchmark suite {name!r}; expected one of: {', '.join(SUITES)}")
    module = importlib.import_module(f"kelp.bench.{name}")
    accepted = inspect.signature(module.run).parameters
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        flags = ", ".join("--" + k.removesuffix("_dir").replace("_", "-") for k in unknown)
        raise UserError(f"kelp bench {name} takes no {flags}")
    started = time.perf_counter()
    result = dict(module.run(quick=quick, **given))
    result.setdefault("suite", name)
    result["quick"] = quick
    result["wall_s"] = round(time.perf_counter() - started, 3)
    result["machine"] = machine_info()
    return result
