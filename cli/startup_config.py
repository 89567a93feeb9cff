"""One log record at the start of ``kelp train``, ``kelp serve`` and ``kelp join``: the effective config.

What a process runs with is its file, the ``KELP_...`` environment overrides and Kelp's defaults for
everything left unset (and, under the Helm chart, the paths the chart owns). Logging it once, as
validated and with secrets redacted (:func:`kelp.config.effective_config`, the same data as
``kelp config show``), lets an operator compare what a pod runs with what was validated locally,
without a shell in the pod. With ``--log-format json`` it is one structured record whose ``config``
field is the config as a JSON object; the text format prints it as compact JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any, Literal

from kelp import progress
from kelp.config import KelpConfig, effective_config
from kelp.logs import configure_logging

__all__ = ["MESSAGE", "apply_config_logging", "effective_config_record", "log_effective_config"]

log = logging.getLogger("kelp.config")

MESSAGE = "effective config (secrets redacted)"

Role = Literal["train", "serve", "join"]


class _JsonObject(dict[str, Any]):
    """A dict that the JSON formatter nests as an object and the text formatter prints as JSON.

    The text formatter writes extra fields with ``str()``, which for a dict would be Python's repr.
    """

    def __str__(self) -> str:
        return json.dumps(self, separators=(",", ":"), default=str)


def effective_config_record(cfg: KelpConfig, origin: str, role: Role) -> dict[str, Any]:
    """The record's structured fields: which process, which file, and every field's effective value."""
    return {
        "event": "effective_config",
        "role": role,
        "config_file": origin,
        "config": _JsonObject(effective_config(cfg)),
    }


def log_effective_config(cfg: KelpConfig, origin: str, role: Role) -> None:
    """Log the config ``cfg`` (loaded from ``origin``) as the ``role`` process will run it."""
    log.info(MESSAGE, extra=effective_config_record(cfg, origin, role))


def apply_config_logging(args: argparse.Namespace, cfg: KelpConfig) -> None:
    """Log as the config's ``logging`` section says, where ``--log-level`` / ``--log-format`` were not
    given (a flag wins): the config a user validates, chart included, decides how its process logs.

    The CLI configured logging from the flags (or text at info) before any config was read; this
    re-configures it once the config is known, and leaves the effective values on ``args``.
    """
    args.log_level = args.log_level or cfg.logging.level
    args.log_format = args.log_format or cfg.logging.format
    configure_logging(args.log_level, args.log_format)
    progress.configure(args.log_format)
