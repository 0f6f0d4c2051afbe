"""The large-value bench's ceiling server (`bench/null_server.c`), compiled by the bench and driven by redis-py:
it must answer like a server, or the ceiling it gives measures a broken exchange; given a key count it must keep
what each key was sent, or the store's ceiling it gives measures less than a store's work."""

from __future__ import annotations

import os
import socket
import time

import pytest
import redis
from strata_testsupport.kvserver import kv_large_bench

pytestmark = pytest.mark.integration


def test_the_null_server_takes_sets_and_answers_gets_with_its_reply() -> None:
    bench = kv_large_bench()
    size = 3 * 1024 * 1024 + 5  # larger than its read buffer, and not a round number
    with bench.null_server(size) as (_, (host, port)):
        client = redis.Redis(host=host, port=port, socket_timeout=30, protocol=2)  # it answers no HELLO
        assert client.set("k", b"v" * size) is True
        value = client.get("anything")
        assert isinstance(value, bytes) and len(value) == size and value.count(0) == size
        probe = client.get(bench.PROBE_KEY)  # the small GET that times what the load costs others
        assert isinstance(probe, bytes) and len(probe) == 100
        pipe = client.pipeline(transaction=False)  # requests arriving together are answered in order
        pipe.set("a", b"x" * 70_000)
        pipe.get("a")
        pipe.set("b", b"")
        assert [len(r) if isinstance(r, bytes) else r for r in pipe.execute()] == [True, size, True]


def test_a_value_that_trickles_in_is_received_whole_and_the_next_command_is_answered() -> None:
    """The null server wakes for a large value only once a part of it has arrived (its low-water mark): a value
    sent in pauses must still complete, and a small command after it be read from its first bytes, which a
    mark left above them would hold back until the timeout."""
    bench = kv_large_bench()
    size = 6 * 1024 * 1024 + 3
    with bench.null_server(1024) as (_, (host, port)), socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % size)
        value = b"v" * size + b"\r\n"  # the last piece ends the request: the mark set for it must not linger
        piece = -(-len(value) // 3)
        for start in range(0, len(value), piece):
            s.sendall(value[start : start + piece])
            time.sleep(0.05)
        assert s.recv(16) == b"+OK\r\n"
        s.sendall(b"*2\r\n$3\r\nGET\r\n$10\r\n")  # the probe's GET, in two pieces
        time.sleep(0.05)
        s.sendall(b"probe:0001\r\n")
        reply = b""
        while len(reply) < 108:
            chunk = s.recv(200)
            assert chunk, "the null server closed the connection"
            reply += chunk
        assert reply.startswith(b"$100\r\n") and reply.endswith(b"\r\n") and len(reply) == 108


def test_with_a_key_space_each_key_keeps_the_value_it_was_sent() -> None:
    bench = kv_large_bench()
    size = 3 * 1024 * 1024 + 5
    with bench.null_server(size, keys=4) as (_, (host, port)):
        client = redis.Redis(host=host, port=port, socket_timeout=30, protocol=2)
        first, second = os.urandom(size), os.urandom(size)
        assert client.set(bench._key(1), first) is True
        assert client.set(bench._key(2), second) is True
        assert client.get(bench._key(1)) == first
        assert client.get(bench._key(2)) == second
        assert client.get(bench._key(3)) == bytes(size)  # filled at the start, as a store's key space is
        assert client.set(bench._key(6), b"x" * 10) is True  # another size: taken and dropped
        assert client.get(bench._key(2)) == second  # key 6 shares key 2's slot (modulo the key count)
        assert client.set(bench._key(6), first) is True
        assert client.get(bench._key(2)) == first
        assert client.set(b"bench:-1", second) is True  # a key out of the key space's range still has a slot
        assert client.get(b"bench:-1") == second
