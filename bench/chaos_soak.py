"""``kelp bench chaos --soak-minutes M``: the same rig at a steady rate, no faults; do resources stay flat?

After a warm-up, the trainer's and the replica's RSS, open file descriptors
and threads are read from ``/proc`` at the start and at the end, and the
replica's p99 latency (at the client, 200 answers only) over the first and
the last window of the run (a fifth of it, at most a minute). The required
keys (``rss_mb_start``...) are the two processes added up; per-process keys
say which one moved.
"""

from __future__ import annotations

import time
from typing import Any

from kelp.bench.chaos_procs import proc_figures
from kelp.bench.chaos_rig import Rig
from kelp.bench.runner import progress

__all__ = ["soak"]

WARMUP_S = 20.0


def _figures(rig: Rig) -> dict[str, dict[str, float]]:
    out = {}
    for name, proc in (("trainer", rig.trainer), ("replica", rig.serve)):
        if proc.pid is not None and proc.alive():
            out[name] = proc_figures(proc.pid)
    return out


def soak(rig: Rig, minutes: float) -> dict[str, Any]:
    """Run ``minutes`` at the rig's steady rate; figures at the start and at the end."""
    progress(f"soak: warm-up {WARMUP_S:.0f}s, then {minutes:g} min at a steady rate")
    time.sleep(WARMUP_S)
    start_pids = (rig.trainer.pid, rig.serve.pid)
    t0 = time.monotonic()
    start = _figures(rig)
    duration = minutes * 60.0
    window = min(60.0, duration / 5)
    next_note = t0 + 60
    while time.monotonic() - t0 < duration:
        if not rig.trainer.alive() or not rig.serve.alive():
            break
        if time.monotonic() >= next_note:
            now = _figures(rig)
            progress(f"soak {int((time.monotonic() - t0) / 60)} min: {now}")
            next_note += 60
        time.sleep(1.0)
    t1 = time.monotonic()
    end = _figures(rig)
    out: dict[str, Any] = {
        "soak_minutes": minutes,
        "soak_seconds": round(t1 - t0, 1),
        "same_processes": start_pids == (rig.trainer.pid, rig.serve.pid)
        and rig.trainer.alive()
        and rig.serve.alive(),
        "p99_ms_start": rig.client.p99_ms(t0, t0 + window),
        "p99_ms_end": rig.client.p99_ms(t1 - window, t1),
        "p99_window_s": round(window, 1),
    }
    for when, figures in (("start", start), ("end", end)):
        for proc, values in figures.items():
            for key, value in values.items():
                out[f"{proc}_{key}_{when}"] = value
        for key in ("rss_mb", "fds", "threads"):
            out[f"{key}_{when}"] = round(sum(v[key] for v in figures.values()), 1)
    return out
