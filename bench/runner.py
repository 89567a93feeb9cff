"""Suite registry and the machine description attached to every result."""

from __future__ import annotations

import importlib
import inspect
import os
import platform
import sys
import time
from typing import Any

from kelp import progress as bars
from kelp.errors import UserError

__all__ = ["SUITES", "machine_info", "progress", "run_suite"]

# suite name -> one-line description; the module is kelp.bench.<name>.
SUITES: dict[str, str] = {
    "store": "batched pull/push through the Redis store vs raw MGET/MSET and a naive loop",
    "ingest": "Kafka -> decoded, validated, deduplicated micro-batches vs plain kafka-python poll",
    "train": "the whole trainer on criteo-synth vs an in-memory single-process baseline",
    "pipeline": "the train stream with the model taken out: what one trainer process can feed a device",
    "freshness": "seconds from produce to servable rows and to a live dense snapshot",
    "serve": "closed-loop serving latency under hot swaps vs raw MGET + bare forward",
    "scale": "the same records through 1 and 2 trainer ranks (torch.distributed): equality, lost rows, AUC",
    "accuracy": "progressive AUC vs a plain PyTorch reference on real streams; admission/eviction sweep",
    "join": "labelled samples/s through kelp join vs a raw consume; Redis bytes per impression; label delay",
    "snapshot": "full and incremental row snapshots and restore vs BGSAVE / redis-cli --rdb; training lost",
    "chaos": "kill -9, Redis restart/stall, broker restart, store loss, hostile join times; the invariants",
}
"""Only suites that exist: a test keeps this equal to the ``kelp.bench.<suite>`` modules."""


_SUITE_BAR: list[tuple[str, bars.Bar]] = []
"""The running suite's name and bar (at most one): :func:`progress` names the phase on it."""


def progress(message: str) -> None:
    """Benchmarks talk to humans on stderr; stdout's last line is the JSON result.

    Inside :func:`run_suite` the line goes above the suite's bar, and the bar
    shows the message as the current phase.
    """
    line = f"[bench {time.strftime('%H:%M:%S')}] {message}"
    if not _SUITE_BAR:
        print(line, file=sys.stderr, flush=True)
        return
    name, suite_bar = _SUITE_BAR[-1]
    suite_bar.write(line)
    suite_bar.update(1)
    suite_bar.describe(f"bench {name}: {message.strip()[:60]}")


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
    # Suites report phases, not fractions: the bar counts phases and keeps the elapsed time moving.
    suite_bar = bars.bar(
        total=None, desc=f"bench {name}", bar_format="{desc} | {elapsed} | phase {n_fmt}", tick_s=1.0
    )
    _SUITE_BAR.append((name, suite_bar))
    try:
        result = dict(module.run(quick=quick, **given))
    finally:
        _SUITE_BAR.remove((name, suite_bar))
        suite_bar.close()
    result.setdefault("suite", name)
    result["quick"] = quick
    result["wall_s"] = round(time.perf_counter() - started, 3)
    result["machine"] = machine_info()
    return result
