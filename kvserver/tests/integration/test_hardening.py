"""Hostile and careless clients against a real server: memory, slots and time stay bounded.

Memory is the server process's resident set (psutil), sampled after a PING on another connection
has come back, so the server has handled everything sent before it.
"""

from __future__ import annotations

import select
import socket
import time

import psutil
import pytest
from strata_testsupport.kvserver import KVServerProcess

pytestmark = pytest.mark.integration

MiB = 1024**2
HUGE_SET = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n"  # announces a 512 MiB value


def cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def connect(server: KVServerProcess, timeout: float = 20) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def recv_line(sock: socket.socket) -> bytes:
    out = b""
    while not out.endswith(b"\r\n"):
        c = sock.recv(1)
        if not c:
            break
        out += c
    return out


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def rss_after_sync(server: KVServerProcess, prelude: bytes = b"") -> int:
    """Resident bytes of the server once it answered a PING sent after everything else."""
    with connect(server) as s:
        s.sendall(prelude + cmd(b"PING"))
        while not recv_line(s).startswith(b"+PONG"):
            pass
    assert server.process is not None
    return int(psutil.Process(server.process.pid).memory_info().rss)


# -- F2: announced sizes are claims, not allocations ------------------------------------------------
def test_announced_huge_values_cost_only_what_arrives(kv_server_factory) -> None:
    server = kv_server_factory({"metrics": {"port": -1}}, l2_fs=False)
    base = rss_after_sync(server)
    socks = [connect(server) for _ in range(6)]
    for s in socks:
        s.sendall(HUGE_SET + b"x" * MiB)
    held = rss_after_sync(server)
    for s in socks:
        s.close()
    _wait_until_closed(server)
    after = rss_after_sync(server)
    assert held - base < 64 * MiB, f"6 announced 512 MiB values took {(held - base) // MiB} MiB"
    assert after - base < 64 * MiB, f"{(after - base) // MiB} MiB still held after the connections closed"


def test_closed_connections_give_their_buffers_back(kv_server_factory) -> None:
    """Half-sent large values, connections that lived through a few collections, then went away."""
    # an in-flight budget for all six announced values at once: here they must arrive, not wait
    server = kv_server_factory({"metrics": {"port": -1}, "limits": {"max_inflight_bytes": "4GiB"}}, l2_fs=False)
    base = rss_after_sync(server)
    socks = [connect(server) for _ in range(6)]
    for s in socks:
        s.sendall(HUGE_SET)
        s.sendall(b"x" * 48 * MiB)
    rss_after_sync(server, prelude=cmd(b"PING") * 20_000)  # enough allocations to age the connections
    for s in socks:
        s.close()
    _wait_until_closed(server)
    after = rss_after_sync(server)
    assert after - base < 100 * MiB, f"{(after - base) // MiB} MiB still held after 6 closed connections"


def _wait_until_closed(server: KVServerProcess) -> None:
    """Until the server has seen every other connection close: the bytes a client sent before closing may
    still be on their way (the server wakes for a large value only once megabytes of it are there)."""
    r = server.redis()
    deadline = time.monotonic() + 30
    while r.info("clients")["connected_clients"] > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    r.close()


TOKEN = b"a-token-of-32-bytes-for-the-test"


def auth_server(factory, tmp_path, config: dict | None = None, token: bytes = TOKEN) -> KVServerProcess:
    config = dict(config or {})
    token_file = tmp_path / "token"
    token_file.write_bytes(token + b"\n")
    auth = {"token_file": str(token_file), **config.pop("auth", {})}
    return factory({"auth": auth, "metrics": {"port": -1}, **config}, l2_fs=False)


def test_before_auth_a_connection_cannot_announce_large_requests(kv_server_factory, tmp_path) -> None:
    server = auth_server(kv_server_factory, tmp_path)
    login = cmd(b"AUTH", TOKEN)
    base = rss_after_sync(server, prelude=login)
    for request, error in ((HUGE_SET, b"bulk"), (b"*100000\r\n", b"multibulk")):
        for _ in range(6):
            with connect(server) as s:
                s.sendall(request)
                assert recv_line(s) == b"-ERR Protocol error: unauthenticated %s length\r\n" % error
                assert closed_by_server(s)
    assert rss_after_sync(server, prelude=login) - base < 32 * MiB


def test_what_follows_auth_in_one_read_gets_the_authenticated_limits(kv_server_factory, tmp_path) -> None:
    server = auth_server(kv_server_factory, tmp_path)
    value = b"v" * MiB
    with connect(server) as s:
        s.sendall(cmd(b"AUTH", TOKEN) + cmd(b"SET", b"k", value) + cmd(b"GET", b"k"))
        assert recv_line(s) == b"+OK\r\n"
        assert recv_line(s) == b"+OK\r\n"
        assert recv_line(s) == b"$%d\r\n" % len(value)
        got = b""
        while len(got) < len(value) + 2:
            got += s.recv(len(value) + 2 - len(got))
        assert got == value + b"\r\n"


# -- F3: replies to a client that does not read -----------------------------------------------------
def non_reading_client(server: KVServerProcess) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(20)
    s.connect(("127.0.0.1", server.port))
    return s


def disconnections(server: KVServerProcess, reason: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{server.metrics_url}/metrics", timeout=10) as r:
        body = r.read().decode()
    prefix = f'strata_kv_client_disconnections_total{{reason="{reason}"}} '
    return next((float(line[len(prefix) :]) for line in body.splitlines() if line.startswith(prefix)), 0.0)


def test_a_client_that_does_not_read_holds_about_one_value(kv_server_factory) -> None:
    """MGET repeating one 8 MiB key 100 times, three times over: 2.4 GB of replies nobody reads."""
    server = kv_server_factory({"metrics": {"port": -1}}, l2_fs=False)
    server.redis().set("big", b"v" * 8 * MiB)
    base = rss_after_sync(server)
    s = non_reading_client(server)
    for _ in range(3):
        s.sendall(cmd(b"MGET", *[b"big"] * 100))
    held = rss_after_sync(server)
    assert held - base < 64 * MiB, f"{(held - base) // MiB} MiB held for a client that does not read"
    s.close()


def test_a_reply_past_the_output_limit_closes_the_connection(kv_server_factory) -> None:
    server = kv_server_factory({"limits": {"max_output_buffer": "40MiB", "max_value_size": "16MiB"}}, l2_fs=False)
    r = server.redis()
    r.set("big", b"v" * 8 * MiB)
    assert r.mget(["big"] * 4) == [b"v" * 8 * MiB] * 4  # 32 MiB: within the limit, streamed whole
    s = non_reading_client(server)
    s.sendall(cmd(b"MGET", *[b"big"] * 6))  # 48 MiB
    assert closed_by_server(s)
    s.close()
    assert disconnections(server, "output_buffer_limit") == 1
    assert r.get("big") == b"v" * 8 * MiB  # other clients carry on
    info = r.info("stats")
    assert info["client_output_buffer_limit_disconnections"] == 1


# -- F4: connection slots and timeouts --------------------------------------------------------------
def authenticated_ping(server: KVServerProcess) -> bytes:
    with connect(server) as s:
        s.sendall(cmd(b"AUTH", TOKEN) + cmd(b"PING"))
        return recv_line(s) + recv_line(s)


def test_silent_sockets_cannot_lock_out_a_client_that_authenticates(kv_server_factory, tmp_path) -> None:
    server = auth_server(kv_server_factory, tmp_path, {"limits": {"max_clients": 50}})
    silent = [connect(server) for _ in range(50)]
    assert authenticated_ping(server) == b"+OK\r\n+PONG\r\n"
    assert sum(closed_by_server(s) for s in silent[:1]) == 1  # the oldest made room
    for s in silent:
        s.close()


def test_unauthenticated_connections_use_at_most_their_share(kv_server_factory, tmp_path) -> None:
    config = {"limits": {"max_unauthenticated_clients": 5}, "metrics": {"port": 0, "bind": "127.0.0.1"}}
    server = auth_server(kv_server_factory, tmp_path, config)
    silent = [connect(server) for _ in range(20)]
    assert authenticated_ping(server) == b"+OK\r\n+PONG\r\n"
    for s in silent[:15]:
        assert closed_by_server(s)
    assert disconnections(server, "unauthenticated_evicted") == 16  # 15 silent + the pinging one's turn
    for s in silent:
        s.close()


def test_connections_that_do_not_authenticate_in_time_are_closed(kv_server_factory, tmp_path) -> None:
    config = {"limits": {"auth_timeout_seconds": 1}, "metrics": {"port": 0, "bind": "127.0.0.1"}}
    server = auth_server(kv_server_factory, tmp_path, config)
    silent, trickle, client = connect(server), connect(server), connect(server)
    client.sendall(cmd(b"AUTH", TOKEN))
    assert recv_line(client) == b"+OK\r\n"
    request = cmd(b"AUTH", TOKEN)
    trickle.settimeout(0.2)
    closed = False
    for i in range(100):  # one byte every 0.2 s: it would take 9 s to finish its AUTH
        try:
            trickle.send(request[i : i + 1])
            closed = trickle.recv(1) == b""
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        if closed:
            break
    assert closed, "a client trickling its AUTH kept its slot"
    assert closed_by_server(silent)
    client.sendall(cmd(b"PING"))
    assert recv_line(client) == b"+PONG\r\n"  # authenticated in time: kept
    assert disconnections(server, "auth_timeout") == 2
    for s in (silent, trickle, client):
        s.close()


def test_idle_connections_are_closed_and_busy_ones_kept(kv_server_factory, tmp_path) -> None:
    """The real reaper closes a connection idle past `idle_timeout_seconds` and, in the same sweep, keeps one
    whose command is still running though it sent nothing for longer. The running command is a pipeline of
    failed AUTHs (each held up to 5 s, 40 s in all): the idle connection can only be reaped once the busy one has
    been silent longer than it, so neither verdict depends on how fast this test runs (a stall under 40 s
    changes nothing). That each request restarts the clock is `expired(now)`'s unit test (test_connection)."""
    config = {
        "limits": {"idle_timeout_seconds": 0.5},
        "auth": {"failure_delay_seconds": 5.0, "max_failures": 10},
        "metrics": {"port": 0, "bind": "127.0.0.1"},
    }
    server = auth_server(kv_server_factory, tmp_path, config)
    with connect(server) as busy, connect(server, timeout=60) as idle:
        busy.sendall(cmd(b"AUTH", TOKEN))
        assert recv_line(busy) == b"+OK\r\n"
        busy.sendall(cmd(b"AUTH", b"wrong") * 8)  # running from now on, answered one by one, 5 s apart
        idle.sendall(cmd(b"AUTH", TOKEN) + cmd(b"PING"))  # after busy's last request
        assert recv_line(idle) + recv_line(idle) == b"+OK\r\n+PONG\r\n"
        assert closed_by_server(idle)  # waits for the reaper (up to the socket's 60 s: a hang bound only)
        assert authenticated_ping(server) == b"+OK\r\n+PONG\r\n"  # the loop went past that sweep
        assert disconnections(server, "idle_timeout") == 1
        busy.setblocking(False)
        try:
            answered = busy.recv(1 << 16)  # the failed AUTHs answered so far; b"" is the server's close
        except BlockingIOError:
            answered = None  # none answered yet, and still open
        assert answered != b"", "the server closed the connection whose command was running"
        assert answered is None or answered.startswith(b"-WRONGPASS")


# -- F10: guessing the token ------------------------------------------------------------------------
def test_failed_auth_is_slowed_down_and_ends_the_connection(kv_server_factory, tmp_path) -> None:
    config = {"auth": {"failure_delay_seconds": 0.2, "max_failures": 3}, "metrics": {"port": 0, "bind": "127.0.0.1"}}
    server = auth_server(kv_server_factory, tmp_path, config)
    with connect(server) as s:
        started = time.monotonic()
        for _ in range(2):
            s.sendall(cmd(b"AUTH", b"wrong"))
            assert recv_line(s).startswith(b"-WRONGPASS")
        s.sendall(cmd(b"AUTH", b"wrong"))  # the third: answered after 0.8 s, then the connection closes
        assert recv_line(s).startswith(b"-WRONGPASS")
        assert time.monotonic() - started >= 0.2 + 0.4 + 0.8
        assert closed_by_server(s)
    assert disconnections(server, "auth_failures") == 1


def test_a_delayed_auth_failure_holds_only_its_own_connection(kv_server_factory, tmp_path) -> None:
    """While one connection's failed AUTH waits out its delay (5 s, the most there is), another client is
    served: its PING comes back before that reply. 5 s bounds a hang of a loopback PING, nothing closer."""
    config = {"auth": {"failure_delay_seconds": 5.0}}
    server = auth_server(kv_server_factory, tmp_path, config)
    with connect(server) as s:
        s.sendall(cmd(b"AUTH", b"wrong"))
        assert authenticated_ping(server) == b"+OK\r\n+PONG\r\n"
        assert not select.select([s], [], [], 0)[0], "the failed AUTH held the other client up"
        assert recv_line(s).startswith(b"-WRONGPASS")


@pytest.mark.parametrize(("token", "warned"), [(b"s3cret", True), (TOKEN, False)])
def test_a_short_token_is_warned_about(kv_server_factory, tmp_path, token: bytes, warned: bool) -> None:
    server = auth_server(kv_server_factory, tmp_path, token=token)
    assert ("shorter than 16" in server.log()) is warned
