"""A TCP proxy on loopback in front of an origin (the S3 server fixture) that counts what the origin serves.

It forwards bytes unchanged both ways and reads the requests as they pass (HTTP/1.1, kept-alive connections
included): `range_bytes` sums the lengths of the `Range: bytes=a-b` headers of GETs, `response_bytes` counts
every byte the origin sent back (bodies, headers, listings). Tests and benchmarks use it to show how often the
origin was read; it adds no behaviour of its own, except a gate when asked for one.

The gate (`hold_ranges_after=N`) forwards the first N ranged GETs and holds every later request on its
connection until `release()`: a copy then stops at a point the test chose, however fast or slow this machine
runs, and `holding` says it got there (a test interrupting a copy waits for it instead of racing the copy).
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import threading
import time
from collections import Counter

_RANGE = re.compile(rb"^range:\s*bytes=(\d+)-(\d+)\s*$", re.IGNORECASE | re.MULTILINE)
_LENGTH = re.compile(rb"^content-length:\s*(\d+)\s*$", re.IGNORECASE | re.MULTILINE)


class CountingProxy:
    """Listens on `listen_host` (127.0.0.1 unless told; a free port) and forwards to `upstream_port` on
    `upstream_host`."""

    def __init__(
        self,
        upstream_port: int,
        upstream_host: str = "127.0.0.1",
        hold_ranges_after: int | None = None,
        listen_host: str = "127.0.0.1",
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listen_host = listen_host
        self._lock = threading.Lock()
        self.hold_ranges_after = hold_ranges_after
        self.holding = threading.Event()
        """Set once a request was held at the gate."""
        self.held_from: set[str] = set()
        """The client addresses with a request held at the gate (which readers a test has stopped)."""
        self._released = threading.Event()
        if hold_ranges_after is None:
            self._released.set()
        self.ranged_gets = 0
        self.range_bytes = 0
        self.response_bytes = 0
        self.gets = 0
        self.unranged_gets = 0
        self.range_bytes_by_path: Counter[str] = Counter()
        self._srv = socket.create_server((listen_host, 0))
        self.port = int(self._srv.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True, name="counting-proxy").start()

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.listen_host}:{self.port}"

    def reset(self) -> None:
        with self._lock:
            self.range_bytes = self.response_bytes = self.gets = self.unranged_gets = self.ranged_gets = 0
            self.range_bytes_by_path.clear()

    def wait_until_holding(self, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
        """Until the gate holds a request of `process` (its client); fails if the process ends first. The
        timeout only bounds a hang: reaching the gate is certain while the process runs."""
        deadline = time.monotonic() + timeout
        while not self.holding.wait(0.05):
            if process.poll() is not None:
                raise AssertionError(f"the client ended ({process.returncode}) before the gate held a request")
            if time.monotonic() > deadline:
                raise AssertionError(f"no request reached the gate in {timeout:.0f} s")

    def release(self) -> None:
        """Open the gate: held requests go on to the origin, and so does every later one."""
        self._released.set()

    def close(self) -> None:
        self.release()  # no thread stays parked at the gate
        with contextlib.suppress(OSError):
            self._srv.close()

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            up = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        threading.Thread(target=self._responses, args=(up, client), daemon=True).start()
        self._requests(client, up)

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        """Forward requests, reading each header block (and skipping over a body of Content-Length bytes); a
        chunk that holds a request past the gate waits for `release()` before it goes on."""
        pending = b""
        body_left = 0
        try:
            while chunk := src.recv(1 << 16):
                pending += chunk
                gated = False
                while True:
                    if body_left:
                        skip = min(body_left, len(pending))
                        pending, body_left = pending[skip:], body_left - skip
                        if body_left:
                            break
                    head, sep, rest = pending.partition(b"\r\n\r\n")
                    if not sep:
                        break
                    gated = self._count_request(head) or gated
                    m = _LENGTH.search(head)
                    body_left = int(m.group(1)) if m else 0
                    pending = rest
                if gated and not self._released.is_set():
                    with self._lock:
                        self.held_from.add(str(src.getpeername()[0]))
                    self.holding.set()
                    self._released.wait()
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            _close_both(src, dst)

    def _count_request(self, head: bytes) -> bool:
        """Count one request; True when the gate must hold it (a ranged GET past `hold_ranges_after`)."""
        line = head.split(b"\r\n", 1)[0].split(b" ")
        if len(line) < 2 or line[0] != b"GET":
            return False
        path = line[1].split(b"?", 1)[0].decode(errors="replace")
        m = _RANGE.search(head)
        with self._lock:
            self.gets += 1
            if m:
                n = int(m.group(2)) - int(m.group(1)) + 1
                self.range_bytes += n
                self.range_bytes_by_path[path] += n
                self.ranged_gets += 1
                return self.hold_ranges_after is not None and self.ranged_gets > self.hold_ranges_after
            if "/" in path.strip("/"):  # an object, not a bucket listing
                self.unranged_gets += 1
        return False

    def _responses(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
                with self._lock:
                    self.response_bytes += len(chunk)
        except OSError:
            pass
        finally:
            _close_both(src, dst)


def _close_both(a: socket.socket, b: socket.socket) -> None:
    for s in (a, b):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()
