"""``kelp report RUN`` draws a run's learning curves (AUC and log loss over samples) into a PNG.

``RUN`` is the run's progress record (``progress.jsonl``, written by ``kelp
train`` into its checkpoint directory), that directory, or the run directory
above it (``runs/<deployment>``); ``--config FILE`` finds it from the config.
A run with several labels (``features.labels``) draws one curve per task,
labelled by the task's name; a one-task run draws one curve.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kelp.errors import UserError

if TYPE_CHECKING:
    from kelp.plots import Curve

__all__ = ["register", "run_curves"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="draw a run's progressive AUC and log loss over samples into a PNG",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", nargs="?", type=Path, help="progress.jsonl, or a directory holding it")
    parser.add_argument("--config", type=Path, help="find the record in this config's checkpoint_dir")
    parser.add_argument("--out", type=Path, help="the PNG to write (default: report.png beside the record)")
    parser.add_argument("--all-runs", action="store_true", help="every run in the record, not only the last")
    parser.set_defaults(handler=_report)


def find_record(run: Path | None, config: Path | None) -> Path:
    """The progress file a ``kelp report`` argument names; a one-line error when there is none."""
    from kelp.daemon.progress_log import PROGRESS_FILE

    if (run is None) == (config is None):
        raise UserError("kelp report: name the run (RUN or --config FILE), one of the two")
    if config is not None:
        from kelp.config import load_config

        run = load_config(config).trainer.checkpoint_dir
    assert run is not None
    for candidate in (run, run / PROGRESS_FILE, run / "checkpoints" / PROGRESS_FILE):
        if candidate.is_file():
            return candidate
    raise UserError(f"{run}: no {PROGRESS_FILE} there (kelp train writes it into trainer.checkpoint_dir)")


def run_curves(name: str, points: Sequence[Mapping[str, Any]]) -> list[Curve]:
    """One run's curves: one for a one-task record, else one per task (in the record's order).

    A task missing from a point (or a null metric) is NaN there, so every curve
    has one value per point and the panels share their x axis.
    """
    from kelp.daemon.progress_log import METRICS, point_tasks
    from kelp.plots import Curve

    per_point = [point_tasks(p) for p in points]
    tasks = list(dict.fromkeys(t for tasks in per_point for t in tasks))
    if not tasks:
        curve = Curve(f"run {name}")
        for p in points:
            curve.add(int(p["samples"]), *(_metric(p.get(k)) for k in METRICS))
        return [curve]
    curves = []
    for task in tasks:
        curve = Curve(f"run {name}: {task}")
        for p, got in zip(points, per_point, strict=True):
            metrics = got.get(task, {})
            curve.add(int(p["samples"]), *(metrics.get(k, float("nan")) for k in METRICS))
        curves.append(curve)
    return curves


def _metric(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _report(args: argparse.Namespace) -> int:
    from kelp.daemon.progress_log import read_progress
    from kelp.plots import plot_learning

    record = find_record(args.run, args.config)
    runs = read_progress(record)
    if not runs:
        raise UserError(f"{record}: no progress points yet")
    chosen = list(runs.items()) if args.all_runs else [list(runs.items())[-1]]
    curves = [curve for name, points in chosen for curve in run_curves(name, points)]
    out = args.out or record.with_name("report.png")
    last = chosen[-1][1][-1]
    title = f"{record.parent}: {last['samples']:,} samples, step {last['step']}" + (
        f" ({len(runs)} runs in the record; --all-runs draws every one)"
        if len(runs) > 1 and not args.all_runs
        else ""
    )
    path = plot_learning(curves, out, title)
    points = sum(len(points) for _name, points in chosen)
    print(f"wrote {path} ({points} points, {len(curves)} curve{'s' if len(curves) != 1 else ''})")
    for name, run_points in chosen:
        if len(run_points) < 2:
            print(f"note: {one_point_note(name)}", file=sys.stderr)
    return 0


def one_point_note(run: str) -> str:
    """Why a run's curve is empty: a line needs two points, and what gives a run more."""
    return (
        f"run {run} has a single point, which draws no line: it trained one batch, or a trainer older "
        "than trainer.progress_every_samples recorded it (a point only every trainer.progress_every_s); "
        "a run trained now records a point at least at every 5% more samples"
    )
