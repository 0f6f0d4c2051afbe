"""`strata-loader serve-peer DIR`: serve a verified copy's files to other nodes' fetches, so the origin (S3, the
Hub) is read once per cluster instead of once per node.

Who may trust what it serves, and how it proves it holds the token and the first copy's manifest before a
fetcher sends the token: `trust`. What it serves is deliberately narrow: the copy's manifest and the byte
ranges of the files that manifest lists, nothing else (no listing, no other path under DIR, no bookkeeping
files), read-only, and only after every listed file has been hashed and matched the manifest's checksum at
start-up. Every request but the health probe and the proof carries `Authorization: Bearer <token>`, the token
the operator keeps in a Secret; it is compared in constant time. Connections, request heads and transfers are
bounded, and only a token holder's request takes a thread, only its file request a transfer slot (`limits`):
no number of connections without the token keeps a fetcher's request from being served; one over a limit gets
a 503 and the fetcher tries another peer. Files are reached through `paths.DestDir` (no symlink inside DIR is
followed) and the request path must pass `paths.safe_relative_path`, the rule the fetch itself writes by.
"""

from __future__ import annotations

import hmac
import http.client
import io
import json
import os
import signal
import socket
import socketserver
import sys
import threading
from email.message import Message
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ..contract import MANIFEST_NAME, PEER_HEALTH_PATH, manifest_digest
from ..core.manifest import Manifest, ManifestError, ManifestFile, damage, strongest_checksum
from ..paths import DestDir, UnsafePathError, safe_relative_path
from .limits import Connection, Doorman, PeerLimits
from .trust import NONCE, PROOF_URL_PATH, connection_address, proof

TOKEN_MIN_LENGTH = 16
"""A shorter token is refused at start: the operator generates 32 random bytes."""

MANIFEST_URL_PATH = "/v1/manifest"
FILES_URL_PREFIX = "/v1/files/"
HEALTH_URL_PATH = PEER_HEALTH_PATH
METRICS_URL_PATH = "/metrics"
PUBLIC_PATHS = frozenset({HEALTH_URL_PATH, PROOF_URL_PATH, METRICS_URL_PATH})
"""Answered without the token (by the doorman, at once): the readiness probe, the proof and the counters."""


class PeerError(RuntimeError):
    """The peer cannot serve: bad token file, or a copy that is incomplete or does not match its manifest."""


def read_token(path: str | os.PathLike[str]) -> str:
    """The shared token from a file (a mounted Secret key); surrounding whitespace is not part of it."""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise PeerError(f"cannot read the peer token file {path}: {e.strerror}; mount the token Secret there") from None
    if len(token) < TOKEN_MIN_LENGTH:
        raise PeerError(
            f"the peer token in {path} is {len(token)} characters, shorter than {TOKEN_MIN_LENGTH}; use a random token"
        )
    return token


class VerifiedCopy:
    """A copy under DIR whose files were all checked against its manifest (size and strongest checksum).

    Only files with a recorded checksum are served: a fetcher can verify bytes from a peer only against one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tree = DestDir(root)
        self.manifest_bytes = b""
        self.manifest_digest = ""
        self.files: dict[str, ManifestFile] = {}

    def verify(self) -> None:
        try:
            with open(self.tree.open(MANIFEST_NAME, os.O_RDONLY), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise PeerError(f"{self.root}: no {MANIFEST_NAME}; the copy is incomplete, nothing to serve") from None
        try:
            manifest = Manifest.model_validate_json(data)
        except ValueError as e:
            raise ManifestError(f"{self.root / MANIFEST_NAME} is not a valid manifest: {e}") from None
        served = {}
        for entry in manifest.files:
            if strongest_checksum(entry.checksums) is None:
                print(
                    f"strata-loader serve-peer: {entry.path} has no recorded checksum and is not served"
                    " (fetch the first copy with --verify checksums)",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            what = damage(self.tree, entry, checksums=True)
            if what is not None:
                raise PeerError(f"{self.root / entry.path}: {what}; re-run fetch to repair the copy before serving it")
            served[entry.path] = entry
        self.manifest_bytes, self.manifest_digest, self.files = data, manifest_digest(data), served

    def close(self) -> None:
        self.tree.close()


class PeerServer(socketserver.TCPServer):
    """Every accepted connection goes to the doorman (`limits.Doorman`), which answers what needs no token and
    gives each token holder's request a thread; the copy is served once `ready` is set."""

    allow_reuse_address = True
    request_queue_size = 1024  # a burst of connects is accepted, not dropped at SYN (a fetcher's would wait 1 s)

    def __init__(self, address: tuple[str, int], copy: VerifiedCopy, token: str, limits: PeerLimits) -> None:
        limits.check()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)  # type: ignore[arg-type]  # never called: the doorman makes handlers
        self.copy, self.token, self.limits = copy, token.encode(), limits
        self.ready = threading.Event()
        self.transfers = threading.BoundedSemaphore(limits.max_transfers)
        self._served_lock = threading.Lock()
        self.served_bytes = self.served_ranges = 0
        self.doorman = Doorman(limits, self.authorized, self.answer, self.serve_request)

    def health(self) -> tuple[int, str]:
        return (200, "ready") if self.ready.is_set() else (503, "verifying")

    def count(self, n: int) -> None:
        with self._served_lock:
            self.served_bytes += n
            self.served_ranges += 1

    def process_request(self, request: socket.socket, client_address: tuple[str, int]) -> None:  # type: ignore[override]
        self.doorman.add(request, client_address)

    def authorized(self, head: bytes) -> bool:
        """A request only a token holder gets an answer to, carrying the token: it is given a thread."""
        parsed = parse_head(head)
        return parsed is not None and parsed[0] not in PUBLIC_PATHS and bearer_matches(parsed[1], self.token)

    def answer(self, conn: Connection, head: bytes) -> tuple[bytes, bool]:
        """Any other request, answered on the doorman's thread into memory (never the socket)."""
        out = io.BytesIO()
        handler = _Handler(conn, head, self, out)
        return out.getvalue(), not handler.close_connection

    def serve_request(self, conn: Connection, head: bytes) -> bool:
        """A token holder's request, on its own thread; True: the connection may carry the next one."""
        try:
            return not _Handler(conn, head, self, None).close_connection
        except OSError:
            return False  # the client went away or stopped reading: nothing to answer
        except Exception:
            self.handle_error(conn.sock, conn.address)
            return False

    def metrics(self) -> str:
        rows = self.doorman.metrics()
        rows += [("strata_peer_served_bytes_total", "", self.served_bytes)]
        rows += [("strata_peer_served_ranges_total", "", self.served_ranges)]
        return "".join(
            f"{name}{{{labels}}} {value:g}\n" if labels else f"{name} {value:g}\n" for name, labels, value in rows
        )

    def server_close(self) -> None:
        super().server_close()
        self.doorman.close()


def parse_head(head: bytes) -> tuple[str, Message] | None:
    """The path and headers of a complete request head, or None when it is not one (the handler answers 400)."""
    line, _, rest = head.partition(b"\r\n")
    words = line.split()
    if len(words) != 3:
        return None
    try:
        return urlsplit(words[1].decode("latin-1")).path, http.client.parse_headers(io.BytesIO(rest))
    except (http.client.HTTPException, ValueError):
        return None


def bearer_matches(headers: Message, token: bytes) -> bool:
    """`Authorization: Bearer <token>`, compared in constant time."""
    scheme, _, credential = headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode(), token)


class _SocketWriter(io.BufferedIOBase):
    """The handler's output straight to a blocking socket (the answer's pace is `send_timeout_s`)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._sock.sendall(b)
        return len(b)


class _Handler(BaseHTTPRequestHandler):
    """One request whose head the doorman read: into memory for an answer that needs no token (`out`), to the
    socket on a thread of its own for a token holder's."""

    protocol_version = "HTTP/1.1"
    server: PeerServer
    server_version = "strata-peer"
    sys_version = ""

    def __init__(self, conn: Connection, head: bytes, server: PeerServer, out: io.BytesIO | None) -> None:
        self._head, self._out = head, out
        super().__init__(conn.sock, conn.address, server)

    @property
    def inline(self) -> bool:
        return self._out is not None

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self._head)
        self.wfile = self._out if self._out is not None else _SocketWriter(self.connection)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        """Nothing to flush or close: the doorman keeps the socket, `answer` reads `out`."""

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def log_message(self, format: str, *args: object) -> None:
        """Successful reads are not logged (thousands per fetch); refusals are, by `_refuse`."""

    def _refuse(self, status: HTTPStatus, why: str, headers: dict[str, str] | None = None) -> None:
        body = (why + "\n").encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        if status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN, HTTPStatus.NOT_FOUND, HTTPStatus.BAD_REQUEST):
            print(
                json.dumps({"event": "refused", "status": int(status), "client": self.client_address[0], "why": why}),
                file=sys.stderr,
                flush=True,
            )

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        if not given or given.partition(" ")[0].lower() != "bearer":
            self._refuse(
                HTTPStatus.UNAUTHORIZED, "a bearer token is required", {"WWW-Authenticate": 'Bearer realm="strata"'}
            )
            return False
        if not bearer_matches(self.headers, self.server.token):
            self._refuse(HTTPStatus.FORBIDDEN, "the token does not match")
            return False
        return True

    def _serve(self, body: bool) -> None:
        if not self.inline:
            self.connection.settimeout(self.server.limits.send_timeout_s)  # the head is in: now the answer's pace
        url = urlsplit(self.path)
        path = url.path
        if path == HEALTH_URL_PATH:
            status, text = self.server.health()
            self._refuse(HTTPStatus(status), text)
            return
        if path == PROOF_URL_PATH:
            self._prove(url.query)
            return
        if path == METRICS_URL_PATH:
            self._refuse(HTTPStatus.OK, self.server.metrics().rstrip("\n"), {"Cache-Control": "no-store"})
            return
        if not self._authorized():
            return
        if self.inline:  # the doorman saw no token where this parse sees one: never serve from its thread
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "busy: try again", {"Retry-After": "1"})
            return
        if not self.server.ready.is_set():
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "verifying the copy", {"Retry-After": "1"})
            return
        if path == MANIFEST_URL_PATH:
            data = self.server.copy.manifest_bytes
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)
            return
        if not path.startswith(FILES_URL_PREFIX):
            self._refuse(HTTPStatus.NOT_FOUND, "not found: this server serves only /v1/manifest and /v1/files/")
            return
        rel = unquote(path[len(FILES_URL_PREFIX) :])
        try:
            safe_relative_path(rel)
        except UnsafePathError as e:
            self._refuse(HTTPStatus.BAD_REQUEST, f"path {e}")
            return
        entry = self.server.copy.files.get(rel)
        if entry is None:
            self._refuse(HTTPStatus.NOT_FOUND, f"{rel!r} is not a verified file of this copy")
            return
        if not self.server.transfers.acquire(blocking=False):
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "busy: every transfer slot is in use", {"Retry-After": "1"})
            return
        try:
            self._send_file(entry, body)
        finally:
            self.server.transfers.release()

    def _prove(self, query: str) -> None:
        """No token needed: the answer shows the fetcher this peer holds the token and the manifest it expects,
        before the fetcher sends its token (`trust`)."""
        nonce = (parse_qs(query).get("nonce") or [""])[0]
        if not NONCE.match(nonce):
            self._refuse(HTTPStatus.BAD_REQUEST, "nonce: 32 to 128 lowercase hex digits")
            return
        if not self.server.ready.is_set():
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "verifying the copy", {"Retry-After": "1"})
            return
        here = connection_address(self.connection.getsockname())
        answer = proof(self.server.token, nonce, here, self.server.copy.manifest_digest)
        self._refuse(HTTPStatus.OK, answer)

    def _send_file(self, entry: ManifestFile, body: bool) -> None:
        span = _parse_range(self.headers.get("Range"), entry.size)
        if span is None:
            self._refuse(
                HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                f"one range 'bytes=a-b' inside the file's {entry.size} bytes",
                {"Content-Range": f"bytes */{entry.size}"},
            )
            return
        start, length = span
        fd = self.server.copy.tree.open(entry.path, os.O_RDONLY)
        with open(fd, "rb", buffering=0) as f:
            if os.fstat(fd).st_size != entry.size:  # changed under us since verification: never serve it
                self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, f"{entry.path} changed since it was verified")
                return
            ranged = self.headers.get("Range") is not None
            self.send_response(HTTPStatus.PARTIAL_CONTENT if ranged else HTTPStatus.OK)
            if ranged:
                self.send_header("Content-Range", f"bytes {start}-{start + length - 1}/{entry.size}")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            if body and length:
                self.connection.sendfile(f, start, length)
                self.server.count(length)


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, length) of a single `bytes=` range, the whole file without a header, None when unsatisfiable."""
    if header is None:
        return 0, size
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if not first:  # suffix: the last N bytes
            n = int(last)
            return (size - min(n, size), min(n, size)) if n > 0 and size else None
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start < 0 or start >= size or end < start:
        return None
    return start, min(end, size - 1) - start + 1


def serve(root: Path, token_file: str, host: str, port: int, limits: PeerLimits | None = None) -> None:
    """Listen first (the health probe answers 'verifying'), verify the copy, then serve until killed."""
    limits = limits or PeerLimits()
    try:
        limits.check()
    except ValueError as e:
        raise PeerError(str(e)) from None
    token = read_token(token_file)
    if not root.is_dir():
        raise PeerError(f"{root} is not a directory; give the directory the copy was fetched into")
    copy = VerifiedCopy(root)
    server = PeerServer((host, port), copy, token, limits)
    thread = threading.Thread(target=server.serve_forever, name="strata-peer", daemon=True)
    thread.start()
    bound = server.server_address
    print(json.dumps({"event": "listening", "host": bound[0], "port": bound[1]}), flush=True)
    signal.signal(signal.SIGTERM, _stop)  # a pod's shutdown: log what was served, then exit 0
    try:
        copy.verify()
        server.ready.set()
        print(
            json.dumps(
                {"event": "serving", "files": len(copy.files), "bytes": sum(f.size for f in copy.files.values())}
            ),
            flush=True,
        )
        thread.join()
    except _Stopped:
        pass
    finally:
        server.shutdown()
        server.server_close()
        copy.close()
        print(json.dumps({"event": "served", "bytes": server.served_bytes, "ranges": server.served_ranges}), flush=True)


class _Stopped(Exception):
    """SIGTERM: stop serving."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped
