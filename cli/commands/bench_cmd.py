"""``kelp bench <suite> [--quick] [--json]``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kelp.bench import SUITES, run_suite
from kelp.cli.signals import exit_cleanly_on_sigterm

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    lines = "\n".join(f"  {name:<10} {doc}" for name, doc in SUITES.items())
    parser = sub.add_parser(
        "bench",
        help="run a benchmark suite (prints one JSON object as the last stdout line)",
        description=f"suites:\n{lines}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--quick", action="store_true", help="finish in under 60 s on 2 cores")
    parser.add_argument(
        "--json",
        action="store_true",
        help="JSON result (always so; the flag is the documented contract)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder holding the datasets (accuracy: criteo-attribution/, movielens-100k/); "
        "default $KELP_DATA_DIR or ../shared/data beside the checkout",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where figures go (accuracy; default ./bench-results)"
    )
    parser.add_argument(
        "--soak-minutes",
        type=float,
        default=None,
        metavar="M",
        help="chaos: M minutes at a steady rate, no faults; RSS, fds, threads, p99 at start and end",
    )
    parser.add_argument(
        "--broker",
        choices=("kafka", "tansu"),
        default=None,
        help="ingest, train, pipeline, scale, freshness, join, chaos: the Kafka broker the suite starts "
        "(default: Apache Kafka where java runs, else Tansu; $KELP_BROKER)",
    )
    parser.add_argument(
        "--hosts",
        nargs="?",
        const="",
        default=None,
        metavar="MS,MS",
        help="scale: the ranks on separate network-namespace hosts (root), one run per one-way delay "
        "in ms between them, e.g. 0,1,10; chaos (no value): the host mode, a Redis Cluster with "
        "replicas, a 3-broker Kafka and the trainer and replica on their own hosts (root)",
    )
    parser.set_defaults(handler=_bench)


def _bench(args: argparse.Namespace) -> int:
    exit_cleanly_on_sigterm()  # a stopped benchmark still stops the services it started
    result = run_suite(
        args.suite,
        quick=args.quick,
        data_dir=args.data,
        out_dir=args.out,
        soak_minutes=args.soak_minutes,
        broker=args.broker,
        hosts=args.hosts,
    )
    # Always one JSON line, last on stdout (the benchmark contract); --json is accepted for it.
    print(json.dumps(result, sort_keys=True))
    return 0
