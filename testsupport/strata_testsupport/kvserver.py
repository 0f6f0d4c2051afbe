"""Fixtures that run REAL `strata-kv serve` processes (and Debian's redis-server for comparison).

Servers listen on free loopback ports (port 0, read back from the server's ready line), write
their logs to files, and are always stopped at teardown. A missing redis-server binary skips the
tests that need it, except under CI=true, where it fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata_testsupport.processes import free_port, stop_process, unavailable

_READY = re.compile(r"strata-kv ready tcp=\S+:(\d+) unix=(\S+) metrics=(-?\d+)")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class KVServerProcess:
    """One running server; `config` is the dict it was started with (restart reuses it)."""

    workdir: Path
    config: dict[str, Any]
    port: int = 0
    metrics_port: int = -1
    unix_socket: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    log_path: Path = field(default=Path("/dev/null"))
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # e.g. S3 credentials, never in the config

    @property
    def config_path(self) -> Path:
        return self.workdir / "strata-kv.yaml"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self, timeout: float = 30.0) -> KVServerProcess:
        self.config_path.write_text(yaml.safe_dump(self.config))
        self.starts += 1
        self.log_path = self.workdir / f"server-{self.starts}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "strata_kv.cli", "serve", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if m := _READY.search(text):
                self.port = int(m.group(1))
                self.unix_socket = None if m.group(2) == "-" else m.group(2)
                self.metrics_port = int(m.group(3))
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"strata-kv exited with {self.process.returncode}:\n{text[-3000:]}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"strata-kv did not become ready in {timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful: drains write-behind), then SIGKILL if it hangs. Returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def restart(self) -> KVServerProcess:
        self.stop()
        self.config = _merge(self.config, {"listen": {"port": self.port}})  # same port for clients
        return self.start()

    def redis(self, **kwargs: Any) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kwargs)

    def client(self, **kwargs: Any) -> Any:
        from strata_kv.client import KVClient

        return KVClient("127.0.0.1", self.port, **kwargs)


def default_config(workdir: Path, l2_fs: bool = True) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "listen": {"port": 0, "bind": "127.0.0.1", "unix_socket": str(workdir / "kv.sock")},
        "l1": {"size": "64MiB"},
        "metrics": {"port": 0, "bind": "127.0.0.1"},
        "write_behind": {"drain_timeout_seconds": 20},
    }
    if l2_fs:
        # A set capacity makes the watermarks count this tier's own files. With `capacity: 0` they count the
        # whole filesystem's usage, so a host disk that is merely full of other things would evict what a test
        # just wrote. Tests of the unbounded mode pass `capacity: 0` on a tmpfs of their own.
        cfg["l2"] = {"fs": {"root_dir": str(workdir / "l2"), "capacity": "1GiB"}}
    return cfg


@contextlib.contextmanager
def running_kv_server(
    workdir: Path, config: dict[str, Any] | None = None, l2_fs: bool = True, env: dict[str, str] | None = None
) -> Iterator[KVServerProcess]:
    """Start a server with `default_config` overlaid by `config`; always stop it."""
    workdir.mkdir(parents=True, exist_ok=True)
    server = KVServerProcess(workdir, _merge(default_config(workdir, l2_fs), config or {}), env=env or {})
    try:
        yield server.start()
    finally:
        server.stop()
        server.kill()


class KVServerFactory:
    """Starts any number of servers in one test; stops all of them at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._stack = contextlib.ExitStack()
        self._n = 0

    def __call__(
        self,
        config: dict[str, Any] | None = None,
        l2_fs: bool = True,
        name: str = "",
        env: dict[str, str] | None = None,
    ) -> KVServerProcess:
        self._n += 1
        workdir = self.base / (name or f"kv{self._n}")
        return self._stack.enter_context(running_kv_server(workdir, config, l2_fs, env))

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def kv_server_factory(tmp_path: Path) -> Iterator[KVServerFactory]:
    factory = KVServerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def kv_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KVServerProcess]:
    """One shared server (64 MiB L1 + fs L2) for protocol tests that do not care about state."""
    with running_kv_server(tmp_path_factory.mktemp("kv-shared")) as server:
        yield server


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]

    def redis(self, **kwargs: Any) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kwargs)


@contextlib.contextmanager
def running_redis_server(maxmemory: str = "0", extra_args: list[str] | None = None) -> Iterator[RedisServer]:
    """Debian's redis-server on a free loopback port, no persistence (usable by benchmarks too)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server not found: apt-get install -y redis-server")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="strata-redis-")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--maxmemory",
            maxmemory,
            "--protected-mode",
            "no",
            *(extra_args or []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield RedisServer(port, proc)
    finally:
        stop_process(proc, grace=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed (apt-get install -y redis-server)")
    with running_redis_server() as server:
        yield server


@pytest.fixture(scope="session")
def redis_benchmark() -> str:
    """Path of Debian's redis-benchmark (redis-tools)."""
    path = shutil.which("redis-benchmark")
    if path is None:
        unavailable("redis-benchmark is not installed (apt-get install -y redis-tools)")
    assert path is not None
    return path


def kv_large_bench() -> Any:
    """`bench/kv_large.py` as a module, for the tests of its null server and its report (the bench is a script,
    not a package: it is loaded from its file)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "kv_large.py"
    spec = importlib.util.spec_from_file_location("kv_large", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kv_large"] = module
    spec.loader.exec_module(module)
    return module
