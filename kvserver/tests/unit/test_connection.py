"""The per-connection protocol in-process, over a fake transport: lifetimes and scheduling, no sockets.

The fake transport takes every write at once (an always-writable socket) unless told otherwise,
so what is tested is the connection's own logic, deterministically.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from strata_kv.config import KVServerConfig
from strata_kv.server.connection import RespConnection
from strata_kv.server.cpus import usable_cpus
from strata_kv.server.intake import ReadGate
from strata_kv.server.listeners import KVServer
from strata_kv.server.senders import SEND_CHUNK, SEND_VIEWS, advance, take
from strata_kv.server.state import IDLE_TIMEOUT
from strata_kv.wire import resp

MiB = 1024 * 1024


class FakeTransport(asyncio.Transport):
    """Records writes; `close` calls `connection_lost` soon, as asyncio's transports do."""

    def __init__(self, protocol: RespConnection) -> None:
        super().__init__()
        self.protocol: RespConnection | None = protocol
        self.written = bytearray()
        self.writes = 0
        self.closing = False
        self.reading = True

    def write(self, data: Any) -> None:
        self.written += data
        self.writes += 1

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high_water = high

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self._lost)

    def _lost(self) -> None:
        protocol, self.protocol = self.protocol, None
        if protocol is not None:
            protocol.connection_lost(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default


def make_server(**config: Any) -> KVServer:
    cfg = KVServerConfig.model_validate({"metrics": {"port": -1}, "l1": {"size": "64MiB"}, **config})
    return KVServer(cfg)


def open_connection(server: KVServer) -> tuple[RespConnection, FakeTransport]:
    conn = RespConnection(server.parts)
    transport = FakeTransport(conn)
    conn.connection_made(transport)
    return conn, transport


def receive(conn: RespConnection, data: bytes) -> None:
    """Deliver bytes the way asyncio's BufferedProtocol path does: get_buffer, copy, buffer_updated."""
    view = memoryview(data)
    while view:
        free = conn.get_buffer(-1)
        n = min(len(free), len(view))
        free[:n] = view[:n]
        del free
        conn.buffer_updated(n)
        view = view[n:]


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """Only reference counting frees objects: what the server sees between rare full collections."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_each_request_restarts_the_idle_clock() -> None:
    """The reaper's verdict at given instants (`expired(now)` takes the clock as an argument): idle only once a
    whole `idle_timeout_seconds` passed since the last request was answered, whenever the sweep happens to run.
    The real server's reaper, sockets and metric are in the integration tests (test_hardening)."""
    server = make_server(limits={"idle_timeout_seconds": 1.5})
    conn, transport = open_connection(server)
    receive(conn, resp.command("PING"))
    await turns()
    assert transport.written == resp.PONG
    first = conn.last_active
    assert conn.expired(first + 1.4) is None
    assert conn.expired(first + 1.6) == IDLE_TIMEOUT
    await asyncio.sleep(0.2)  # the next request comes at least 0.2 s later (more under load: the same verdicts)
    receive(conn, resp.command("PING"))
    await turns()
    assert transport.written == resp.PONG * 2
    second = conn.last_active
    assert second >= first + 0.2
    assert conn.expired(first + 1.6) is None, "the second request must restart the clock"
    assert conn.expired(second + 1.4) is None
    assert conn.expired(second + 1.6) == IDLE_TIMEOUT
    transport.close()
    await turns()


@pytest.mark.usefixtures("no_cyclic_gc")
async def test_a_closed_connection_is_freed_without_the_cyclic_collector() -> None:
    server = make_server()
    conn, transport = open_connection(server)
    receive(conn, resp.command("PING"))
    receive(conn, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n" + b"x" * 4 * 1024**2)
    await turns()
    assert transport.written == resp.PONG
    ref = weakref.ref(conn)
    transport.close()
    del conn
    await turns()
    assert ref() is None, f"connection still referenced by {[type(r).__name__ for r in gc.get_referrers(ref())]}"


async def test_a_large_reply_leaves_turns_to_the_others() -> None:
    """B's PING is answered while A's 16 MiB GET reply is still being written: the reply goes out in slices with
    a turn for other connections after each, not in one write that holds the loop until the socket takes it."""
    server = make_server()
    value = bytes(range(256)) * (16 * 1024 * 1024 // 256)
    assert server.store.set_nowait(b"big", value)
    a, ta = open_connection(server)
    b, tb = open_connection(server)
    loop = asyncio.get_running_loop()
    loop.call_soon(receive, a, resp.command("GET", "big"))  # both arrive in one turn of the loop
    loop.call_soon(receive, b, resp.command("PING"))
    while tb.written != resp.PONG:
        await asyncio.sleep(0)
    reply = b"".join(resp.bulk(value))
    assert len(ta.written) < len(reply), "the other client waited for the whole large reply"
    for _ in range(10_000):
        if len(ta.written) == len(reply):
            break
        await asyncio.sleep(0)
    assert ta.written == reply, "the slices make up the value, in order"
    assert ta.writes > 2, "written in slices"


async def test_a_pipelining_connection_leaves_turns_to_the_others() -> None:
    """B's PING is answered while A's pipeline of GETs is still being served, not after all of it."""
    server = make_server()
    value = b"v" * 8192
    assert server.store.set_nowait(b"k", value)
    reply = b"".join(resp.bulk(value))
    a, ta = open_connection(server)
    b, tb = open_connection(server)
    n = 5000
    loop = asyncio.get_running_loop()
    loop.call_soon(receive, a, resp.command("GET", "k") * n)  # both arrive in one turn of the loop
    loop.call_soon(receive, b, resp.command("PING"))
    while tb.written != resp.PONG:
        await asyncio.sleep(0)
    served_before_pong = len(ta.written) // len(reply)
    assert served_before_pong < n, "the other client waited for the whole pipeline"
    for _ in range(10_000):
        if len(ta.written) == n * len(reply) and not a.queue:
            break
        await asyncio.sleep(0)
    assert bytes(ta.written) == reply * n  # every reply, in order


@pytest.mark.parametrize("seed", range(5))
def test_sender_jobs_cover_a_replys_parts_once_and_in_order(seed: int) -> None:
    """`take` cuts a reply into sender jobs (at most `SEND_CHUNK` bytes and `SEND_VIEWS` buffers) and
    `advance` drops what a partial send took: chunk after chunk, with sends cut at random points, every byte of
    every part goes out once, in order."""
    rng = random.Random(seed)
    sizes = [0, 5, MiB + 1, 3, 4 * MiB, 17] + [rng.randint(0, 200) for _ in range(700)] + [9 * MiB + 3]
    parts = [rng.randbytes(n) for n in sizes]
    pending = [memoryview(part) for part in parts]
    sent = bytearray()
    while pending:
        chunk = take(pending, SEND_CHUNK)
        size = sum(len(view) for view in chunk)
        assert size <= SEND_CHUNK and len(chunk) <= SEND_VIEWS
        took = size if rng.random() < 0.5 else rng.randint(0, size)  # whole, or cut where the socket filled
        sent += b"".join(chunk)[:took]
        pending = advance(pending, took)
    assert sent == b"".join(parts)


class MarkRecorder:
    """Stands in for the connection's socket handle: records the SO_RCVLOWAT marks it is given."""

    def __init__(self) -> None:
        self.marks: list[int] = []

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.marks.append(value)


async def test_the_low_water_mark_halves_over_a_values_last_megabytes_only_while_it_arrives_alone() -> None:
    """Alone, the last 4 MiB of a value wake the loop per half of the rest, so it copies while the client still
    sends; once another value arrives too, the mark is the whole rest (fewer wake-ups). Never above the rest."""
    server = make_server(limits={"max_inflight_bytes": "64MiB"})
    alone, _ = open_connection(server)
    other, _ = open_connection(server)
    alone.intake.lowat_socket, other.intake.lowat_socket = MarkRecorder(), MarkRecorder()
    size = 4 * MiB
    header = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % size
    receive(alone, header)
    receive(alone, b"x" * (2 * MiB))
    receive(alone, b"x" * MiB)
    assert alone.intake.lowat_socket.marks == [2 * MiB, MiB, 512 * 1024]
    receive(other, b"*3\r\n$3\r\nSET\r\n$1\r\nj\r\n$%d\r\n" % size)  # another value arrives now
    receive(alone, b"x" * (512 * 1024))
    assert alone.intake.lowat_socket.marks[-1] == 512 * 1024 == alone.parser.big_remaining, "the rest, not half of it"
    assert other.intake.lowat_socket.marks == [size], "not alone: the rest, up to 4 MiB"
    receive(alone, b"x" * (512 * 1024) + b"\r\n")
    assert alone.intake.lowat_socket.marks[-1] == 1, "a complete request: back to the first byte"
    await turns()


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000\n", "all"),
        ("50000 100000\n", 1),  # half a CPU still runs one thread at a time
        ("150000 100000\n", 2),
        ("1000000000 100000\n", "all"),  # a quota above the affinity: the affinity
        (None, "all"),  # no cgroup v2 file
        ("garbage\n", "all"),
        ("100000 0\n", "all"),
    ],
)
def test_usable_cpus_is_the_affinity_within_the_cgroups_quota(tmp_path, cpu_max: str | None, expected: Any) -> None:
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(path) == (affinity if expected == "all" else min(expected, affinity))


class ReadingRecorder:
    """Stands in for the transport: records every pause and resume of reading."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


def test_reading_resumes_only_when_neither_the_pipeline_nor_the_budget_holds_it() -> None:
    """The two reasons to stop reading are kept apart: a full pipeline that drains does not resume a connection
    whose large value still waits for in-flight budget, nor the other way round; the transport hears each change
    once."""
    gate = ReadGate()
    recorder = ReadingRecorder()
    gate.transport = recorder
    gate.set_pipeline_full(True)
    gate.set_waiting_budget(True)
    gate.set_pipeline_full(False)
    assert recorder.calls == ["pause"], "still waiting for budget"
    gate.set_waiting_budget(False)
    assert recorder.calls == ["pause", "resume"]
    gate.set_waiting_budget(True)
    gate.set_pipeline_full(True)
    gate.set_waiting_budget(False)
    assert recorder.calls == ["pause", "resume", "pause"], "the pipeline is still full"
    gate.set_pipeline_full(False)
    assert recorder.calls == ["pause", "resume", "pause", "resume"]
