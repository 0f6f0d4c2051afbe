"""Large values (MiB-sized chunks): byte-exact over TCP and the Unix socket on both event loops, and a
memory bound that holds while many clients write large values at once."""

import itertools
import json
import os
import random
import resource
import socket
import stat
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _values(n: int, size: int) -> list[bytes]:
    seed = os.urandom(4096)
    return [bytes([i]) + seed * (size // 4096) + bytes([i]) * 7 for i in range(n)]


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_large_values_round_trip_byte_exact_over_tcp_and_unix_socket(kv_server_factory, event_loop) -> None:
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")
    server = kv_server_factory({"l1": {"size": "256MiB"}, "listen": {"event_loop": event_loop}}, l2_fs=False)
    assert server.unix_socket
    tcp = server.redis()
    uds = redis.Redis(unix_socket_path=server.unix_socket, socket_timeout=30)
    values = _values(6, 5 * MiB)
    tcp.set("a", values[0])
    uds.set("b", values[1])
    assert tcp.get("b") == values[1] and uds.get("a") == values[0]
    assert tcp.mset({"c": values[2], "d": values[3]}) and uds.mget("c", "d") == [values[2], values[3]]
    pipe = uds.pipeline(transaction=False)  # several large values in one read and one reply stream
    pipe.set("e", values[4]).set("f", values[5]).get("e").get("f").get("a")
    assert pipe.execute() == [True, True, values[4], values[5], values[0]]
    assert tcp.get("f") == values[5]
    tcp.set("a", values[5])  # overwrite a stored large value
    assert uds.get("a") == values[5]
    assert uds.ping()


def test_a_value_no_memory_can_be_mapped_for_is_refused_and_the_connection_stays_in_step(kv_server_factory) -> None:
    """The kernel refuses the value's mapping (the server's address space capped with a real RLIMIT_AS, as a
    container's limits or a full `vm.max_map_count` would): that SET alone gets -OOM, its bytes are read and
    dropped, and the same connection serves the commands after it, pipelined ones included."""
    server = kv_server_factory({"l1": {"size": "512MiB"}}, l2_fs=False)
    assert server.process is not None
    pid = server.process.pid
    r = server.redis()
    kept = os.urandom(4 * MiB)
    r.set("kept", kept)
    big = os.urandom(64 * MiB)
    soft, hard = resource.prlimit(pid, resource.RLIMIT_AS)
    resource.prlimit(pid, resource.RLIMIT_AS, (psutil.Process(pid).memory_info().vms + 48 * MiB, hard))
    try:
        refused = r"^no memory could be mapped for a value of 67108864 bytes"
        with pytest.raises(redis.exceptions.OutOfMemoryError, match=refused):
            r.set("big", big)
        assert r.ping() and r.get("kept") == kept and r.get("big") is None
        pipe = r.pipeline(transaction=False)
        pipe.set("big", big).set("small", b"s" * 1000).get("small").get("kept")
        replies = pipe.execute(raise_on_error=False)
        assert isinstance(replies[0], redis.exceptions.OutOfMemoryError)
        assert replies[1:] == [True, b"s" * 1000, kept]
        stats = json.loads(r.execute_command("STRATA.STATS"))
        assert stats["values_refused"] == 2 and stats["inflight_bytes"] == 0
    finally:
        resource.prlimit(pid, resource.RLIMIT_AS, (soft, hard))
    assert r.set("big", big) and r.get("big") == big  # the limit was all that stood in the way


def test_an_l1_full_of_large_values_lives_in_few_memory_areas(kv_server_factory) -> None:
    """`vm.max_map_count` (65530) bounds a process's memory areas; one per value would cap L1 at 65530 values.
    Values of mixed sizes (4 MiB, 7 MiB, odd ones), overwritten, deleted and evicted: their mappings merge."""
    server = kv_server_factory({"l1": {"size": "512MiB"}}, l2_fs=False)
    assert server.process is not None
    maps = Path(f"/proc/{server.process.pid}/maps")
    r = server.redis()
    r.ping()
    before = len(maps.read_text().splitlines())
    rng = random.Random(7)
    source = memoryview(os.urandom(8 * MiB))
    for _ in range(400):
        x = rng.random()
        size = 4 * MiB if x < 0.8 else 7 * MiB if x < 0.9 else rng.randrange(2 * MiB, 6 * MiB)
        r.set(f"k{rng.randrange(300)}", source[:size])
        if rng.random() < 0.1:
            r.delete(f"k{rng.randrange(300)}")
    held = r.dbsize() + json.loads(r.execute_command("STRATA.STATS"))["value_pool_bytes"] // (4 * MiB)
    assert held >= 100
    added = len(maps.read_text().splitlines()) - before
    assert added <= held // 4, f"{added} memory areas for {held} values"


def test_unix_socket_is_not_world_accessible(kv_server_factory) -> None:
    server = kv_server_factory(l2_fs=False)
    assert server.unix_socket
    mode = stat.S_IMODE(os.stat(server.unix_socket).st_mode)
    assert mode & ~0o660 == 0, oct(mode)


def test_rss_stays_within_l1_plus_inflight_budget_under_concurrent_large_writes(kv_server_factory) -> None:
    """32 clients each SET 16 MiB values at once into a 64 MiB L1 with a 32 MiB in-flight budget."""
    l1, inflight, clients, size = 64 * MiB, 32 * MiB, 32, 16 * MiB
    server = kv_server_factory(
        {"l1": {"size": l1}, "limits": {"max_inflight_bytes": inflight}}, l2_fs=False, name="bounded"
    )
    assert server.process is not None
    proc = psutil.Process(server.process.pid)
    server.redis().set("warm", b"x")
    baseline = proc.memory_info().rss
    value = os.urandom(size)
    errors: list[BaseException] = []
    peak = [0]
    done = threading.Event()

    def writer(n: int) -> None:
        try:
            r = server.redis()
            for i in range(3):
                r.set(f"k{n}-{i}", value)
        except BaseException as e:  # reported below
            errors.append(e)

    def sampler() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            done.wait(0.005)

    watch = threading.Thread(target=sampler)
    watch.start()
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watch.join()
    assert not errors, errors[:3]
    stats = server.client().stats()
    assert stats["l1_used_bytes"] <= l1
    assert stats["inflight_peak_bytes"] <= inflight
    assert stats["inflight_waits"] > 0  # the budget, not luck, kept it bounded
    assert stats["inflight_bytes"] == 0
    # per connection: a 256 KiB parse buffer and socket bookkeeping; 24 MiB of slack for the allocator
    allowance = clients * 512 * 1024 + 24 * MiB
    grown = max(peak[0], proc.memory_info().rss) - baseline
    # L1, values in flight, and as much again of dropped values' buffers kept for reuse
    assert stats["value_pool_bytes"] <= inflight
    assert grown <= l1 + 2 * inflight + allowance, f"RSS grew {grown / MiB:.0f} MiB"
    last = server.redis().get(f"k{clients - 1}-2")
    assert last is None or last == value  # evicted or intact, never torn


def test_recycled_buffers_never_change_values_still_being_read(kv_server_factory) -> None:
    """Overwrites and evictions recycle large buffers; a value fetched before, or stored after, stays intact."""
    server = kv_server_factory({"l1": {"size": "48MiB"}, "limits": {"max_inflight_bytes": "16MiB"}}, l2_fs=False)
    r = server.redis()
    values = _values(8, 4 * MiB)
    for round_ in range(3):
        for i, v in enumerate(values):
            r.set(f"k{i % 5}", v)  # 5 keys of 4 MiB: overwrites, and evictions past 48 MiB
            assert r.get(f"k{i % 5}") == v, (round_, i)
    stats = server.client().stats()
    assert stats["value_pool_reused"] > 0
    pipe = r.pipeline(transaction=False)
    for i in range(5):
        pipe.get(f"k{i}")
    got = pipe.execute()
    assert all(g is None or g in values for g in got)


def test_a_large_value_arriving_in_pieces_and_the_small_requests_after_it_are_answered(kv_server_factory) -> None:
    """While a large value arrives the server asks the kernel to wake it only once much of it is there
    (SO_RCVLOWAT), never for more than the value still needs, and back to one byte after it: values sent in
    pieces with pauses, the last one a few bytes, and the small requests behind them are all answered."""
    server = kv_server_factory({"l1": {"size": "256MiB"}}, l2_fs=False)
    values = [os.urandom(5 * MiB + 3), os.urandom(MiB + 1), os.urandom(9 * MiB)]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        for i, value in enumerate(values):
            request = b"*3\r\n$3\r\nSET\r\n$2\r\nk%d\r\n$%d\r\n%s\r\n" % (i, len(value), value)
            # the header and 9 bytes of the value first, then a third, then all but 7 and the CRLF, then those
            cuts = [0, 40, len(request) // 3, len(request) - 9, len(request)]
            for start, end in itertools.pairwise(cuts):
                s.sendall(request[start:end])
                time.sleep(0.05)
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            got = b""
            while len(got) < len(b"+OK\r\n+PONG\r\n"):
                chunk = s.recv(64)  # times out (the test fails) if the server was never woken
                assert chunk
                got += chunk
            assert got == b"+OK\r\n+PONG\r\n", (i, got)
    r = server.redis()
    assert [r.get(f"k{i}") for i in range(len(values))] == values
