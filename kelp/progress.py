"""Progress bars for people at a terminal, and the one rule for when to draw them.

``kelp produce``, file replay in ``kelp train`` and every ``kelp bench`` suite
show a bar (tqdm) on stderr. A bar is for a person watching: it is drawn only
when stderr is a terminal and the logs are text. Piped or redirected stderr
(CI, ``2> file``, a container's log) and ``--log-format json`` (lines a
machine parses) get no bar, so those logs never fill with carriage returns.
The CLI calls :func:`configure` once with the log format; library use without
it is text, and still needs a terminal.

While a bar is drawn, Kelp's log lines go above it (``tqdm.write``) instead of
through it; the console handlers are restored when the bar closes.

>>> import io
>>> with bar(total=3, desc="rows", stream=io.StringIO()) as b:  # not a terminal: a silent bar
...     b.update(3)
>>> b.disabled
True
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

__all__ = ["Bar", "bar", "configure", "enabled"]


class _Policy:
    """What the process told us once at start-up (one per process, set by :func:`configure`)."""

    log_format: str = "text"


_POLICY = _Policy()


def configure(log_format: str) -> None:
    """Record the process's log format (the CLI's ``--log-format``): ``json`` turns every bar off."""
    _POLICY.log_format = log_format


def enabled(stream: TextIO | None = None) -> bool:
    """Whether a bar is drawn on ``stream`` (default stderr): a terminal, and text logs."""
    stream = sys.stderr if stream is None else stream
    if _POLICY.log_format == "json" or stream is None:
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Bar:
    """One progress bar; every method is a no-op when the policy said no.

    ``total`` None draws a counter with a rate (an endless stream, a suite of
    unknown length). ``wanted`` False makes it silent whatever the policy
    (a caller's ``quiet``); ``bar_format`` is tqdm's. ``tick_s`` redraws on a
    timer, for work that reports rarely (a benchmark phase of 30 s), so the
    elapsed time keeps moving.
    Close it (or use it as a context manager) to restore the log handlers.
    """

    def __init__(
        self,
        *,
        total: float | None,
        desc: str,
        unit: str = "it",
        stream: TextIO | None = None,
        unit_scale: bool = False,
        leave: bool = True,
        tick_s: float | None = None,
        wanted: bool = True,
        bar_format: str | None = None,
    ) -> None:
        stream = sys.stderr if stream is None else stream
        self.disabled = not (wanted and enabled(stream))
        self._tqdm = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=unit_scale,
            file=stream,
            leave=leave,
            dynamic_ncols=True,
            bar_format=bar_format,
            disable=self.disabled,
        )
        self._stream = stream
        self._restore: list[tuple[logging.Logger, list[logging.Handler]]] = []
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._closed = False
        if self.disabled:
            return
        self._redirect_logging()
        if tick_s:
            self._ticker = threading.Thread(
                target=self._tick, args=(tick_s,), name="kelp-progress", daemon=True
            )
            self._ticker.start()

    def update(self, n: float = 1) -> None:
        """Advance by ``n`` units."""
        if not self.disabled:
            self._tqdm.update(n)

    def describe(self, text: str) -> None:
        """Replace the text before the bar (the current phase)."""
        if not self.disabled:
            self._tqdm.set_description_str(text, refresh=True)

    def write(self, line: str) -> None:
        """Print a line above the bar (to the bar's stream; plainly when there is no bar)."""
        if self.disabled:
            print(line, file=self._stream, flush=True)
        else:
            tqdm.write(line, file=self._stream)

    def close(self) -> None:
        """Draw the last state, stop the ticker and give the log handlers back; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self._tqdm.close()
        for logger, handlers in self._restore:
            logger.handlers = handlers

    def __enter__(self) -> Bar:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _tick(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self._tqdm.refresh()

    def _redirect_logging(self) -> None:
        """Send the root logger's console handlers' lines through ``tqdm.write`` while the bar lives."""
        root = logging.getLogger()
        consoles = [
            h
            for h in root.handlers
            if type(h) is logging.StreamHandler and h.stream is self._stream  # type: ignore[attr-defined]
        ]
        if not consoles:
            return
        self._restore.append((root, list(root.handlers)))
        root.handlers = [
            _AboveBarHandler(h) if h in consoles else h  # keep order, formatter, level and filters
            for h in root.handlers
        ]


class _AboveBarHandler(logging.Handler):
    """Formats like the console handler it stands in for and writes the line above the bar."""

    def __init__(self, original: logging.StreamHandler) -> None:  # type: ignore[type-arg]
        super().__init__(original.level)
        self.setFormatter(original.formatter)
        self.filters = list(original.filters)
        self._stream = original.stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self._stream)
        except Exception:
            self.handleError(record)


bar = Bar
"""``progress.bar(total=..., desc=...)``: a :class:`Bar`, drawn only where :func:`enabled` says so."""
