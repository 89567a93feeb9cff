"""The ``kelp`` command line.

Each sub-command lives in its own module under :mod:`kelp.cli.commands`
and exposes ``register(subparsers)``; this module only wires them up, sets up
logging, and turns :class:`~kelp.errors.UserError` into a one-line message
with exit status 2 (no traceback for mistakes a person can fix), and any other
:class:`~kelp.errors.KelpError` (e.g. a broker unreachable after retries) into
a one-line message with exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from kelp import __version__, progress
from kelp.errors import KelpError, UserError
from kelp.logs import configure_logging
from kelp.redaction import redact_text

__all__ = ["COMMAND_MODULES", "build_parser", "main", "version_report"]

# Order is the order in `kelp --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "kelp.cli.commands.config_cmd",
    "kelp.cli.commands.demo_cmd",
    "kelp.cli.commands.train_cmd",
    "kelp.cli.commands.serve_cmd",
    "kelp.cli.commands.join_cmd",
    "kelp.cli.commands.probe_cmd",
    "kelp.cli.commands.model_cmd",
    "kelp.cli.commands.produce_cmd",
    "kelp.cli.commands.store_cmd",
    "kelp.cli.commands.bench_cmd",
    "kelp.cli.commands.report_cmd",
    "kelp.cli.commands.dashboard_cmd",
)

EXIT_USER_ERROR = 2
EXIT_RUNTIME_ERROR = 1
log = logging.getLogger("kelp")


def version_report() -> str:
    """Kelp's version, the versions of the libraries a bug report needs, and the device training would use.

    Library versions come from package metadata (no import), except torch's:
    torch is imported anyway to ask for CUDA, and its ``__version__`` carries
    the build (``+cpu``, ``+cu130``) that the wheel's metadata leaves out and a
    bug report needs.
    """
    lines = [f"kelp {__version__}"]
    for label, dist in (("torch", "torch"), ("redis-py", "redis"), ("kafka-python", "kafka-python")):
        try:
            lines.append(f"{label} {_torch_version() if dist == 'torch' else metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{label} not installed")
    try:
        import torch

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            device = f"cuda ({torch.cuda.get_device_name(0)}, {count} device{'s' if count > 1 else ''})"
        else:
            device = "cpu (no CUDA device)"
    except ImportError:
        device = "unknown (torch not importable)"
    lines.append(f"device {device}")
    return "\n".join(lines)


def _torch_version() -> str:
    """torch's own version string with its build tag; the wheel's metadata where torch will not import."""
    try:
        import torch
    except ImportError:
        return metadata.version("torch")
    return str(torch.__version__)


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_report` and exit 0 (argparse's own action takes a fixed string)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_report())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kelp",
        description="Kelp: streaming online learning for recommendation models.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="show Kelp, torch, redis-py and kafka-python versions and the device",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        choices=["debug", "info", "warning", "error"],
        help="default: the config's logging.level where the command reads a config, else info",
    )
    parser.add_argument(
        "--log-format",
        default=None,
        choices=["text", "json"],
        help="json: one object per line; default: the config's logging.format where the command "
        "reads a config, else text",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # a command not built yet in this checkout
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level or "info", args.log_format or "text")
    progress.configure(args.log_format or "text")
    try:
        return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"kelp: error: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KelpError as exc:
        # Operational failures (broker or store unreachable after retries) are explained, not traced;
        # --log-level debug logs the traceback for whoever needs it.
        log.debug("command failed", exc_info=True)
        print(f"kelp: error: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_RUNTIME_ERROR
    except KeyboardInterrupt:
        print("kelp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
