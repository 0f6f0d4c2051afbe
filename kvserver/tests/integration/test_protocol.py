"""RESP on the wire: real clients (redis-py, raw sockets as LMCache uses them) against a real server."""

import socket
import threading

import pytest
import redis
from strata_testsupport.kvserver import KVServerProcess

pytestmark = pytest.mark.integration


class Raw:
    """A bare socket: what LMCache's C++ client does, byte for byte."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                break
            out += chunk
        return out

    def recv_line(self) -> bytes:
        out = b""
        while not out.endswith(b"\r\n"):
            c = self.sock.recv(1)
            if not c:
                break
            out += c
        return out

    def close(self) -> None:
        self.sock.close()


def cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def test_replies_are_byte_exact_for_lmcache(kv_server: KVServerProcess) -> None:
    raw = Raw(kv_server.port)
    key = b"llama/3@00000000@0@0a1b2c3d-e.f@salt"  # keys carry / @ - .
    raw.send(cmd(b"EXISTS", key))
    assert raw.recv_exact(4) == b":0\r\n"
    raw.send(cmd(b"GET", key))
    assert raw.recv_exact(5) == b"$-1\r\n"
    raw.send(cmd(b"SET", key, b"\x00\r\n" * 10))
    assert raw.recv_exact(5) == b"+OK\r\n"
    raw.send(cmd(b"EXISTS", key))
    assert raw.recv_exact(4) == b":1\r\n"
    raw.send(cmd(b"GET", key))
    expected = b"$30\r\n" + b"\x00\r\n" * 10 + b"\r\n"
    assert raw.recv_exact(len(expected)) == expected
    raw.send(cmd(b"DEL", key))
    assert raw.recv_exact(4) == b":1\r\n"
    raw.send(cmd(b"DEL", key))
    assert raw.recv_exact(4) == b":0\r\n"
    raw.close()


def test_value_of_8_mib_arrives_split_and_returns_intact(kv_server: KVServerProcess) -> None:
    r = kv_server.redis()
    value = bytes(range(256)) * (8 * 4096)
    assert r.set("big", value)
    assert r.get("big") == value
    r.delete("big")


def test_redis_py_commands(kv_server: KVServerProcess) -> None:
    r = kv_server.redis()
    assert r.ping()
    assert r.echo("hi") == b"hi"
    assert r.mset({"a": b"1", "b": b"2"})
    assert r.mget(["a", "missing", "b"]) == [b"1", None, b"2"]
    assert r.exists("a", "b", "missing") == 2
    assert r.set("a", b"x", nx=True) is None
    assert r.set("fresh", b"x", xx=True) is None
    assert r.delete("a", "b", "missing") == 2
    assert r.client_setname("lmcache-worker")
    assert r.client_getname() == "lmcache-worker"
    info = r.info()
    assert info["redis_mode"] == "standalone" and "keyspace_hits" in info
    assert "maxmemory" in r.config_get("maxmemory")
    assert r.execute_command("SELECT", 0)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.execute_command("FLUSHALL")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("GET")


def test_hello_negotiates_resp2_or_resp3_and_refuses_others(kv_server: KVServerProcess) -> None:
    r2 = kv_server.redis(protocol=2)
    reply = r2.execute_command("HELLO", "2")
    flat = dict(zip(reply[::2], reply[1::2], strict=True))
    assert flat[b"proto"] == 2
    with pytest.raises(redis.ResponseError, match="NOPROTO"):
        r2.execute_command("HELLO", "4")
    raw = Raw(kv_server.port)
    raw.send(cmd(b"HELLO", b"3"))
    assert raw.recv_line() == b"%7\r\n"  # RESP3 map header
    raw.close()


def test_resp3_null_for_a_miss(kv_server: KVServerProcess) -> None:
    raw = Raw(kv_server.port)
    raw.send(cmd(b"HELLO", b"3"))
    for _ in range(1 + 7 * 2 * 2):  # map header + 7 pairs of (header, value) lines, good enough to skip
        line = raw.recv_line()
        if line == b"*0\r\n":
            break
    raw.send(cmd(b"GET", b"absent-key"))
    assert raw.recv_exact(3) == b"_\r\n"
    raw.close()


def test_redis_py_in_both_protocols(kv_server: KVServerProcess) -> None:
    for proto in (2, 3):
        r = kv_server.redis(protocol=proto)
        assert r.set(f"p{proto}", b"v") and r.get(f"p{proto}") == b"v"
        assert r.get("absent-key") is None
        assert r.config_get("maxclients")["maxclients"]


def test_pipelined_batch_beyond_the_pipeline_limit_is_answered_in_order(kv_server: KVServerProcess) -> None:
    r = kv_server.redis()
    with r.pipeline(transaction=False) as p:
        for i in range(3000):  # limit is 1024: reading pauses and resumes
            p.set(f"pipe:{i}", str(i))
        for i in range(3000):
            p.get(f"pipe:{i}")
        out = p.execute()
    assert out[:3000] == [True] * 3000
    assert out[3000:] == [str(i).encode() for i in range(3000)]


def test_malformed_request_gets_an_error_and_others_are_unaffected(kv_server: KVServerProcess) -> None:
    healthy = kv_server.redis()
    healthy.set("steady", b"1")
    raw = Raw(kv_server.port)
    raw.send(b"*2\r\n$3\r\nGET\r\n:12\r\n")
    assert raw.recv_line().startswith(b"-ERR Protocol error")
    assert raw.recv_exact(1) == b""  # the out-of-step connection is closed
    raw.close()
    assert healthy.get("steady") == b"1"


def test_oversized_value_is_refused_and_the_server_stays_up(kv_server_factory) -> None:
    server = kv_server_factory({"limits": {"max_value_size": "1MiB"}}, l2_fs=False)
    raw = Raw(server.port)
    raw.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2000000\r\n")
    assert b"max_value_size" in raw.recv_line()
    raw.close()
    r = server.redis()
    assert r.set("k", b"v" * 1000) and r.get("k") == b"v" * 1000


def test_max_clients_is_enforced(kv_server_factory) -> None:
    server = kv_server_factory({"limits": {"max_clients": 2}}, l2_fs=False)
    a, b = Raw(server.port), Raw(server.port)
    a.send(cmd(b"PING"))
    b.send(cmd(b"PING"))
    assert a.recv_exact(7) == b.recv_exact(7) == b"+PONG\r\n"
    c = Raw(server.port)
    assert c.recv_line() == b"-ERR max number of clients reached\r\n"
    for s in (a, b, c):
        s.close()


def test_unix_socket(kv_server: KVServerProcess) -> None:
    assert kv_server.unix_socket
    r = redis.Redis(unix_socket_path=kv_server.unix_socket)
    assert r.set("via-unix", b"1") and r.get("via-unix") == b"1"


def test_inline_ping_like_telnet(kv_server: KVServerProcess) -> None:
    raw = Raw(kv_server.port)
    raw.send(b"PING\r\n")
    assert raw.recv_exact(7) == b"+PONG\r\n"
    raw.close()


def test_many_concurrent_clients_keep_their_replies_apart(kv_server: KVServerProcess) -> None:
    errors: list[str] = []

    def worker(n: int) -> None:
        r = kv_server.redis()
        for i in range(50):
            value = f"{n}:{i}".encode() * 100
            r.set(f"c{n}:{i}", value)
            if r.get(f"c{n}:{i}") != value:
                errors.append(f"client {n} item {i}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_token_auth_from_a_file(kv_server_factory, tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    server = kv_server_factory({"auth": {"token_file": str(token)}}, l2_fs=False)
    raw = Raw(server.port)
    raw.send(cmd(b"GET", b"k"))
    assert raw.recv_line() == b"-NOAUTH Authentication required.\r\n"
    raw.send(cmd(b"AUTH", b"wrong"))
    assert raw.recv_line().startswith(b"-WRONGPASS")
    raw.send(cmd(b"AUTH", b"s3cret"))
    assert raw.recv_exact(5) == b"+OK\r\n"
    raw.close()
    r = server.redis(password="s3cret")
    assert r.set("k", b"v") and r.get("k") == b"v"
    r2 = server.redis(username="default", password="s3cret")
    assert r2.get("k") == b"v"


def test_strata_prefix_lookup_reports_leading_resident_chunks(kv_server: KVServerProcess) -> None:
    c = kv_server.client()
    keys = [f"doc1:chunk{i}" for i in range(5)]
    c.put_chain([(k, b"x" * 100) for k in keys[:3]])
    assert c.prefix(keys) == ["l1", "l1", "l1"]
    assert c.prefix(["nothing", *keys]) == []
    stats = c.stats()
    assert stats["l1_keys"] >= 3 and "hits_l1" in stats
    c.close()


def test_tenancy_requiring_a_salt_refuses_unsalted_keys(kv_server_factory) -> None:
    server = kv_server_factory({"tenancy": {"require_salt": True}}, l2_fs=False)
    r = server.redis()
    with pytest.raises(redis.ResponseError, match="tenant salt"):
        r.set("llama@1@0@abcdef@bfloat16", b"v")
    assert r.set("llama@1@0@abcdef@bfloat16@tenant-a", b"v")
    assert r.get("llama@1@0@abcdef@bfloat16@tenant-a") == b"v"
    assert r.get("llama@1@0@abcdef@bfloat16@tenant-b") is None
