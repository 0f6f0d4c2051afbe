"""Stopping the server processes tests start: SIGTERM, a grace period, then SIGKILL."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen[bytes] | subprocess.Popen[str], grace: float = 10.0) -> int:
    """Terminate `process`, kill it if it outlives `grace` seconds, and return its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()
