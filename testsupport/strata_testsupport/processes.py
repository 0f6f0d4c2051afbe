"""Stopping the processes tests start: SIGTERM, a grace period, then SIGKILL (the one way, for every process)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TypeVar

import pytest

T = TypeVar("T")


def unavailable(reason: str) -> None:
    """A real peer the tests need cannot run: under CI that fails the test (a tier must never be skipped there
    in silence); elsewhere it skips with the reason."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


def serve_for_session(what: str, start: Callable[[], AbstractContextManager[T]]) -> Iterator[T]:
    """The body of a session fixture around a real server: started once, stopped at the end, `unavailable`
    (with `what` and the reason) when it cannot start."""
    try:
        running = start()
        server = running.__enter__()
    except RuntimeError as error:
        unavailable(f"{what} unavailable: {error}")
        return
    try:
        yield server
    finally:
        running.__exit__(None, None, None)


def stop_process(
    process: subprocess.Popen[bytes] | subprocess.Popen[str], grace: float = 10.0, *, group: bool = False
) -> int:
    """Terminate `process`, kill it if it outlives `grace` seconds, and return its exit status. `group`: signal
    its whole process group (a process started with `start_new_session`, whose children must go with it)."""

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)

    if process.poll() is None:
        send(signal.SIGTERM)
        try:
            return process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
    return process.wait()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now at `host` (the kernel's pick): loopback by default, or an address of the
    loopback device such as the real node's."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
