"""``kelp train --config FILE [--nproc K]``: run the trainer daemon until stopped.

SIGTERM or SIGINT drains (see :mod:`kelp.daemon.train`) and exits 0; a second
signal exits at once with status 130 (what was not committed is read again on
restart). A fatal error exits 1 with one line; a bad config exits 2. A rank of
a group that drained only because another rank was stopping exits 75, so its
torchrun agent restarts it (a stopped pod's peers rejoin rather than finish).

``--start-from WHERE`` overrides ``source.start_from`` for this run (a replay
from a point in time, see :class:`~kelp.config.KafkaSourceConfig`).

``--nproc K`` (K > 1) starts a trainer group of K ranks on this machine with
torchrun's own launcher (``torch.distributed.run --standalone``): the same as
``torchrun --standalone --nproc-per-node K --max-restarts R -m kelp.cli train
--config FILE``. A rank that dies makes torchrun restart the whole group, up
to ``--max-restarts`` times.

Across machines, ``--nnodes MIN:MAX --rdzv-endpoint HOST:PORT`` runs one
torchrun agent on each machine, all meeting at one c10d rendezvous (hosted by
the agent on HOST): ``torchrun --nnodes MIN:MAX --nproc-per-node K
--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID ...``, as the Helm
chart does. With MIN below MAX the group is elastic: when a machine is lost
(dead or cut off), the others restart without it once its rendezvous
heartbeat lapses, and a machine that comes back joins at the next restart.
The machine that hosts the rendezvous is never optional.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from pydantic import ValidationError

from kelp.config import KafkaSourceConfig, KelpConfig, load_config
from kelp.errors import UserError

__all__ = ["register"]

log = logging.getLogger("kelp.train")

PEER_STOPPED_EXIT = 75
"""Exit status (EX_TEMPFAIL) of a rank that drained because a peer stopped: torchrun restarts it."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="run the continual-learning trainer daemon")
    parser.add_argument(
        "--config", required=True, help="Kelp config file (YAML); KELP_A__B env vars override"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="stop (and drain) after this many steps")
    parser.add_argument(
        "--nproc", type=int, default=1, help="ranks of a trainer group on this machine (torchrun's launcher)"
    )
    parser.add_argument(
        "--start-from",
        default=None,
        metavar="WHERE",
        help="override source.start_from: committed, earliest, latest, an ISO-8601 time with a zone, or "
        "epoch milliseconds (a replay: applied again at every start while the flag is given)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="with --nproc or --nnodes: group restarts after a rank dies (default 3)",
    )
    group = parser.add_argument_group("a trainer group across machines (torchrun's c10d rendezvous)")
    group.add_argument(
        "--nnodes",
        default=None,
        metavar="MIN:MAX",
        help="machines in the group, each running this command: N, or MIN:MAX to go on without a lost "
        "machine while at least MIN remain (needs --rdzv-endpoint)",
    )
    group.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="the rendezvous, hosted by the agent on HOST (that machine is never optional)",
    )
    group.add_argument(
        "--rdzv-id", default=None, metavar="ID", help="the group's rendezvous id (default: source.group_id)"
    )
    group.add_argument(
        "--local-addr",
        default=None,
        metavar="ADDR",
        help="this machine's address as the other machines reach it (default: its host name)",
    )
    group.add_argument(
        "--rdzv-conf",
        default=None,
        metavar="K=V,...",
        help="torchrun's rendezvous settings, e.g. join_timeout=600,last_call_timeout=30 (how long the "
        "group waits for more machines once MIN are there), is_host=1",
    )
    parser.set_defaults(handler=_train)


def _override_start(cfg: KelpConfig, value: str | None) -> None:
    """Apply ``--start-from`` to ``source.start_from``, checked like the config field."""
    if value is None:
        return
    if not isinstance(cfg.source, KafkaSourceConfig):
        raise UserError(f"--start-from needs source.kind: kafka, not {cfg.source.kind}")
    try:
        cfg.source.start_from = value
    except ValidationError as exc:
        reason = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise UserError(f"--start-from: got {value!r}: {reason}") from None


def parse_nnodes(value: str) -> tuple[int, int]:
    """``--nnodes``: ``"N"`` -> (N, N), ``"MIN:MAX"`` -> (MIN, MAX), with 1 <= MIN <= MAX."""
    parts = value.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        low, high = 0, -1
    if len(parts) > 2 or not 1 <= low <= high:
        raise UserError(f"--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got {value!r}")
    return low, high


def _rendezvous_args(args: argparse.Namespace, cfg: KelpConfig) -> list[str]:
    """torchrun's launch options: standalone on this machine, or a c10d rendezvous across machines."""
    if args.nnodes is None:
        return ["--standalone"]
    low, high = parse_nnodes(args.nnodes)
    endpoint = args.rdzv_endpoint
    if not endpoint or ":" not in endpoint or not endpoint.rsplit(":", 1)[1].isdigit():
        raise UserError(f"--nnodes needs --rdzv-endpoint HOST:PORT (the rendezvous), got {endpoint!r}")
    assert isinstance(cfg.source, KafkaSourceConfig)
    out = [
        f"--nnodes={low}:{high}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={args.rdzv_id or cfg.source.group_id}",
    ]
    if args.local_addr:
        out.append(f"--local-addr={args.local_addr}")
    if args.rdzv_conf:
        out.append(f"--rdzv-conf={args.rdzv_conf}")
    return out


def _launch_group(args: argparse.Namespace) -> int:
    """Run this same command's ranks under torchrun's elastic agent; its exit status is ours."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser, run

    cfg = load_config(args.config)  # a bad config fails here, once, not in K ranks
    _override_start(cfg, args.start_from)
    if cfg.source.kind != "kafka":
        how = f"--nproc {args.nproc}" if args.nnodes is None else f"--nnodes {args.nnodes}"
        raise UserError(
            f"{args.config}: {how} needs source.kind: kafka (a consumer group splits "
            f"its partitions between ranks); with {cfg.source.kind} every rank would train every record"
        )
    argv = [
        *_rendezvous_args(args, cfg),
        f"--nproc-per-node={args.nproc}",
        f"--max-restarts={args.max_restarts}",
        "--monitor-interval=0.5",
        "-m",
        "kelp.cli",
        *(["--log-level", args.log_level] if args.log_level else []),  # the ranks log as this command
        *(["--log-format", args.log_format] if args.log_format else []),
        "train",
        "--config",
        args.config,
    ]
    if args.max_steps is not None:
        argv += ["--max-steps", str(args.max_steps)]
    if args.start_from is not None:
        argv += ["--start-from", args.start_from]
    if args.nnodes is not None:
        # Each rendezvous round's rank 0 then serves a store of its own, so a round's ranks meet only
        # each other; in the agents' shared store they meet under TORCHELASTIC_RESTART_COUNT, which
        # differs between machines once one restarted for a failure and another for a newcomer.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    try:
        run(get_args_parser().parse_args(argv))
    except SignalException as exc:
        # The agent forwarded the signal; every rank drained (a rank that did not is reported above).
        log.info("trainer group stopped by signal %s", exc.sigval.name)
        return 0
    except ChildFailedError as exc:
        print(
            f"kelp: error: trainer group failed after {args.max_restarts} restarts: {exc.name}",
            file=sys.stderr,
        )
        return 1
    except RendezvousError as exc:
        # This machine could not (re)join the group: the rendezvous host is gone or cut off, or the
        # group did not form within join_timeout.
        where = args.rdzv_endpoint or "this machine"
        print(f"kelp: error: trainer group rendezvous at {where} failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _train(args: argparse.Namespace) -> int:
    from kelp.cli.startup_config import apply_config_logging, log_effective_config
    from kelp.daemon.preflight import preflight
    from kelp.daemon.startup import check_endpoints

    if args.nproc < 1:
        print("kelp: error: --nproc must be >= 1", file=sys.stderr)
        return 2
    if args.max_steps is not None and args.max_steps < 1:
        raise UserError(f"--max-steps must be >= 1, got {args.max_steps}")
    if args.nnodes is None:
        for flag in ("rdzv_endpoint", "rdzv_id", "local_addr", "rdzv_conf"):
            if getattr(args, flag) is not None:
                raise UserError(f"--{flag.replace('_', '-')} needs --nnodes (a group across machines)")
    else:
        parse_nnodes(args.nnodes)  # refused before anything starts
    if args.nproc > 1 or args.nnodes is not None:
        return _launch_group(args)

    cfg = load_config(args.config)
    apply_config_logging(args, cfg)
    if args.max_steps is not None:
        cfg.trainer.max_steps = args.max_steps
    _override_start(cfg, args.start_from)
    preflight(cfg, args.config, role="train")  # config mistakes first, then the endpoints
    log_effective_config(cfg, args.config, "train")
    check_endpoints(cfg, "train")  # a wrong address fails within trainer.startup_timeout_s
    # The daemon imports torch (seconds): after the checks, so a mistake is answered at once.
    from kelp.daemon.train import PEER_STOPPED, TrainDaemon

    daemon = TrainDaemon(cfg, origin=args.config)
    signals_seen: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signals_seen.append(signum)
        if len(signals_seen) > 1:
            print("kelp: second signal, exiting without draining", file=sys.stderr)
            os._exit(130)
        log.info("received %s: draining", signal.Signals(signum).name)
        daemon.request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    report = daemon.run()
    print(
        f"kelp train: stopped by {report.stopped_by}; {report.steps} steps, {report.samples} samples "
        f"in {report.seconds:.1f}s; progressive AUC {report.auc:.4f}; checkpoint {report.checkpoint}"
    )
    if report.summary is not None:
        if args.log_format == "json":
            print(report.summary.as_json())
        else:
            for line in report.summary.lines():
                print(f"  {line}")
    if report.stopped_by == PEER_STOPPED:
        # This rank was not asked to stop: exiting non-zero makes its torchrun agent restart it and
        # rejoin the rendezvous at once, instead of waiting for the stopped peer as a finished job.
        print(
            f"kelp train: rank {report.rank} exits {PEER_STOPPED_EXIT} so torchrun restarts it",
            file=sys.stderr,
        )
        return PEER_STOPPED_EXIT
    return 0
