"""`listen.sender_threads`: a reply holding a value above 1 MiB, while another such reply is going out, is sent from
a thread. Byte-exact and in order among the replies around it, on both event loops and both sockets; one large
reply alone stays on the loop; a client that stops reading holds no thread; a client gone in the middle of a reply
gives its connection and descriptors back.

Each test keeps one large reply going out to a client that does not read (`_stalled`), so that the next ones take
the threads. The count of replies sent from threads is read on the connection that received them, after them: a
connection's next command runs only once its previous reply is counted, while another connection's may be answered
between a thread's last byte and the count (which is what made these counts flaky)."""

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import redis
from strata_kv.server.cpus import usable_cpus
from strata_kv.server.senders import LOWEST_NICE, SENDER_NICE

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
SIZES = [MiB + 1, 4 * MiB, 4 * MiB + 1, 9 * MiB + 3]  # around one slice and one sender job (4 MiB)
BIG = 64 * MiB


def _server(factory, threads: int = 2, event_loop: str = "auto"):
    cfg = {"l1": {"size": "512MiB"}, "listen": {"sender_threads": threads, "event_loop": event_loop}}
    server = factory(cfg, l2_fs=False)
    server.redis().set("stall", os.urandom(BIG))
    return server


def _get(s: socket.socket, key: str) -> None:
    s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key.encode()))


def _read_exactly(s: socket.socket, n: int, pause: float = 0.0, step: int = 256 * 1024) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(min(step, n - len(out)))
        assert chunk, f"connection closed after {len(out)} of {n} bytes"
        out += chunk
        if pause:
            time.sleep(pause)
    return bytes(out)


def _bulk_reply(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


@contextmanager
def _stalled(server, key: str = "stall", size: int = BIG) -> Iterator[tuple[socket.socket, bytes]]:
    """A client that GETs `key` (of `size` bytes) and reads only the first 64 KiB (yielded with it): its reply
    stays going out."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        _get(s, key)
        head = _read_exactly(s, 64 * 1024)
        assert head.startswith(b"$%d\r\n" % size)
        yield s, head
    finally:
        s.close()


def _sender_replies(r: redis.Redis) -> int:
    """The server's count of replies sent from threads, asked on `r`'s connection (see the module's docstring)."""
    return int(json.loads(r.execute_command("STRATA.STATS"))["sender_replies"])


def _stats_on(s: socket.socket) -> dict:
    """STRATA.STATS on a raw connection, after the replies it has read (see the module's docstring)."""
    s.sendall(b"*1\r\n$12\r\nSTRATA.STATS\r\n")
    header = b""
    while not header.endswith(b"\r\n"):
        header += _read_exactly(s, 1)
    assert header.startswith(b"$"), header
    return dict(json.loads(_read_exactly(s, int(header[1:-2]) + 2)[:-2]))


def _one_connection(server, **kwargs) -> redis.Redis:
    return server.redis(single_connection_client=True, **kwargs)


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_large_replies_are_byte_exact_and_in_order_among_small_ones(kv_server_factory, event_loop, transport) -> None:
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")
    server = _server(kv_server_factory, event_loop=event_loop)
    unix = redis.Redis(unix_socket_path=server.unix_socket, socket_timeout=30, single_connection_client=True)
    r = _one_connection(server) if transport == "tcp" else unix
    values = [os.urandom(size) for size in SIZES]
    for i, value in enumerate(values):
        r.set(f"big{i}", value)
    assert r.get("big1") == values[1]
    assert _sender_replies(r) == 0, "one large reply alone is the loop's"
    small = {f"s{i}": os.urandom(100) for i in range(600)}
    r.mset(small)
    with _stalled(server):
        pipe = r.pipeline(transaction=False)  # one read of requests, one stream of replies: any overtaking shows
        pipe.get("s0").get("big0").get("s1").get("big1").get("big2")
        pipe.mget([*small, "big3"])  # 602 parts in one reply, more than one sendmsg takes
        pipe.get("big3").ping().execute_command("STRATA.STATS")  # the count, after the replies it counts
        got = pipe.execute()
        assert got[:5] == [small["s0"], values[0], small["s1"], values[1], values[2]]
        assert got[5] == [*small.values(), values[3]]
        assert got[6:8] == [values[3], True]
        assert json.loads(got[8])["sender_replies"] == 5


def test_with_no_sender_threads_the_loop_sends_every_large_reply(kv_server_factory) -> None:
    server = _server(kv_server_factory, threads=0)
    r = _one_connection(server)
    values = [os.urandom(size) for size in SIZES]
    for i, value in enumerate(values):
        r.set(f"big{i}", value)
    with _stalled(server):
        assert r.mget([f"big{i}" for i in range(len(values))]) == values
    assert _sender_replies(r) == 0


def _nice(pid: int, tid: int) -> int:
    """A thread's nice value, from /proc (field 19 of its stat, after the command name in parentheses)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_sender_threads_run_below_the_loops_priority(kv_server_factory) -> None:
    """Where cores are short the loop, which answers every other connection, runs first: the threads that sent
    large replies run at a higher nice value than the loop's thread, which keeps the process's own. Relative to the
    nice value the server started with (the test's own, whatever the machine runs it at), never an absolute one."""
    started_at = os.getpriority(os.PRIO_PROCESS, 0)
    server = _server(kv_server_factory, threads=2)
    assert server.process is not None
    pid = server.process.pid
    r = _one_connection(server)
    value = os.urandom(4 * MiB)
    r.set("big", value)
    before = {t.id for t in psutil.Process(pid).threads()}
    with _stalled(server):
        for _ in range(3):
            assert r.get("big") == value
        assert _sender_replies(r) == 3, "every reply while the stalled one went out was sent from a thread"
    senders = {t.id for t in psutil.Process(pid).threads()} - before
    assert senders, "the replies were sent from threads started for them"
    assert _nice(pid, pid) == started_at
    assert {_nice(pid, tid) for tid in senders} == {min(LOWEST_NICE, started_at + SENDER_NICE)}


def test_more_threads_than_the_servers_cpus_are_warned_about(kv_server_factory) -> None:
    """Threads beyond the CPUs the server may use share cores with its loop: said at start, with what to change."""
    cpus = usable_cpus()
    crowded = _server(kv_server_factory, threads=cpus)
    assert f"listen.sender_threads is {cpus} but this server may use {cpus} CPUs" in crowded.log()
    if cpus > 1:
        fitting = _server(kv_server_factory, threads=cpus - 1)
        assert "listen.sender_threads" not in fitting.log()


def test_a_client_that_stops_reading_holds_no_sender_thread(kv_server_factory) -> None:
    """With one sender thread, a client that stops reading a 32 MiB reply sent from it does not hold up the next
    large replies: a full socket is waited for on the loop, not on the thread. It then gets every byte."""
    server = _server(kv_server_factory, threads=1)
    r = _one_connection(server)
    slow_value, value = os.urandom(32 * MiB), os.urandom(8 * MiB)
    r.set("slow", slow_value)
    r.set("fast", value)
    with _stalled(server), _stalled(server, "slow", len(slow_value)) as (slow, head):
        before = _sender_replies(r)
        for _ in range(10):
            assert r.get("fast") == value
            assert r.ping()
        assert _sender_replies(r) == before + 10
        rest = _read_exactly(slow, len(_bulk_reply(slow_value)) - len(head), pause=0.0005)
        assert head + rest == _bulk_reply(slow_value)
        assert _stats_on(slow)["sender_replies"] == before + 11, "the slow reply, too, went from a thread"


def test_a_client_gone_mid_reply_gives_its_connection_back(kv_server_factory) -> None:
    server = _server(kv_server_factory)
    assert server.process is not None
    proc = psutil.Process(server.process.pid)
    r = server.redis()
    value = r.get("stall")
    with _stalled(server):
        r.ping()
        fds, clients = proc.num_fds(), len(r.client_list())
        for abrupt, whole in ((True, False), (False, False), (False, True)):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            _get(s, "stall")
            if whole:  # the reply went out whole; the connection closes idle
                assert _read_exactly(s, len(_bulk_reply(value)), step=4 * MiB) == _bulk_reply(value)
            else:
                _read_exactly(s, MiB)
            if abrupt:  # a reset (SO_LINGER 0), as from a killed client
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
        deadline = time.monotonic() + 30
        while (proc.num_fds(), len(r.client_list())) != (fds, clients) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (proc.num_fds(), len(r.client_list())) == (fds, clients), "a connection or descriptor was left"
        assert r.get("stall") == value
