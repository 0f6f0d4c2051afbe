"""LMCache's RESP backend as it behaves on the wire: 8 connections, one request in flight each, upper-case
EXISTS/SET/GET/DEL as arrays of bulk strings, raw reply-header comparisons, chunks over 8 MiB, and a GET
only after EXISTS said yes (a miss there would hang an LMCache worker)."""

import hashlib
import socket
import threading

import pytest

pytestmark = pytest.mark.integration

CHUNK = 8 * 1024 * 1024 + 4096  # arrives split across many reads


def cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class LMCacheLikeConnection:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.buf = b""

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            assert chunk, "server closed the connection"
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def exists(self, key: bytes) -> bool:
        self.sock.sendall(cmd(b"EXISTS", key))
        reply = self._read(4)
        assert reply in (b":0\r\n", b":1\r\n"), reply
        return reply == b":1\r\n"

    def set(self, key: bytes, value: bytes) -> None:
        self.sock.sendall(cmd(b"SET", key, value))
        assert self._read(5) == b"+OK\r\n"

    def get(self, key: bytes, size: int) -> bytes:
        self.sock.sendall(cmd(b"GET", key))
        header = b"$%d\r\n" % size
        got = self._read(len(header))
        assert got == header, f"LMCache compares this header byte for byte: {got!r}"
        value = self._read(size)
        assert self._read(2) == b"\r\n"
        return value


def key_for(i: int) -> bytes:
    """LMCache 0.5.6's key (model@world_size@worker_id@chunk_hash@dtype@suffix) + its redis connector's tail."""
    chunk_hash = hashlib.sha256(b"%d" % i).hexdigest()[:16].encode()
    return b"meta-llama/Llama-3.1-8B@1@0@%s@bfloat16@tenant-a.v1kv_bytes" % chunk_hash


def chunk_for(i: int) -> bytes:
    return hashlib.sha256(b"chunk%d" % i).digest() * (CHUNK // 32)


def test_eight_workers_store_and_load_large_chunks_through_a_small_l1(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": "48MiB"}})  # ~5 chunks in DRAM, the rest on the fs tier
    failures: list[str] = []

    def worker(w: int) -> None:
        conn = LMCacheLikeConnection(server.port)
        try:
            for i in range(w, 24, 8):
                if not conn.exists(key_for(i)):
                    conn.set(key_for(i), chunk_for(i))
            for i in range(24):  # every worker loads every chunk it is told exists
                if conn.exists(key_for(i)) and conn.get(key_for(i), CHUNK) != chunk_for(i):
                    failures.append(f"worker {w} chunk {i}")
        except AssertionError as e:
            failures.append(f"worker {w}: {e}")
        finally:
            conn.sock.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    stats = server.client().stats()
    assert stats["l1_used_bytes"] <= 48 * 1024 * 1024
    assert stats["hits_fs"] > 0
