"""A child process that is always stopped: terminate, wait, then kill."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
from pathlib import Path

__all__ = ["ManagedProcess"]

log = logging.getLogger(__name__)


class ManagedProcess:
    """Runs ``argv`` with output captured to a log file, for post-mortems in failed tests.

    ``env``: the child's whole environment (None: this process's).
    """

    def __init__(
        self,
        argv: list[str],
        name: str,
        workdir: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = argv
        self.env = env
        self.name = name
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"kelp-{name}-"))
        self.log_path = self.workdir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log_fh = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_fh = log_fh
        self._proc = subprocess.Popen(
            self.argv,
            cwd=self.workdir,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,  # our Ctrl-C does not hit it; we stop it ourselves
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send a signal (SIGKILL by default) without waiting: for failure tests."""
        if self.alive() and self._proc is not None:
            os.kill(self._proc.pid, sig)

    def stop(self, timeout_s: float = 5.0) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=timeout_s)
        if hasattr(self, "_log_fh"):
            self._log_fh.close()
