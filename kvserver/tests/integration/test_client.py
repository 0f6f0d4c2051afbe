"""The bundled Python clients (sync and asyncio) against a real server, over TCP and the Unix socket."""

import asyncio
import socket

import pytest
from strata_kv.client import AsyncKVClient, KVClient, KVError
from strata_testsupport.kvserver import KVServerProcess, RedisServer

pytestmark = pytest.mark.integration


def test_sync_client_round_trip_over_the_unix_socket(kv_server: KVServerProcess) -> None:
    with KVClient(unix_socket=kv_server.unix_socket) as c:
        assert c.ping()
        c.set(b"\x00bin\xffkey", b"\x00" * 100_000)
        assert c.get(b"\x00bin\xffkey") == b"\x00" * 100_000
        assert c.exists(b"\x00bin\xffkey", "nope") == 1
        assert c.delete(b"\x00bin\xffkey") == 1
        assert c.get(b"\x00bin\xffkey") is None
        with pytest.raises(KVError, match="unknown command"):
            c.call("NOPE")
        assert c.ping()  # still in step after an error reply


async def test_async_client_concurrent_calls_share_one_connection(kv_server: KVServerProcess) -> None:
    c = await AsyncKVClient.connect("127.0.0.1", kv_server.port)
    try:
        values = {f"async:{i}": bytes([i]) * (i * 1000 + 1) for i in range(20)}
        await asyncio.gather(*(c.set(k, v) for k, v in values.items()))
        got = await asyncio.gather(*(c.get(k) for k in values))
        assert got == list(values.values())
        assert await c.exists(*values) == 20
        assert await c.prefix(list(values)[:3]) == ["l1", "l1", "l1"]
        assert (await c.stats())["l1_keys"] >= 20
        assert await c.delete(*values) == 20
    finally:
        await c.close()


def _wmem_max() -> int:
    with open("/proc/sys/net/core/wmem_max") as f:
        return int(f.read())


@pytest.mark.skipif(_wmem_max() < 2 * 1024 * 1024, reason="net.core.wmem_max caps a socket's send buffer below 2 MiB")
def test_over_the_unix_socket_a_1_mib_reply_fits_the_servers_send_buffer_whole(kv_server: KVServerProcess) -> None:
    """The server widens a Unix connection's send buffer, so a chunk goes out in one write instead of waiting for
    the client to drain the default 208 KiB several times (each a hand-over between processes)."""
    import fcntl
    import socket
    import termios
    import time

    value = bytes(range(256)) * 4096  # 1 MiB
    with KVClient(unix_socket=kv_server.unix_socket) as c:
        c.set(b"chunk", value)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(kv_server.unix_socket)
        sock.sendall(b"*2\r\n$3\r\nGET\r\n$5\r\nchunk\r\n")
        queued, deadline = 0, time.monotonic() + 10
        while queued < len(value) and time.monotonic() < deadline:  # the server writes what its buffer takes
            time.sleep(0.01)
            queued = int.from_bytes(fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"), "little")
        assert queued >= len(value), f"only {queued} bytes of a {len(value)}-byte reply were sent unread"


def test_a_client_on_the_unix_socket_asks_for_a_send_buffer_a_chunk_fits(kv_server: KVServerProcess) -> None:
    import socket

    from strata_kv.wire.sockets import UNIX_SEND_BUFFER

    with KVClient(unix_socket=kv_server.unix_socket) as c:
        granted = c._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)  # the kernel doubles what it grants
    assert granted >= 2 * min(UNIX_SEND_BUFFER, _wmem_max())


class _CountingSocket:
    """The client's socket, counting the calls that move bytes (each a return to Python and to the GIL)."""

    def __init__(self, sock: object) -> None:
        self._sock = sock
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._sock, name)
        if name in ("send", "sendall", "sendmsg", "recv", "recv_into", "recvmsg", "recvmsg_into"):

            def counted(*args: object) -> object:
                self.calls.append(name)
                return attr(*args)

            return counted
        return attr


STOCK_SEND_BUFFER = 212992
"""Linux's default net.core.wmem_max: what an unprivileged process on a stock node gets for SO_SNDBUF at most."""


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_chunk_far_larger_than_the_send_buffer_takes_one_send_and_one_waiting_receive(
    kv_server: KVServerProcess, transport: str
) -> None:
    """A chunk moves in a fixed number of calls, whatever the socket buffers: a Unix socket's in-flight bytes are
    its sender's SO_SNDBUF, capped at 416 KiB on a stock node, where Python's socket timeouts turned an 8 MiB
    chunk into 20 sends and 21 polls (and a GET's bulk into 21 receives), each one a wait for the GIL in an engine."""
    import socket

    value = bytes(range(256)) * (32 * 1024)  # 8 MiB
    key = b"many-buffers-" + transport.encode()
    unix = kv_server.unix_socket if transport == "unix" else None
    with KVClient("127.0.0.1", kv_server.port, unix_socket=unix, timeout=30) as c:
        c._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STOCK_SEND_BUFFER)
        c.get_into(b"absent", memoryview(bytearray(1)))  # the Unix side learns here that GETFD is off
        counting = _CountingSocket(c._sock)
        c._sock = counting  # type: ignore[assignment]
        c.set_from(key, memoryview(value))
        assert counting.calls.count("sendmsg") == 1, counting.calls
        counting.calls.clear()
        into = bytearray(len(value))
        assert c.get_into(key, memoryview(into))
        assert into == value
        # the reply's header (with what came along), the rest of the bulk, its CRLF
        assert counting.calls.count("recv_into") <= 3, counting.calls


def _plain_client(kv_server: KVServerProcess, transport: str, timeout: float = 30) -> KVClient:
    """A client whose GETs come through the socket: the Unix side learns with its first GET that this server
    hands no memory over (no listen.shared_memory)."""
    unix = kv_server.unix_socket if transport == "unix" else None
    client = KVClient("127.0.0.1", kv_server.port, unix_socket=unix, timeout=timeout)
    client.get_into(b"absent", memoryview(bytearray(1)))
    return client


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_load_job_takes_one_send_and_two_receives_however_many_chunks(
    kv_server: KVServerProcess, transport: str
) -> None:
    """`get_many_into`, the tier's load job: each return from the kernel waits for the GIL in an engine, and one
    GET at a time took four per chunk (send, header, bulk, CRLF)."""
    chunks = [bytes([i]) * (256 * 1024) for i in range(16)]
    keys = [b"many-%s-%d" % (transport.encode(), i) for i in range(len(chunks))]
    with _plain_client(kv_server, transport) as c:
        for key, chunk in zip(keys, chunks, strict=True):
            c.set(key, chunk)
        counting = _CountingSocket(c._sock)
        c._sock = counting  # type: ignore[assignment]
        into = [bytearray(len(chunk)) for chunk in chunks]
        found, error = c.get_many_into(keys, [memoryview(b) for b in into])
        assert (found, error) == ([True] * len(chunks), None)
        assert into == chunks
        # one send; the reply's header with what came along, then the rest in one waiting receive
        assert counting.calls == ["sendall", "recv_into", "recvmsg_into"], counting.calls
        assert c.ping()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_load_job_says_what_each_key_found_and_stays_in_step(kv_server: KVServerProcess, transport: str) -> None:
    """Hits, misses (the last key too) and a value of another size than the buffers, in one job: each key's
    outcome, the first error, the hits' bytes, and the connection usable afterwards."""
    value, longer = bytes(range(256)) * 256, bytes(range(256)) * 257
    prefix = b"each-key-" + transport.encode()
    with _plain_client(kv_server, transport, timeout=10) as c:
        c.set(prefix + b"/a", value)
        c.set(prefix + b"/longer", longer)
        c.set(prefix + b"/b", value[::-1])
        keys = [prefix + k for k in (b"/a", b"/absent", b"/longer", b"/b", b"/absent-too")]
        into = [bytearray(b"\xff" * len(value)) for _ in keys]
        found, error = c.get_many_into(keys, [memoryview(b) for b in into])
        assert found == [True, False, False, True, False]
        assert isinstance(error, KVError) and f"{prefix + b'/longer'!r} is not {len(value)} bytes" in str(error)
        assert (into[0], into[3]) == (value, value[::-1])
        assert c.ping() and c.get(prefix + b"/a") == value


def test_a_load_job_the_server_refuses_is_an_error_and_loses_the_connection_nothing(
    kv_server: KVServerProcess,
) -> None:
    with _plain_client(kv_server, "tcp", timeout=10) as c:
        c.set(b"refused-job/a", b"x" * 100)
        found, error = c.get_many_into([b"refused-job/a", b"k" * 5000], [memoryview(bytearray(100))] * 2)
        assert found == [False, False]
        assert isinstance(error, KVError) and "limits.max_key_size" in str(error)
        with pytest.raises(ValueError, match="several sizes"):
            c.get_many_into(
                [b"refused-job/a", b"refused-job/a"], [memoryview(bytearray(100)), memoryview(bytearray(9))]
            )
        assert c.get_many_into([b"refused-job/a"], [memoryview(bytearray(100))]) == ([True], None)


def test_a_load_job_larger_than_one_reply_goes_in_several(
    kv_server: KVServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    import strata_kv.client

    monkeypatch.setattr(strata_kv.client, "GET_MANY_BYTES", 3 * 1000)
    keys = [b"windows-%03d" % i for i in range(10)]
    with _plain_client(kv_server, "tcp") as c:
        c.put_chain([(key, (key * 100)[:1000]) for key in keys])
        counting = _CountingSocket(c._sock)
        c._sock = counting  # type: ignore[assignment]
        into = [bytearray(1000) for _ in keys]
        assert c.get_many_into(keys, [memoryview(b) for b in into]) == ([True] * len(keys), None)
        assert [bytes(b) for b in into] == [(key * 100)[:1000] for key in keys]
        assert counting.calls.count("sendall") == 4, counting.calls  # 3 + 3 + 3 + 1 keys


def test_a_load_job_from_a_server_without_sized_gets_gets_each_key(redis_server: RedisServer) -> None:
    """An older server (here redis-server itself) does not know STRATA.MGETSIZED: the client asks once, then
    GETs key by key on that connection."""
    with KVClient("127.0.0.1", redis_server.port, timeout=10) as c:
        c.set(b"older/a", b"a" * 64)
        c.set(b"older/b", b"b" * 64)
        into = [bytearray(64) for _ in range(3)]
        views = [memoryview(b) for b in into]
        assert c.get_many_into([b"older/a", b"older/absent", b"older/b"], views) == ([True, False, True], None)
        assert (into[0], into[2]) == (b"a" * 64, b"b" * 64)
        counting = _CountingSocket(c._sock)
        c._sock = counting  # type: ignore[assignment]
        assert c.get_many_into([b"older/b"], views[:1]) == ([True], None)
        assert counting.calls[0] == "sendall" and "STRATA" not in str(counting.calls)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_store_job_takes_one_send_and_one_receive_however_many_chunks(
    kv_server: KVServerProcess, transport: str
) -> None:
    """`set_many_from`, the tier's store job: one SET at a time returned to the GIL twice per chunk."""
    chunks = [bytes([i]) * (256 * 1024) for i in range(16)]
    keys = [b"stored-%s-%d" % (transport.encode(), i) for i in range(len(chunks))]
    with _plain_client(kv_server, transport) as c:
        c._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STOCK_SEND_BUFFER)
        counting = _CountingSocket(c._sock)
        c._sock = counting  # type: ignore[assignment]
        assert c.set_many_from([(k, memoryview(v)) for k, v in zip(keys, chunks, strict=True)]) == ([True] * 16, None)
        assert counting.calls == ["sendmsg", "recv_into"], counting.calls
        assert [c.get(key) for key in keys] == chunks


def test_a_store_job_says_which_sets_the_server_refused_and_stays_in_step(kv_server: KVServerProcess) -> None:
    with _plain_client(kv_server, "tcp", timeout=10) as c:
        items = [(b"refused-set/a", b"a" * 1000), (b"k" * 5000, b"b" * 1000), (b"refused-set/c", b"c" * 1000)]
        stored, error = c.set_many_from(items)
        assert stored == [True, False, True]
        assert isinstance(error, KVError) and "limits.max_key_size" in str(error)
        assert c.get(b"refused-set/a") == b"a" * 1000 and c.get(b"refused-set/c") == b"c" * 1000


def test_a_job_of_many_small_chunks_goes_in_several_sends_stores_and_loads_alike(
    kv_server: KVServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send carries at most KEYS_AT_ONCE SETs (three buffers each in one `sendmsg`), and a sized MGET asks for at
    most that many keys (a buffer each in one `recvmsg_into`): the kernel takes 1024 buffers per call."""
    import strata_kv.client

    monkeypatch.setattr(strata_kv.client, "KEYS_AT_ONCE", 3)
    items = [(b"small-chunk-%d" % i, b"%02d" % i * 5) for i in range(10)]
    with _plain_client(kv_server, "tcp") as c:
        counting = _CountingSocket(c._sock)
        c._sock = counting  # type: ignore[assignment]
        assert c.set_many_from(items) == ([True] * 10, None)
        assert counting.calls.count("sendmsg") == 4, counting.calls  # 3 + 3 + 3 + 1
        into = [bytearray(10) for _ in items]
        assert c.get_many_into([key for key, _ in items], [memoryview(b) for b in into]) == ([True] * 10, None)
        assert counting.calls.count("sendall") == 4, counting.calls
        assert [bytes(b) for b in into] == [value for _, value in items]


def test_a_server_that_does_not_answer_times_the_call_out() -> None:
    import socket

    with (
        socket.create_server(("127.0.0.1", 0)) as silent,
        KVClient("127.0.0.1", silent.getsockname()[1], timeout=0.2) as c,
        pytest.raises(TimeoutError),
    ):
        c.ping()
