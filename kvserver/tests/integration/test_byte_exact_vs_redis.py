"""Byte-for-byte replies: the same request stream sent to Debian's redis-server and to strata-kv."""

import socket

import pytest
from strata_testsupport.kvserver import KVServerProcess, RedisServer

pytestmark = pytest.mark.integration


def cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def exchange(port: int, request: bytes, expect_close: bool = False) -> bytes:
    """Send one request and read until the reply stops arriving (short idle timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        s.settimeout(0.3)
        out = b""
        while True:
            try:
                chunk = s.recv(1 << 20)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
        return out


KEY = b"model@00000000@0@3f2a9c-1.2/x"
VALUE = bytes(range(256)) * 300 + b"\r\n"

CASES = {
    "ping": cmd(b"PING"),
    "ping-message": cmd(b"PING", b"hello"),
    "echo": cmd(b"ECHO", b"bytes \x00\xff"),
    "set-get-exists-del": cmd(b"SET", KEY, VALUE)
    + cmd(b"GET", KEY)
    + cmd(b"EXISTS", KEY, KEY, b"nope")
    + cmd(b"DEL", KEY, b"nope")
    + cmd(b"GET", KEY)
    + cmd(b"EXISTS", KEY),
    "empty-value": cmd(b"SET", b"e", b"") + cmd(b"GET", b"e") + cmd(b"DEL", b"e"),
    "mset-mget": cmd(b"MSET", b"a", b"1", b"b", b"22") + cmd(b"MGET", b"a", b"zz", b"b") + cmd(b"DEL", b"a", b"b"),
    "set-nx-xx": cmd(b"SET", b"n", b"1", b"NX")
    + cmd(b"SET", b"n", b"2", b"NX")
    + cmd(b"SET", b"q", b"1", b"XX")
    + cmd(b"GET", b"n")
    + cmd(b"DEL", b"n"),
    "wrong-arity": cmd(b"GET") + cmd(b"SET", b"k") + cmd(b"MSET", b"a"),
    "unknown-command": cmd(b"FOOBAR", b"x", b"y"),
    "inline": b"PING\r\nEXISTS nope\r\n",
    "select-0": cmd(b"SELECT", b"0"),
    "syntax-error": cmd(b"SET", b"k", b"v", b"BOGUS"),
    "auth-without-password": cmd(b"AUTH", b"x"),
    "client-setname-getname": cmd(b"CLIENT", b"SETNAME", b"w1") + cmd(b"CLIENT", b"GETNAME"),
    "pipelined-gets": cmd(b"SET", b"p", b"v") + cmd(b"GET", b"p") * 50 + cmd(b"DEL", b"p"),
    "protocol-error": b"*2\r\n$3\r\nGET\r\n:1\r\n",
    "bad-bulk-length": b"*1\r\n$abc\r\n",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reply_bytes_equal_redis(case: str, kv_server: KVServerProcess, redis_server: RedisServer) -> None:
    request = CASES[case]
    assert exchange(kv_server.port, request) == exchange(redis_server.port, request)
