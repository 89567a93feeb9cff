"""``kelp dashboard preview``: the Grafana dashboard as a person would see it, drawn from real metrics.

Grafana need not be installed. The command runs a short real deployment
(redis-server, a Kafka broker: Apache Kafka where Java runs, Tansu elsewhere;
``kelp train`` on the shipped Criteo example, a producer, ``kelp serve``
answering a few requests a second), scrapes the
trainer's and the replica's ``/metrics`` every ``--interval`` seconds for
``--seconds``, evaluates the dashboard's overview stats and key panels with
promtool over those scrapes (no Prometheus server) and draws them into a PNG.
``--from-scrapes`` redraws a saved recording without running anything.

It exits 1 when a key panel has no data at all (a query that matches
nothing is a dashboard bug or a metric gone missing), after writing the PNG.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from kelp import __version__
from kelp.errors import KelpError, UserError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("dashboard", help="preview the Grafana dashboard from real metrics (PNG)")
    actions = parser.add_subparsers(dest="dashboard_action", metavar="ACTION")
    actions.required = True
    preview = actions.add_parser(
        "preview",
        help="run a short training + serving, scrape /metrics, evaluate the panels, draw a PNG",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    preview.add_argument("--out", type=Path, default=Path("dashboard-preview.png"), help="the PNG to write")
    preview.add_argument(
        "--config",
        type=Path,
        default=None,
        help="Kelp config with a file source (default: criteo-kaggle.yaml)",
    )
    preview.add_argument("--seconds", type=float, default=30.0, help="how long to scrape (default 30)")
    preview.add_argument(
        "--interval",
        type=float,
        default=None,
        help="scrape interval in seconds (default 1; with --from-scrapes, the recording's)",
    )
    preview.add_argument("--dashboard", type=Path, default=None, help="dashboard JSON (default: the chart's)")
    preview.add_argument(
        "--save-scrapes", type=Path, default=None, help="also save the scrapes (.jsonl[.gz])"
    )
    preview.add_argument(
        "--from-scrapes",
        type=Path,
        default=None,
        help="draw a saved recording instead of running a deployment",
    )
    preview.set_defaults(handler=_preview)


def _check(args: argparse.Namespace) -> None:
    if args.seconds < 5 or args.seconds > 600:
        raise UserError(f"--seconds {args.seconds:g}: choose 5 to 600")
    if args.interval is not None:
        if not 0.1 <= args.interval <= args.seconds / 3:
            raise UserError(f"--interval {args.interval:g}: choose 0.1 s to a third of --seconds")
        if args.seconds / args.interval > 600:
            raise UserError(
                f"--seconds {args.seconds:g} / --interval {args.interval:g}: at most 600 scrapes a target"
            )
        if round(args.interval * 1000) != args.interval * 1000:
            raise UserError(f"--interval {args.interval:g}: whole milliseconds only")
    if args.out.suffix.lower() != ".png":
        raise UserError(f"--out {args.out}: the preview is a .png")


def _preview(args: argparse.Namespace) -> int:
    from kelp.plots.dashboard_figure import draw_dashboard
    from kelp.plots.dashboard_preview import preview
    from kelp.plots.promql_eval import find_promtool
    from kelp.plots.scrape import load_scrapes, save_scrapes, scrape_interval

    if args.from_scrapes is None and args.interval is None:
        args.interval = 1.0
    _check(args)
    promtool = find_promtool()  # before minutes of training, not after
    if args.from_scrapes is not None:
        scrapes = load_scrapes(args.from_scrapes)
        interval = args.interval or scrape_interval(scrapes)
        origin = f"recording {args.from_scrapes.name}"
    else:
        from kelp.demo.dashboard_run import record_deployment
        from kelp.demo.run import default_config_path
        from kelp.harness import broker_kind

        config = args.config or default_config_path()
        print(f"kelp dashboard preview: a {args.seconds:g}s deployment of {config.name}")
        recording = record_deployment(config, seconds=args.seconds, interval_s=args.interval)
        scrapes, interval = recording.scrapes, recording.interval_s
        origin = (
            f"kelp train + kelp serve on {config.name} ({broker_kind()} broker, redis-server), "
            f"{recording.produced_samples:,} samples produced, {sum(recording.requests.values())} requests"
        )
        if args.save_scrapes is not None:
            print(f"  saved the scrapes to {save_scrapes(scrapes, args.save_scrapes)}")
    result = preview(scrapes, interval, args.dashboard, promtool)
    grid = result.grid
    start = datetime.fromtimestamp(grid.start_s, tz=UTC)
    end = datetime.fromtimestamp(grid.time(grid.steps - 1), tz=UTC)
    subtitle = (
        f"Kelp {__version__} · {origin} · {len(scrapes)} scrapes of "
        f"{len({(s.job, s.instance) for s in scrapes})} targets every {interval:g}s, "
        f"{start:%Y-%m-%d %H:%M:%S}-{end:%H:%M:%S} UTC · queries evaluated by promtool test rules, "
        f"$__rate_interval = {4 * interval:g}s"
    )
    path = draw_dashboard(result, args.out, "Kelp — dashboard preview (real metrics, no Grafana)", subtitle)
    empty = []
    for data in [*result.stats, *result.panels]:
        state = "ok" if data.has_data else "NO DATA"
        note = f" (empty: {', '.join(data.empty_targets)})" if data.empty_targets else ""
        print(f"  {state:7} {data.panel.title}{note}")
        if not data.has_data:
            empty.append(data.panel.title)
    print(f"wrote {path}")
    if empty:
        raise KelpError(f"{len(empty)} panel(s) show no data: {', '.join(empty)}")
    return 0
