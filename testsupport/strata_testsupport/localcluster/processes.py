"""Child processes that die with their parent and are always stopped, so tests leave no orphans."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from strata_testsupport.processes import stop_process

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel kills it if the process that started it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ManagedProcess:
    """One control plane component: started with its log in a file, stopped TERM-then-KILL."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None):
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float = 10.0) -> None:
        stop_process(self.process, grace, group=True)
        self._log.close()


class StartupError(RuntimeError):
    """A component did not start; the message carries the tail of its log."""


def wait_ready(process: ManagedProcess, ready: Callable[[], Any], timeout: float) -> None:
    """Poll `ready` until it is truthy; fail with the process's log if it exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise StartupError(f"{process.name} exited during start-up:\n{process.log_tail()}")
        if ready():
            return
        time.sleep(0.2)
    raise StartupError(f"{process.name} not ready after {timeout:.0f}s:\n{process.log_tail()}")


class Started:
    """`with` starts and always stops: a failed start stops what did start, and `stop()` is idempotent."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
