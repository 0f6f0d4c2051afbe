"""Fetch from peers first: byte ranges of files that other nodes already hold verified, the origin only for what
no peer can serve.

The origin is still listed (one LIST or directory walk: names, sizes, versions, its own checksums; no object
bytes), and that listing stays the truth. A peer is used at all only once it has proved it holds the token and
exactly the first copy's manifest (the digest the operator passes), before the token is sent to it
(`trust`); then it is used for a file only when its manifest names the same
source and revision and records that file with the same size and version, a checksum, and no checksum that
contradicts the origin's. The fetch then hashes every file that came from peers against those checksums (the
origin's where it has them, else the one the first copy computed while reading the origin), exactly as a fetch
from the origin is verified; a mismatch removes the file like any other.

Ranges go round-robin over the live peers that hold a file, so several peers serve one fetch in parallel. A
peer that refuses the token, drops a connection, times out or answers short is dropped for the rest of the run
and the range is read again from the next peer, or from the origin when none is left: a peer killed mid-transfer
costs the ranges in flight, not the fetch. A busy peer (503) is skipped for that range (the next peer holding
the file is tried at once) and asked again after a short pause; one that has answered nothing but 503 for
`peer_busy_seconds` (STRATA_PEER_BUSY_S, `core/settings.py`) is dropped like a gone one, so a fetch spends at
most that long on a peer that stays busy, not a wait per range.
"""

from __future__ import annotations

import hmac
import http.client
import itertools
import queue
import random
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from urllib.parse import quote, urlsplit

from ..contract import PEER_PORT, manifest_digest
from ..core import settings
from ..core.manifest import Manifest, ManifestFile, strongest_checksum
from ..core.sources import RangeReader, SourceFile
from .server import FILES_URL_PREFIX, MANIFEST_URL_PATH
from .trust import PROOF_URL_PATH, connection_address, proof

PEER_TIMEOUT_S = 20.0
"""Connect and read timeout for one request to a peer; past it the peer counts as gone."""
CONNECTIONS_PER_PEER = 4
"""Requests one fetch has in flight to one peer: many nodes share a peer (its limit is 64 connections), and
a few streams fill a node's link."""


class PeerGone(RuntimeError):
    """This peer cannot serve any more: connection lost, timeout, refused token, short or wrong answer."""


class PeerBusy(RuntimeError):
    """This peer is at its connection limit right now (503); another peer, or the same one later, may serve."""


@dataclass(eq=False)
class Peer:
    """One peer server (one address: a name that resolves to several addresses is several peers)."""

    host: str
    port: int
    token: str
    files: dict[str, ManifestFile] = field(default_factory=dict)
    gone: str | None = None
    busy_since: float | None = None
    proven: bool = False
    """It answered the proof: only then does a request carry the token."""
    _idle: queue.SimpleQueue[http.client.HTTPConnection] = field(default_factory=queue.SimpleQueue)
    slots: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(CONNECTIONS_PER_PEER))

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def drop(self, why: str) -> None:
        if self.gone is None:
            self.gone = why
            print(f"strata-loader fetch: peer {self.url}: {why}; not used again", file=sys.stderr, flush=True)

    def busy(self) -> None:
        """It answered 503: dropped once it has answered nothing else for `peer_busy_seconds` (STRATA_PEER_BUSY_S)."""
        now = time.monotonic()
        if self.busy_since is None:
            self.busy_since = now
        elif now - self.busy_since > (limit := settings.current().peer_busy_seconds):
            self.drop(f"busy (503) for more than {limit:g}s")

    def get(self, path: str, headers: dict[str, str]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send one GET on a pooled connection; the caller reads the body, then `release`s or closes.
        The token goes only to a peer that has `proven` itself (`prove`, which sends none).
        A kept-alive connection the peer closed meanwhile (its header timeout) is replaced once, not a failure."""
        if self.proven:
            headers = {"Authorization": f"Bearer {self.token}", **headers}
        conn, reused = self._connection()
        try:
            try:
                resp = self._send(conn, path, headers)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
                conn.close()
                conn = self._new_connection()
                resp = self._send(conn, path, headers)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise PeerGone(f"{type(e).__name__}: {e}") from None
        if resp.status == 503:
            resp.read()
            conn.close()
            raise PeerBusy("503")
        self.busy_since = None
        if resp.status in (401, 403):
            conn.close()
            raise PeerGone(f"refused the token ({resp.status}); check the token Secret both sides mount")
        return conn, resp

    def _send(self, conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        conn.request("GET", path, headers=headers)
        return conn.getresponse()

    def release(self, conn: http.client.HTTPConnection) -> None:
        self._idle.put(conn)

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """A pooled connection (True) or a new one (False)."""
        try:
            return self._idle.get_nowait(), True
        except queue.Empty:
            return self._new_connection(), False

    def _new_connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=PEER_TIMEOUT_S)

    def read_range(self, relpath: str, offset: int, buf: memoryview) -> None:
        n = len(buf)
        conn, resp = self.get(FILES_URL_PREFIX + quote(relpath), {"Range": f"bytes={offset}-{offset + n - 1}"})
        try:
            if resp.status != 206 or resp.getheader("Content-Length") != str(n):
                raise PeerGone(
                    f"answered {resp.status} with {resp.getheader('Content-Length')} bytes for a {n}-byte range"
                )
            done = 0
            while done < n:
                got = resp.readinto(buf[done:])
                if not got:
                    raise PeerGone(f"{relpath}: the answer ended after {done} of {n} bytes")
                done += got
        except PeerGone:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise PeerGone(f"{type(e).__name__} while reading {relpath}: {e}") from None
        self.release(conn)

    def prove(self, digest: str) -> None:
        """Ask the peer to show, without the token, that it holds the token and the manifest `digest`."""
        nonce = secrets.token_hex(16)
        conn, resp = self.get(f"{PROOF_URL_PATH}?nonce={nonce}", {})
        try:
            address = connection_address(conn.sock.getpeername()) if conn.sock is not None else ""
            answer = resp.read().strip().decode("ascii", "replace")
        except (OSError, http.client.HTTPException, ValueError) as e:
            conn.close()
            raise PeerGone(f"{type(e).__name__} while reading its proof: {e}") from None
        self.release(conn)
        want = proof(self.token.encode(), nonce, address, digest)
        if resp.status != 200 or not address or not hmac.compare_digest(answer, want):
            raise PeerGone(
                f"did not prove it holds our token and the first copy's manifest {digest} (answered {resp.status}):"
                " it holds another copy, or the token Secret differs on either side; the token was not sent to it"
            )
        self.proven = True

    def fetch_manifest(self) -> bytes:
        conn, resp = self.get(MANIFEST_URL_PATH, {})
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise PeerGone(f"{type(e).__name__} while reading its manifest: {e}") from None
        if resp.status != 200:
            conn.close()
            raise PeerGone(f"answered {resp.status} for its manifest")
        self.release(conn)
        return data

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


def resolve_peers(urls: Iterable[str], token: str) -> list[Peer]:
    """One `Peer` per address the URLs' hosts resolve to (a headless Service name gives every ready peer)."""
    out: dict[tuple[str, int], Peer] = {}
    for url in urls:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or PEER_PORT
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            print(f"strata-loader fetch: peer {url}: cannot resolve {host} ({e}); skipped", file=sys.stderr, flush=True)
            continue
        for info in infos:
            addr = str(info[4][0])
            out.setdefault((addr, port), Peer(addr, port, token))
    return list(out.values())


class PeerSet:
    """The peers of one fetch, with what each holds, and the byte counts by where they came from."""

    def __init__(self, peers: list[Peer], manifest: bytes | None = None) -> None:
        self.peers = peers
        self.manifest = manifest
        """The manifest every peer proved it holds (the first copy's, byte for byte); None without peers."""
        self._lock = threading.Lock()
        self.bytes_from_peers = 0
        self.bytes_from_origin = 0

    @classmethod
    def discover(cls, urls: Iterable[str], token: str, source: str, revision: str | None, digest: str) -> PeerSet:
        """Keep the peers that prove they hold the manifest `digest`, of this source at this revision."""
        peers = resolve_peers(urls, token)
        found: dict[Peer, bytes] = {}
        threads = [threading.Thread(target=_load, args=(p, source, revision, digest, found)) for p in peers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        live = [p for p in peers if p.gone is None]
        return cls(live, found[live[0]] if live else None)

    def count(self, n: int, from_peer: bool) -> None:
        with self._lock:
            if from_peer:
                self.bytes_from_peers += n
            else:
                self.bytes_from_origin += n

    def holders(self, src: SourceFile) -> tuple[list[Peer], dict[str, str]]:
        """The peers that may serve `src`, and the checksums its bytes must match (empty when none may)."""
        agreed: dict[str, str] = {}
        out: list[Peer] = []
        for p in self.peers:
            entry = p.files.get(src.relpath)
            if entry is None or entry.size != src.size or entry.version != src.version:
                continue
            sums = {**entry.checksums, **src.checksums}
            if any(entry.checksums.get(a, v) != v for a, v in src.checksums.items()):
                p.drop(f"its {src.relpath} has checksums {entry.checksums}, the origin says {src.checksums}")
                continue
            if agreed and any(agreed.get(a, v) != v for a, v in sums.items()):
                p.drop(f"its checksums of {src.relpath} differ from another peer's")
                continue
            agreed = agreed or sums
            out.append(p)
        return out, agreed

    def close(self) -> None:
        for p in self.peers:
            p.close()


def _load(p: Peer, source: str, revision: str | None, digest: str, found: dict[Peer, bytes]) -> None:
    """Its proof, then its manifest (asked again while it is busy, 503, up to `peer_busy_seconds`)."""
    pause = 0.05
    while True:
        try:
            if not p.proven:
                p.prove(digest)
            data = p.fetch_manifest()
            break
        except PeerBusy:
            p.busy()
            if p.gone is not None:
                return
            time.sleep(pause * (0.5 + random.random()))
            pause = min(1.0, pause * 2)
        except PeerGone as e:
            p.drop(str(e))
            return
    if (got := manifest_digest(data)) != digest:
        p.drop(f"serves a manifest with digest {got}, not the first copy's {digest}")
        return
    try:
        m = Manifest.model_validate_json(data)
    except ValueError as e:
        p.drop(f"sent a manifest that is not valid: {e}")
        return
    if m.source != source or m.revision != revision:
        p.drop(f"holds {m.source} at revision {m.revision}, not {source} at {revision}")
        return
    p.files = {f.path: f for f in m.files if strongest_checksum(f.checksums) is not None}
    found[p] = data


def with_peers(files: list[SourceFile], peers: PeerSet) -> list[SourceFile]:
    """`files` with a peer-first reader (and the checksums to verify against) for each file a peer holds."""
    out = []
    for f in files:
        holders, sums = peers.holders(f)
        if not holders:
            out.append(_counted(f, peers))
            continue
        out.append(replace(f, checksums=sums, open=_fanout_opener(f, holders, peers)))
    return out


def _fanout_opener(f: SourceFile, holders: list[Peer], peers: PeerSet) -> Callable[[], RangeReader]:
    return lambda: FanoutReader(f, holders, peers)


def _counted(f: SourceFile, peers: PeerSet) -> SourceFile:
    return replace(f, open=lambda: _CountingReader(f.open(), peers))


class _CountingReader:
    """An origin reader that adds what it reads to the origin's byte count."""

    def __init__(self, inner: RangeReader, peers: PeerSet) -> None:
        self.inner, self.peers = inner, peers
        self.name, self.size = inner.name, inner.size

    def read_into(self, offset: int, buf: memoryview) -> None:
        self.inner.read_into(offset, buf)
        self.peers.count(len(buf), from_peer=False)

    def close(self) -> None:
        self.inner.close()


class FanoutReader:
    """Reads each range from the next live peer holding the file; from the origin when none can serve it."""

    def __init__(self, src: SourceFile, holders: list[Peer], peers: PeerSet) -> None:
        self.src, self.holders, self.peers = src, holders, peers
        self.name, self.size = src.relpath, src.size
        self._next = itertools.count()
        self._origin: RangeReader | None = None
        self._origin_lock = threading.Lock()

    def read_into(self, offset: int, buf: memoryview) -> None:
        pause = 0.05
        while True:  # ends: a peer that stays busy is dropped after `peer_busy_seconds` (`Peer.busy`)
            live = [p for p in self.holders if p.gone is None]
            if not live:
                break
            start = next(self._next) % len(live)
            outcome = self._try_peers(live[start:] + live[:start], offset, buf)
            if outcome == "done":
                return
            if outcome == "gone":
                break
            time.sleep(pause * (0.5 + random.random()))
            pause = min(1.0, pause * 2)
        self._origin_reader().read_into(offset, buf)
        self.peers.count(len(buf), from_peer=False)

    def _try_peers(self, order: list[Peer], offset: int, buf: memoryview) -> str:
        """'done', 'busy' (some peer answered 503: try again later) or 'gone' (none of them can serve).
        A peer whose share of this fetch's connections is in use is skipped, unless all are: then the range
        waits for the first one."""
        tried = busy = False
        for p in order:
            wait = not tried and p is order[-1]
            if p.gone is not None or not (p.slots.acquire(timeout=PEER_TIMEOUT_S) if wait else p.slots.acquire(False)):
                continue
            tried = True
            try:
                p.read_range(self.src.relpath, offset, buf)
            except PeerBusy:
                p.busy()
                busy = True
                continue
            except PeerGone as e:
                p.drop(str(e))
                continue
            finally:
                p.slots.release()
            self.peers.count(len(buf), from_peer=True)
            return "done"
        return "busy" if busy or not tried else "gone"

    def _origin_reader(self) -> RangeReader:
        with self._origin_lock:
            if self._origin is None:
                self._origin = self.src.open()
            return self._origin

    def close(self) -> None:
        if self._origin is not None:
            self._origin.close()
