"""`listen.shared_memory`: large values handed to Unix-socket clients as sealed memfds (`STRATA.GETFD`),
against real server processes on both event loops: the same bytes as a TCP GET, memory no holder can
write, bytes that never change under a client while L1 evicts and recycles, a plain bulk reply
wherever memory cannot go (small values, misses, output queued ahead of it), and clients that keep every
memfd they are handed holding no more than the budgets."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import socket
import time
import urllib.request

import pytest
from strata_kv.client import KVClient, KVError
from strata_kv.wire.shared_memory import GETFD, SPLIT_COPY_FROM, SharedValueError
from strata_testsupport.kube import wait_for

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _value(tag: int, size: int) -> bytes:
    return bytes([tag]) * 7 + os.urandom(4096) * (size // 4096 - 1) + bytes([tag]) * 4089


def _shared_server(kv_server_factory, event_loop: str = "asyncio", l1: str = "256MiB", name: str = ""):
    config = {"l1": {"size": l1}, "listen": {"event_loop": event_loop, "shared_memory": True}}
    return kv_server_factory(config, l2_fs=False, name=name)


def _raw_getfd(path: str, key: bytes) -> tuple[bytes, list[int]]:
    """The reply line of STRATA.GETFD and the descriptors that came with it, read by hand."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(b"*2\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(GETFD), GETFD, len(key), key))
        data, fds, _flags, _addr = socket.recv_fds(s, 64, 1)
        return data, fds


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_a_large_value_comes_as_memory_with_the_bytes_a_tcp_get_returns(kv_server_factory, event_loop) -> None:
    server = _shared_server(kv_server_factory, event_loop, name=f"shared-{event_loop}")
    tcp = server.redis()
    big, small = _value(1, 16 * MiB), os.urandom(100 * 1024)
    tcp.set("big", big)
    with KVClient(unix_socket=server.unix_socket) as local:
        local.set("small", small)
        view = local.get_shared(b"big")
        assert isinstance(view, memoryview) and view.readonly, "a large value is handed over as mapped memory"
        assert view == big == tcp.get("big")
        view.release()
        assert local.get_shared(b"small") == small, "a small value comes inline"
        assert local.get_shared(b"missing") is None
        assert local.get(b"big") == big, "the connection stays in step after a shared reply"
        into = memoryview(bytearray(len(big)))
        assert local.get_shared_into(b"big", into) and into == big, "one copy into the caller's buffer"
        small_into = memoryview(bytearray(len(small)))
        assert local.get_shared_into(b"small", small_into) and small_into == small
        assert not local.get_shared_into(b"missing", small_into)
        with pytest.raises(SharedValueError, match="buffer of 10"):
            local.get_shared_into(b"big", memoryview(bytearray(10)))
        assert local.stats()["shared_replies"] == 3


def test_aligned_and_unaligned_buffers_get_the_same_bytes_by_either_copy(kv_server_factory) -> None:
    """`copy_from_memfd` reads an aligned buffer with preadv and an unaligned one through a mapping; both must give
    exactly the value, and a read-only buffer is refused before anything is asked."""
    server = _shared_server(kv_server_factory, name="shared-aligned")
    big = _value(3, 8 * MiB)
    with KVClient(unix_socket=server.unix_socket) as local:
        local.set("big", big)
        arena = mmap.mmap(-1, len(big) + 4096)
        for offset in (0, 64, 16, 1):  # page- and 64-aligned: preadv; 16 and 1 bytes off: the mapping
            into = memoryview(arena)[offset : offset + len(big)]
            into[:] = b"\0" * len(big)
            assert local.get_shared_into(b"big", into) and into == big, f"buffer {offset} bytes past a page"
            into.release()
        with pytest.raises(TypeError, match="writable"):
            local.get_shared_into(b"big", memoryview(big))
        assert local.get(b"big") == big, "the connection stays in step"
        arena.close()


@pytest.mark.parametrize("size", [SPLIT_COPY_FROM, 9 * MiB + 7, 33 * MiB - 4096], ids=["even", "ragged", "pages"])
def test_a_large_copy_split_over_threads_puts_every_piece_in_its_place(kv_server_factory, size: int) -> None:
    """From `SPLIT_COPY_FROM` on, pieces are copied on several threads: random bytes throughout (a value made of
    one repeated block would hide a piece copied to the wrong place), sizes that do not split evenly."""
    server = _shared_server(kv_server_factory, name=f"shared-split-{size}")
    value = os.urandom(size)
    with KVClient(unix_socket=server.unix_socket) as local:
        local.set("big", value)
        into = memoryview(mmap.mmap(-1, size))
        assert local.get_shared_into(b"big", into) and into == value
        assert local.stats()["shared_replies"] == 1


def test_a_forked_child_copies_with_threads_of_its_own(kv_server_factory) -> None:
    """The copy threads are made once per process; a child forked after the parent made them has none of them
    and must make its own, not wait forever on the parent's."""
    server = _shared_server(kv_server_factory, name="shared-fork")
    value = os.urandom(SPLIT_COPY_FROM)
    with KVClient(unix_socket=server.unix_socket) as local:
        local.set("big", value)
        into = memoryview(mmap.mmap(-1, len(value)))
        assert local.get_shared_into(b"big", into) and into == value  # the parent's threads exist now
    child = os.fork()
    if child == 0:
        ok = False
        try:
            with KVClient(unix_socket=server.unix_socket) as local:
                mine = memoryview(mmap.mmap(-1, len(value)))
                ok = local.get_shared_into(b"big", mine) and mine == value
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child's copy hung: it waited on threads it does not have")
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the child's copy gave other bytes"


def test_get_into_on_the_unix_socket_takes_the_memory_where_the_server_offers_it(kv_server_factory) -> None:
    """What the vLLM tier's loads call: memory from a server that offers it, plain GET (after one refusal) from
    one that does not; a value of the wrong size stays a KVError on a connection still in step."""
    big = _value(5, 4 * MiB)
    offering = _shared_server(kv_server_factory, name="shared-get-into")
    plain = kv_server_factory({"l1": {"size": "64MiB"}}, l2_fs=False, name="plain-get-into")
    for server, handed_over in ((offering, 1), (plain, 0)):
        with KVClient(unix_socket=server.unix_socket) as local:
            local.set("big", big)
            into = memoryview(mmap.mmap(-1, len(big)))
            for _ in range(2):
                into[:] = b"\0" * len(big)
                assert local.get_into(b"big", into) and into == big
            assert not local.get_into(b"missing", into)
            with pytest.raises(KVError, match=r"buffer of 10|buffer for it 10"):
                local.get_into(b"big", memoryview(bytearray(10)))
            assert local.get(b"big") == big, "the connection stays in step"
            shared = local.stats().get("shared_replies", 0)
            assert shared == 3 * handed_over, f"{shared} values handed over (two GETs, one refused size)"


def test_handed_over_memory_cannot_be_written_resized_or_reopened_writable(kv_server_factory) -> None:
    server = _shared_server(kv_server_factory)
    value = _value(2, 4 * MiB)
    server.redis().set("k", value)
    header, fds = _raw_getfd(server.unix_socket, b"k")
    assert header == b":%d\r\n" % len(value) and len(fds) == 1, header
    (fd,) = fds
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(fd, len(value))  # a shared writable mapping
        # Handed over read-only (EBADF, EINVAL), and sealed besides (EPERM).
        with pytest.raises(OSError) as write:
            os.pwrite(fd, b"poison", 0)
        with pytest.raises(OSError) as shrink:
            os.ftruncate(fd, 1)
        refused = {errno.EBADF, errno.EINVAL, errno.EPERM}
        assert write.value.errno in refused and shrink.value.errno in refused, (write.value, shrink.value)
        reopened = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                mmap.mmap(reopened, len(value))
        finally:
            os.close(reopened)
        readonly = mmap.mmap(fd, len(value), prot=mmap.PROT_READ)
        assert readonly[:] == value
        readonly.close()
    finally:
        os.close(fd)
    assert server.redis().get("k") == value


def test_bytes_a_client_holds_never_change_while_l1_overwrites_evicts_and_recycles(kv_server_factory) -> None:
    """A 32 MiB L1 taking 4 MiB values: the held key is overwritten, then evicted, and its size class recycled
    for dozens of newer values; the memory handed out keeps the first bytes throughout."""
    server = _shared_server(kv_server_factory, l1="32MiB", name="recycling")
    tcp = server.redis()
    first = _value(3, 4 * MiB)
    tcp.set("held", first)
    with KVClient(unix_socket=server.unix_socket) as local:
        view = local.get_shared(b"held")
        assert isinstance(view, memoryview)
        assert local.ping()  # the server's last reply on this connection no longer refers to the value
        tcp.set("held", _value(4, 4 * MiB))
        for i in range(40):
            tcp.set(f"churn-{i}", _value(5 + i, 4 * MiB))
        stats = local.stats()
        assert stats["value_pool_reused"] > 0, f"the pool recycled mappings meanwhile: {stats}"
        assert view == first, "memory a client was given changed under it"
        assert tcp.get("held") != first


def test_output_queued_ahead_makes_the_value_come_inline_in_order(kv_server_factory) -> None:
    """GET and GETFD pipelined without reading: the GET's reply fills the socket, so the memfd cannot go out
    ahead of it; the GETFD's answer comes as bytes, after the GET's."""
    server = _shared_server(kv_server_factory)
    value = _value(9, 8 * MiB)
    server.redis().set("k", value)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(server.unix_socket)
        s.sendall(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n" + b"*2\r\n$%d\r\n%b\r\n$1\r\nk\r\n" % (len(GETFD), GETFD))
        expected = (b"$%d\r\n" % len(value) + value + b"\r\n") * 2
        received, fds = bytearray(), []
        while len(received) < len(expected):
            chunk, got, _flags, _addr = socket.recv_fds(s, 4 * MiB, 1)
            assert chunk, "server closed the connection"
            received += chunk
            fds += got
        assert not fds and bytes(received) == expected


def test_memory_goes_only_to_the_unix_socket_of_a_server_that_allows_it(kv_server_factory) -> None:
    shared = _shared_server(kv_server_factory, name="on")
    shared.redis().set("k", _value(1, 2 * MiB))
    with pytest.raises(Exception, match="only on the Unix socket"):
        shared.redis().execute_command("STRATA.GETFD", "k")
    plain = kv_server_factory({"l1": {"size": "64MiB"}}, l2_fs=False, name="off")
    plain.redis().set("k", b"v")
    with KVClient(unix_socket=plain.unix_socket) as local, pytest.raises(KVError, match=r"listen\.shared_memory"):
        local.call("STRATA.GETFD", "k")


def _metric(server, name: str, labels: str = "") -> float:
    """One sample of the server's /metrics."""
    with urllib.request.urlopen(f"{server.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    wanted = f"{name}{{{labels}}} " if labels else f"{name} "
    (line,) = [x for x in text.splitlines() if x.startswith(wanted)]
    return float(line.split()[-1])


class _Hoarder:
    """A client that keeps every memfd it is handed (one connection), and what those keep alive."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.fds: list[int] = []
        self.inline = 0

    def getfd(self, key: bytes, size: int) -> None:
        self.sock.sendall(b"*2\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(GETFD), GETFD, len(key), key))
        data, fds, _flags, _addr = socket.recv_fds(self.sock, 64, 1)
        if data.startswith(b":"):
            assert len(fds) == 1, data
            self.fds += fds
            return
        assert data.startswith(b"$%d\r\n" % size) and not fds, data[:32]  # the value's bytes, inline
        self.inline += 1
        have = len(data) - len(b"$%d\r\n" % size)
        while have < size + 2:
            have += len(self.sock.recv(size + 2 - have))

    def held_bytes(self) -> int:
        """Bytes of memory the descriptors it keeps hold alive (each memfd once)."""
        seen = {os.fstat(fd).st_ino: os.fstat(fd).st_blocks * 512 for fd in self.fds}
        return sum(seen.values())

    def close_connection(self) -> None:
        self.sock.close()

    def let_go(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def test_a_client_that_keeps_every_memfd_holds_no_more_than_the_budgets(kv_server_factory) -> None:
    """L1 of 64 MiB, values of 4 MiB: clients that keep every memfd they are handed, SET and DEL around them, and
    reconnect to be counted afresh. What they hold stays within the budgets (16 MiB a connection, 48 MiB in
    all), the rest comes as bytes, the server's count says so, and once they let go it hands memory over again."""
    config = {
        "l1": {"size": "64MiB"},
        "listen": {
            "event_loop": "asyncio",
            "shared_memory": True,
            "shared_memory_budget": "48MiB",
            "shared_memory_client_budget": "16MiB",
        },
    }
    server = kv_server_factory(config, l2_fs=False, name="hoarded")
    tcp, size = server.redis(), 4 * MiB
    hoarders = []
    for round_ in range(5):  # each round a new connection: reconnecting wins a client budget, not the server's
        hoarder = _Hoarder(server.unix_socket)
        for i in range(20):
            key = f"v-{round_}-{i}"
            tcp.set(key, _value(i % 250, size))
            hoarder.getfd(key.encode(), size)
            tcp.delete(key)
        hoarder.close_connection()
        hoarders.append(hoarder)
        assert hoarder.held_bytes() <= 16 * MiB, "one connection holds no more than its budget"
    held = sum(h.held_bytes() for h in hoarders)
    assert held <= 48 * MiB, f"clients hold {held / MiB:.0f} MiB, past the server's budget"
    assert held == 48 * MiB, "memory went out up to the budget"
    assert sum(h.inline for h in hoarders) == 100 - 12, "the rest came as bytes"
    assert _metric(server, "strata_kv_shared_memory_bytes") == 48 * MiB
    assert _metric(server, "strata_kv_shared_memory_over_budget_total", 'scope="server"') > 0
    assert _metric(server, "strata_kv_shared_memory_over_budget_total", 'scope="client"') > 0

    mapped = mmap.mmap(hoarders[0].fds[0], size, prot=mmap.PROT_READ)
    for h in hoarders:
        h.let_go()  # the mapping alone still holds its value
    wait_for(
        lambda: _metric(server, "strata_kv_shared_memory_bytes") == size,
        timeout=10,
        what="the values nobody holds to stop counting",
    )
    mapped.close()
    wait_for(lambda: _metric(server, "strata_kv_shared_memory_bytes") == 0, timeout=10, what="the last one too")
    tcp.set("after", _value(1, size))
    with KVClient(unix_socket=server.unix_socket) as local:
        assert isinstance(local.get_shared(b"after"), memoryview), "memory is handed over again"


def test_a_client_of_another_user_cannot_reopen_what_it_was_handed(kv_server_factory) -> None:
    """Reopening through /proc would give a client an open file the server's count cannot see; a client of
    another uid than the server's is refused (the memfd's mode is 0400), so it keeps only what it was handed."""
    server = _shared_server(kv_server_factory, name="reopen")
    server.redis().set("k", _value(2, 2 * MiB))
    _, (fd,) = _raw_getfd(server.unix_socket, b"k")
    pid = os.fork()
    if pid == 0:  # the child: a client pod's user
        code = 1
        try:
            os.setgid(65532)
            os.setuid(65532)
            try:
                os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY))
            except PermissionError:
                code = 0
        finally:
            os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "another user reopened a handed-over memfd"
    finally:
        os.close(fd)
