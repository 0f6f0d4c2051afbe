"""A peer under hostile connections: a real `serve-peer` process, raw sockets from other loopback addresses
(127.0.0.2 and on, each a pod of its own) that open connections and never finish a request, and real fetcher
processes. The limits hold whatever the attacker does: no thread or transfer slot per unauthenticated
connection, slow connections from many addresses never keep a token holder's request from being served, the
health probe always answered, a trickling request head cut off at its deadline, a busy peer given up on."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import select
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from strata_loader.peer.limits import DEFAULT_MAX_CONNECTIONS_PER_CLIENT
from strata_testsupport.kube import wait_for
from strata_testsupport.peers import fetch_process, finish_fetch, running_peer, write_token

from .test_fanout import Origin, make_origin, node_args, request, run_node

pytestmark = pytest.mark.integration

ATTACKER = "127.0.0.2"


@pytest.fixture
def token(tmp_path) -> Path:
    return write_token(tmp_path / "token")


@pytest.fixture
def origin(s3_server) -> Iterator[Origin]:
    o = make_origin(s3_server, {"config.json": b"{}", "model.safetensors": os.urandom(3 * 2**20)})
    yield o
    o.proxy.close()


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


@contextmanager
def slow_connections(url: str, n: int) -> Iterator[list[socket.socket]]:
    """`n` connections from the attacker's address, each with a request head that never ends."""
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(address(url), timeout=10, source_address=(ATTACKER, 0))
            socks.append(s)
            s.sendall(b"GET /v1/manifest HTTP/1.1\r\nHost: peer\r\n")
        yield socks
    finally:
        for s in socks:
            s.close()


class SlowCrowd:
    """`per_address` connections from each of `addresses`, each sending a request head that never ends, and
    opened again whenever the peer closes one: what many pods of one tenant can hold against a peer."""

    def __init__(self, url: str, addresses: list[str], per_address: int) -> None:
        self.target, self.addresses, self.per_address = address(url), addresses, per_address
        self.reopened = 0
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SlowCrowd:
        for source in self.addresses:
            for _ in range(self.per_address):
                self._open(source)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    @property
    def open(self) -> int:
        return len(self._selector.get_map())

    def _open(self, source: str) -> None:
        s = socket.create_connection(self.target, timeout=10, source_address=(source, 0))
        s.sendall(b"GET /v1/manifest HTTP/1.1\r\nHost: peer\r\nX-Pad: ")
        s.setblocking(False)
        self._selector.register(s, selectors.EVENT_READ, source)

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.1):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    if sock.recv(4096):
                        continue  # an answer (a refusal): the peer closes next
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                self._selector.unregister(sock)
                sock.close()
                self.reopened += 1
                with contextlib.suppress(OSError):  # the peer's backlog full for a moment: next round
                    self._open(key.data)


def test_slow_connections_from_many_addresses_never_crowd_out_a_token_holder(origin, token, tmp_path):
    """160 connections from 10 addresses (16 each: the per-address share), each reopened when closed: a token
    holder's requests are all answered, and a fetch reads every byte from the peer while they hold."""
    run_node(origin, tmp_path / "node-1")
    auth = {"Authorization": f"Bearer {token.read_text().strip()}"}
    attackers = [f"127.0.0.{n}" for n in range(2, 12)]
    with (
        running_peer(tmp_path / "node-1", token) as p,
        SlowCrowd(p.url, attackers, DEFAULT_MAX_CONNECTIONS_PER_CLIENT) as crowd,
    ):
        assert crowd.open == 160
        statuses = []
        for _ in range(10):
            wait_for(lambda: crowd.open == 160, timeout=10, interval=0.01, what="all 160 slow connections open")
            statuses.append(request(p.url, "/v1/manifest", auth)[0])
        assert statuses == [200] * 10, f"authorised GETs answered {statuses} while the slow connections held"
        origin.proxy.reset()
        started = time.monotonic()
        result = run_node(origin, tmp_path / "node-2", [p.url], token)
        print(f"fetch beside 160 slow connections: {time.monotonic() - started:.2f}s, reopened {crowd.reopened}")
        held = metric(p.url, "strata_peer_connections_open")
    assert result["bytes_from_peers"] == origin.total
    assert origin.proxy.range_bytes == 0
    assert held >= 160, "the peer held every slow connection open (none was refused to make room)"


def metric(url: str, name: str) -> float:
    """One unlabelled sample of the peer's /metrics."""
    status, _, body = request(url, "/metrics")
    assert status == 200, body
    (line,) = [x for x in body.decode().splitlines() if x.startswith(name + " ")]
    return float(line.split()[1])


def threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^Threads:\s+(\d+)$", status, re.MULTILINE)
    assert match is not None
    return int(match[1])


def test_slow_connections_take_no_slot_and_a_fetch_still_reads_the_peer(origin, token, tmp_path):
    run_node(origin, tmp_path / "node-1")
    with running_peer(tmp_path / "node-1", token) as p, slow_connections(p.url, 64):
        # Answered only after the 64 were accepted: the probe comes through whatever they hold.
        assert request(p.url, "/healthz")[0::2] == (200, b"ready\n")
        origin.proxy.reset()
        result = run_node(origin, tmp_path / "node-2", [p.url], token)
    assert result["bytes_from_peers"] == origin.total
    assert origin.proxy.range_bytes == 0


def test_hundreds_of_connections_do_not_make_hundreds_of_threads(origin, token, tmp_path):
    run_node(origin, tmp_path / "node-1")
    with running_peer(tmp_path / "node-1", token) as p:
        idle = threads_of(p.process.pid)
        with slow_connections(p.url, 364):
            assert request(p.url, "/healthz")[0] == 200  # every connection above was accepted before this one
            threads = threads_of(p.process.pid)
    # The main, accept and doorman threads, and no more: a connection without a token's request gets none.
    assert threads == idle


def test_a_request_head_that_trickles_in_is_cut_off_at_the_header_deadline(origin, token, tmp_path):
    run_node(origin, tmp_path / "node-1")
    with running_peer(tmp_path / "node-1", token, flags=["--header-timeout", "1"]) as p:
        s = socket.create_connection(address(p.url), timeout=10, source_address=(ATTACKER, 0))
        closed = False
        try:  # a byte every 0.1 s, never a whole head: a per-read timeout would keep this connection forever
            for byte in itertools.islice(itertools.cycle(b"GET /v1/manifest HTTP/1.1\r\nX-Pad: "), 600):
                s.sendall(bytes([byte]))
                if select.select([s], [], [], 0.1)[0] and s.recv(4096) == b"":
                    closed = True
                    break
        except ConnectionError:
            closed = True
        finally:
            s.close()
        assert request(p.url, "/healthz")[0] == 200
    assert closed, "the peer kept a connection whose request head never arrived"


def test_a_peer_that_stays_busy_is_given_up_on_and_the_origin_serves(s3_server, token, tmp_path):
    origin = make_origin(s3_server, {"big.safetensors": os.urandom(24 * 2**20)})
    try:
        run_node(origin, tmp_path / "node-1")
        auth = f"Authorization: Bearer {token.read_text().strip()}\r\n"
        with running_peer(tmp_path / "node-1", token, flags=["--max-transfers", "1"]) as p:
            stalled = socket.socket()
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(address(p.url))
            try:  # a token holder that asks for the whole file and reads none of it holds the one transfer slot
                stalled.sendall(f"GET /v1/files/big.safetensors HTTP/1.1\r\nHost: peer\r\n{auth}\r\n".encode())
                assert stalled.recv(12) == b"HTTP/1.1 200"
                status, headers, _ = request(
                    p.url, "/v1/files/big.safetensors", {"Authorization": auth[15:].strip(), "Range": "bytes=0-0"}
                )
                assert status == 503 and headers["Retry-After"] == "1"
                origin.proxy.reset()
                log = tmp_path / "node-2.termination"
                env = {**origin.env, "STRATA_PEER_BUSY_S": "0.5"}
                proc = fetch_process(node_args(origin, tmp_path / "node-2", [p.url], token), env, log)
                result = finish_fetch(proc, log, timeout=120)
            finally:
                stalled.close()
        assert result["bytes_from_peers"] == 0
        assert "busy (503) for more than 0.5s; not used again" in str(result["stderr"])
        assert origin.proxy.range_bytes == origin.total
    finally:
        origin.proxy.close()
