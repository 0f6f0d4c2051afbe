"""Stopping the processes tests start: SIGTERM, a grace period, then SIGKILL (the one way, for every process)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


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
