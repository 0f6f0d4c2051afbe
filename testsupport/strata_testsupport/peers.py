"""Real `strata-loader serve-peer` and `strata-loader fetch` processes on loopback, each "node" with its own
directory: what the fan-out tests and `bench/fanout.py` run."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from strata_testsupport.processes import stop_process


def write_token(path: Path) -> Path:
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


@dataclass
class PeerProcess:
    process: subprocess.Popen[str]
    url: str
    dir: Path
    served: dict[str, int] | None = None
    """After a clean stop: what it served (`bytes`, `ranges`), from its last log line."""


@contextlib.contextmanager
def running_peer(
    copy_dir: Path,
    token_file: Path,
    *,
    max_connections: int | None = None,
    flags: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[PeerProcess]:
    """Start `serve-peer` on a free loopback port, wait until it has verified the copy, stop it afterwards.
    `flags`: more `serve-peer` options (its limits)."""
    args = [sys.executable, "-m", "strata_loader.cli", "serve-peer", str(copy_dir), "--token-file", str(token_file)]
    args += ["--host", "127.0.0.1", "--port", "0", *flags]
    if max_connections is not None:
        args += ["--max-connections", str(max_connections)]
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 -- a pipe nobody drains would block the server
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **(env or {})})
    peer = None
    try:
        url = _wait_serving(proc, log)
        peer = PeerProcess(proc, url, copy_dir)
        yield peer
    finally:
        stop_process(proc, grace=5)
        if proc.stdout is not None:
            for line in proc.stdout.read().splitlines():
                event = json.loads(line)
                if event.get("event") == "served" and peer is not None:
                    peer.served = {"bytes": int(event["bytes"]), "ranges": int(event["ranges"])}
            proc.stdout.close()
        log.close()


def _wait_serving(proc: subprocess.Popen[str], log: IO[str]) -> str:
    assert proc.stdout is not None
    url = ""
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "listening":
            url = f"http://127.0.0.1:{event['port']}"
        if event["event"] == "serving":
            return url
    proc.wait()
    log.seek(0)
    raise PeerStartError(f"serve-peer exited ({proc.returncode}) before serving: {log.read().strip()}")


class PeerStartError(RuntimeError):
    """serve-peer ended before it served: the message is its one-line error."""


def fetch_process(
    args: list[str], env: dict[str, str], termination_log: Path, stdout: int | IO[str] | None = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """`strata-loader fetch ARGS` as its own process, writing its result where a pod's termination message goes."""
    return subprocess.Popen(
        [sys.executable, "-m", "strata_loader.cli", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env, "STRATA_TERMINATION_MESSAGE_PATH": str(termination_log), "STRATA_PROGRESS": "json"},
    )


def finish_fetch(proc: subprocess.Popen[str], termination_log: Path, timeout: float = 600) -> dict[str, object]:
    """Wait for a fetch process; its termination message as a dict, or an AssertionError with its stderr."""
    _, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"fetch exited {proc.returncode}: {err.strip()}")
    result: dict[str, object] = json.loads(termination_log.read_text())
    result["stderr"] = err
    return result
