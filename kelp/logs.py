"""Logging set-up: human-readable by default, JSON lines with ``--log-format json``.

Call :func:`configure_logging` once, at process start (the CLI does). Modules
log through ``logging.getLogger(__name__)``; structured fields go in
``extra={...}`` and appear as keys in JSON output and as ``k=v`` in text.
Both formatters hide URL passwords (:func:`kelp.redaction.redact_text`) in the
finished line, whatever module or library logged it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Literal, TextIO

from kelp.redaction import redact_text

__all__ = ["LogFormat", "configure_logging"]

LogFormat = Literal["text", "json"]

# Attributes every LogRecord has; anything else came from `extra=` and is a field.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
# Extras that only repeat the message for a terminal: uvicorn's ``color_message`` (the message with
# ANSI colour codes) would put escape sequences into every JSON record and text line.
_DROPPED_EXTRAS = frozenset({"color_message"})

# kafka-python lines an operator cannot act on, each lowered to a level: (logger, message template
# prefix) -> level. A topic missing from metadata is routine while a topic is being created (Kelp
# reports a source topic that is really gone in its own words, with kelp_consumer_topic_missing);
# idempotence is disabled because Kelp's producer settings ask for acks or retries that conflict
# with it, on purpose; a closing client's last read and metadata request end in errors (with a
# traceback) that only say it closed.
_LOWERED: dict[tuple[str, str], int] = {
    ("kafka.cluster", "Topic %s not found in cluster metadata"): logging.DEBUG,
    ("kafka.producer.kafka", "%s: Idempotence will be disabled"): logging.INFO,
    ("kafka.net.transport", "%s: Error receiving network data closing socket"): logging.DEBUG,
    ("kafka.cluster", "Metadata refresh: failed %s"): logging.DEBUG,
}


def _socket_already_closed(record: logging.LogRecord) -> bool:
    """A read scheduled before the client closed its socket found none: closing's race, not a fault."""
    exc = record.exc_info[1] if record.exc_info else None
    return isinstance(exc, AttributeError) and "'NoneType'" in str(exc)


def _cancelled(record: logging.LogRecord) -> bool:
    """A metadata request cancelled because the client is closing."""
    args = record.args if isinstance(record.args, tuple) else ()
    return bool(args) and type(args[0]).__name__ in ("Cancelled", "CancelledError")


# Lines of :data:`_LOWERED` lowered only when this holds; the same line for any other cause keeps its level.
_LOWERED_WHEN = {
    ("kafka.net.transport", "%s: Error receiving network data closing socket"): _socket_already_closed,
    ("kafka.cluster", "Metadata refresh: failed %s"): _cancelled,
}


def _extra_fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and k not in _DROPPED_EXTRAS}


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_extra_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return redact_text(json.dumps(doc, default=str))


class TextFormatter(logging.Formatter):
    """``2026-11-21T13:00:00Z info  kelp.store: message k=v``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        fields = " ".join(f"{k}={v}" for k, v in _extra_fields(record).items())
        line = f"{ts}Z {record.levelname.lower():<5} {record.name}: {record.getMessage()}"
        if fields:
            line = f"{line} {fields}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return redact_text(line)


class _RankField(logging.Filter):
    """Adds ``rank=<RANK>`` to every record of a process torchrun started with WORLD_SIZE > 1."""

    def __init__(self, rank: str) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class _Lowered(logging.Filter):
    """Lowers the :data:`_LOWERED` lines of one kafka-python logger, then keeps them only at that level.

    A logger's filter runs after its level check, so a lowered line is
    dropped here unless the logger would have let a line of the new level through.
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.levels = [
            (prefix, level, _LOWERED_WHEN.get((logger, prefix)))
            for (logger, prefix), level in _LOWERED.items()
            if logger == name
        ]
        self.logger = logging.getLogger(name)

    def filter(self, record: logging.LogRecord) -> bool:
        template = record.msg if isinstance(record.msg, str) else ""
        for prefix, level, when in self.levels:
            if template.startswith(prefix) and record.levelno > level and (when is None or when(record)):
                record.levelno, record.levelname = level, logging.getLevelName(level)
                return self.logger.isEnabledFor(level)
        return True


def _lower_library_noise() -> None:
    """Installs :class:`_Lowered` once on each logger named in :data:`_LOWERED`."""
    for name in dict.fromkeys(logger for logger, _ in _LOWERED):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Lowered) for f in logger.filters):
            logger.addFilter(_Lowered(name))


def configure_logging(level: str = "info", fmt: LogFormat = "text", stream: TextIO | None = None) -> None:
    """Install one handler on the root logger, replacing any earlier one.

    Under torchrun (``WORLD_SIZE`` > 1) every line carries the rank, so the
    interleaved output of a trainer group can be told apart.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLineFormatter() if fmt == "json" else TextFormatter())
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        handler.addFilter(_RankField(os.environ.get("RANK", "?")))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # kafka-python is chatty at INFO about every metadata refresh.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, root.level))
    # Its event loop warns whenever a callback takes >100 ms, which on 2 cores is routine noise.
    logging.getLogger("kafka.net.selector").setLevel(max(logging.ERROR, root.level))
    _lower_library_noise()
