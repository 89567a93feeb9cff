"""``kelp report RUN`` draws a run's learning curves (AUC and log loss over samples) into a PNG.

``RUN`` is the run's progress record (``progress.jsonl``, written by ``kelp
train`` into its checkpoint directory), that directory, or the run directory
above it (``runs/<deployment>``); ``--config FILE`` finds it from the config.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kelp.errors import UserError

__all__ = ["register"]


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


def _report(args: argparse.Namespace) -> int:
    from kelp.daemon.progress_log import read_progress
    from kelp.plots import Curve, plot_learning

    record = find_record(args.run, args.config)
    runs = read_progress(record)
    if not runs:
        raise UserError(f"{record}: no progress points yet")
    chosen = list(runs.items()) if args.all_runs else [list(runs.items())[-1]]
    curves = []
    for name, points in chosen:
        curve = Curve(f"run {name}")
        for p in points:
            curve.add(
                int(p["samples"]),
                *(
                    float("nan") if p.get(k) is None else float(p[k])
                    for k in ("auc_window", "auc", "log_loss_window", "log_loss")
                ),
            )
        curves.append(curve)
    out = args.out or record.with_name("report.png")
    last = chosen[-1][1][-1]
    title = f"{record.parent}: {last['samples']:,} samples, step {last['step']}" + (
        f" ({len(runs)} runs in the record; --all-runs draws every one)"
        if len(runs) > 1 and not args.all_runs
        else ""
    )
    path = plot_learning(curves, out, title)
    print(f"wrote {path} ({sum(len(c.samples) for c in curves)} points)")
    return 0
