"""A small Python client for the KV server, sync (`KVClient`) and asyncio (`AsyncKVClient`).

Any Redis client works for GET/SET; this one adds the `STRATA.*` calls (prefix lookup, chains,
stats) and reads large values without per-chunk copies.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any

from .wire import shared_memory
from .wire.resp import SIZED_FOUND, SIZED_MISSING, SIZED_OTHER_SIZE, command
from .wire.sockets import widen_unix_send_buffer

Reply = Any


class KVError(Exception):
    """The server answered with an error reply (`-ERR ...`)."""


def _decode(kind: int, line: bytes, read_exact: Callable[[int], bytes]) -> tuple[bool, Any]:
    """Return (is_array_header, value) for one reply line; bulk payloads are read via `read_exact`."""
    if kind == 0x2B:  # +
        return False, line.decode()
    if kind == 0x2D:  # -
        return False, KVError(line.decode())
    if kind == 0x3A:  # :
        return False, int(line)
    if kind == 0x24:  # $
        n = int(line)
        if n < 0:
            return False, None
        data = read_exact(n + 2)
        return False, data[:-2]
    if kind == 0x2A:  # *
        return True, int(line)
    raise KVError(f"unexpected reply type byte {kind!r}: the connection is out of step; reconnect")


RECEIVE_AHEAD = 64 * 1024
"""Bytes asked for when a reply's header is read; a large value's bulk then goes straight into its buffer."""
GET_MANY_BYTES = 64 * 1024**2
"""Most value bytes one request of `get_many_into` asks for, and one send of `set_many_from` carries (64 chunks
of 1 MiB): far below the server's limits.max_output_buffer and max_request_size (1 GiB unless set lower), and a
bound on what one call holds up."""

KEYS_AT_ONCE = 256
"""Most keys in one request of `get_many_into` (its receive scatters into a buffer per key) and in one send of
`set_many_from` (three buffers per key): within the kernel's 1024 buffers per `recvmsg`/`sendmsg`."""


class _NoSizedGets(Exception):
    """The server does not know STRATA.MGETSIZED (an older one): one GET per key from then on."""


def _timeval(seconds: float | None) -> bytes:
    """SO_RCVTIMEO/SO_SNDTIMEO's struct timeval; None or 0: wait for ever."""
    whole = int(seconds or 0)
    return struct.pack("@ll", whole, int(((seconds or 0) - whole) * 1_000_000))


class KVClient:
    """Blocking client over TCP or a Unix socket; one request in flight per client.

    The socket stays in blocking mode and its timeouts are the kernel's (SO_SNDTIMEO, SO_RCVTIMEO), not Python's:
    with a Python timeout every send and receive is a poll and a non-blocking call, each returning to Python (and
    to the GIL, which an engine's scheduler thread holds) once per socket buffer's worth. A Unix socket's buffer
    is its sender's SO_SNDBUF, which a stock node caps at 416 KiB (net.core.wmem_max): an 8 MiB chunk cost 20
    sends and 21 polls there against 2 and 3 over TCP, whose buffers grow by themselves. Blocking, the kernel
    moves a whole chunk in one `sendmsg` and one `recv_into(MSG_WAITALL)` over either transport.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 6379,
        unix_socket: str | None = None,
        token: str | bytes | None = None,
        timeout: float | None = 30.0,
    ) -> None:
        if unix_socket:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            widen_unix_send_buffer(self._sock)
            self._sock.settimeout(timeout)
            self._sock.connect(unix_socket)
        else:
            self._sock = socket.create_connection((host, port), timeout=timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.settimeout(timeout)
        self._buffer = bytearray(RECEIVE_AHEAD)
        self._start = self._end = 0  # what of `_buffer` holds received bytes not yet taken
        self._shared_memory = bool(unix_socket)
        """Whether `get_into` asks for memory (STRATA.GETFD): on a Unix socket until the server says it is off."""
        self._sized_gets = True
        """Whether `get_many_into` asks for STRATA.MGETSIZED: until the server says it does not know it."""
        if token is not None:
            self.call("AUTH", token)

    def close(self) -> None:
        self._sock.close()

    def settimeout(self, timeout: float | None) -> None:
        """Bound each later send and receive (the constructor's timeout also bounds the connect): the kernel's
        timeouts on a blocking socket (see the class)."""
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _receive(self, into: memoryview, flags: int = 0) -> int:
        """One `recv_into`; a kernel timeout (EAGAIN on a blocking socket) is raised as the TimeoutError it is."""
        try:
            n = self._sock.recv_into(into, into.nbytes, flags)
        except BlockingIOError as e:
            raise TimeoutError("timed out waiting for the KV server") from e
        if not n:
            raise ConnectionError("server closed the connection mid-reply")
        return n

    def _readline(self) -> bytes:
        """One reply line, CRLF included."""
        while True:
            end = self._buffer.find(b"\r\n", self._start, self._end)
            if end >= 0:
                line = bytes(self._buffer[self._start : end + 2])
                self._start = end + 2
                return line
            if self._start == self._end:
                self._start = self._end = 0
            elif self._end - self._start >= len(self._buffer):  # a line longer than the buffer: make room
                self._buffer.extend(bytes(len(self._buffer)))
            elif self._end == len(self._buffer):  # move what is left to the front
                self._buffer[: self._end - self._start] = self._buffer[self._start : self._end]
                self._start, self._end = 0, self._end - self._start
            self._end += self._receive(memoryview(self._buffer)[self._end :])

    def _readinto(self, target: memoryview) -> None:
        """Fill `target` (format "B"): what was received ahead first, the rest in one waiting receive per try."""
        have = min(self._end - self._start, target.nbytes)
        target[:have] = self._buffer[self._start : self._start + have]
        self._start += have
        while have < target.nbytes:
            have += self._receive(target[have:], socket.MSG_WAITALL)

    def _read_exact(self, n: int) -> bytes:
        data = bytearray(n)
        self._readinto(memoryview(data))
        return bytes(data)

    def _read_reply(self) -> Reply:
        line = self._readline()
        is_array, value = _decode(line[0], line[1:-2], self._read_exact)
        if is_array:
            return None if value < 0 else [self._read_reply() for _ in range(value)]
        return value

    def _sendall(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except BlockingIOError as e:
            raise TimeoutError("timed out sending to the KV server") from e

    def call(self, *args: bytes | str | int) -> Reply:
        """Send one command, return its reply; raise KVError on an error reply."""
        self._sendall(command(*args))
        reply = self._read_reply()
        if isinstance(reply, KVError):
            raise reply
        return reply

    def set_from(self, key: bytes, value: memoryview | bytes) -> None:
        """SET `key` to the bytes of `value`, sent straight from that buffer (no joined copy of a large chunk)."""
        _, error = self.set_many_from([(key, value)])
        if error is not None:
            raise error

    def set_many_from(self, items: Sequence[tuple[bytes, memoryview | bytes]]) -> tuple[list[bool], KVError | None]:
        """SET each key to the bytes of the buffer beside it (sent straight from it), all at once: which were
        stored, and the first error reply (None if none). Every reply is read before this returns.

        Why not `set_from` per key: as for `get_many_into`, each return from a blocking call waits for the GIL in
        an engine, and one SET at a time returns twice per chunk (its send, its reply). Here up to GET_MANY_BYTES
        of SETs go in one `sendmsg`, and their replies come in one waiting receive of as many bytes as that many
        `+OK`s: an error reply is longer, so that many bytes always come, and anything else than the `+OK`s is
        then read reply by reply."""
        stored: list[bool] = []
        error: KVError | None = None
        first = 0
        while first < len(items):
            window: list[tuple[bytes, memoryview]] = []
            size = 0
            for key, value in items[first:]:
                view = memoryview(value).cast("B")
                if window and (size + view.nbytes > GET_MANY_BYTES or len(window) == KEYS_AT_ONCE):
                    break
                window.append((key, view))
                size += view.nbytes
            first += len(window)
            parts: list[memoryview] = []
            for key, view in window:
                header = b"*3\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n" % (len(key), key, view.nbytes)
                parts += [memoryview(header), view, memoryview(b"\r\n")]
            self._send_parts(parts)
            all_ok = b"+OK\r\n" * len(window)
            self._buffer_at_least(len(all_ok))
            if self._buffer[self._start : self._start + len(all_ok)] == all_ok:
                self._start += len(all_ok)
                stored += [True] * len(window)
                continue
            for _ in window:
                reply = self._read_reply()
                if isinstance(reply, KVError):
                    error = error or reply
                elif reply != "OK":
                    raise ConnectionError(f"SET answered {reply!r}: the connection is out of step")
                stored.append(reply == "OK")
        return stored, error

    def _buffer_at_least(self, n: int) -> None:
        """Wait until `n` received bytes are in the buffer, in one waiting receive: the caller knows that many come."""
        have = self._end - self._start
        if have >= n:
            return
        if self._start + n > len(self._buffer):
            self._buffer[:have] = self._buffer[self._start : self._end]
            self._start, self._end = 0, have
            if n > len(self._buffer):
                self._buffer.extend(bytes(n - len(self._buffer)))
        while self._end - self._start < n:
            self._end += self._receive(memoryview(self._buffer)[self._end : self._start + n], socket.MSG_WAITALL)

    def _send_parts(self, parts: list[memoryview]) -> None:
        """Send `parts` in one blocking `sendmsg` (more only after a signal or the timeout cut one short): each call
        is a trip through the kernel and back into the GIL, which the engine's other threads want."""
        while parts:
            try:
                sent = self._sock.sendmsg(parts)
            except BlockingIOError as e:
                raise TimeoutError("timed out sending to the KV server") from e
            while parts and sent >= parts[0].nbytes:
                sent -= parts[0].nbytes
                parts.pop(0)
            if sent:
                parts[0] = parts[0][sent:]

    def get_into(self, key: bytes, dest: memoryview) -> bool:
        """GET `key` straight into `dest`; False on a miss. A value of another size than `dest` is refused
        (read and dropped, the connection stays usable) with a KVError: it is not the chunk the caller expects.

        On a Unix socket to a server with `listen.shared_memory` a large value comes as the server's memory and
        is copied once (`get_shared_into`, about 4x the socket's speed here); the server's first "off" makes this
        connection use plain GET from then on."""
        if self._shared_memory:
            try:
                return shared_memory.get_shared_into(self._sock, key, dest)
            except shared_memory.SharedMemoryOff:
                self._shared_memory = False
            except shared_memory.OutOfStep as e:
                raise ConnectionError(str(e)) from e
            except shared_memory.SharedValueError as e:
                raise KVError(str(e)) from e
        self._sendall(command("GET", key))
        line = self._readline()
        if line[:1] != b"$":
            is_array, value = _decode(line[0], line[1:-2], self._read_exact)
            if is_array:
                raise KVError("GET answered with an array: the connection is out of step; reconnect")
            if isinstance(value, KVError):
                raise value
            raise KVError(f"GET answered {value!r}, not a bulk string")
        n = int(line[1:-2])
        if n < 0:
            return False
        target = memoryview(dest).cast("B")
        if n != target.nbytes:
            self._read_exact(n + 2)
            raise KVError(f"value of {key!r} is {n} bytes, the buffer for it {target.nbytes}")
        self._readinto(target)
        self._read_exact(2)
        return True

    def get_many_into(self, keys: Sequence[bytes], dests: Sequence[memoryview]) -> tuple[list[bool], KVError | None]:
        """GET each of `keys` straight into the buffer beside it (all of one size): which keys were found, and the
        first error (a value of another size than the buffers, or an error reply; None if none). Every reply is
        read before this returns, so the connection stays in step.

        Why not `get_into` per key: a tier's load job moves tens of chunks, and every return from a blocking call
        must win the GIL back from the engine's scheduler thread, which holds it while it spins (up to the 5 ms
        switch interval each time; bench/README.md). One GET at a time returns four times per chunk: its send,
        the reply's header, the bulk, its CRLF. `STRATA.MGETSIZED` answers up to GET_MANY_BYTES of chunks in
        one reply whose layout the request fixes, read with one send, one receive for its header (and what came
        along) and one waiting receive for the rest, scattered into the buffers. A server without the command
        (an older one, during an upgrade) gets one GET per key; so does the shared-memory path (STRATA.GETFD)."""
        if len(keys) != len(dests):
            raise ValueError(f"{len(keys)} keys for {len(dests)} buffers")
        targets = [memoryview(dest).cast("B") for dest in dests]
        sizes = {target.nbytes for target in targets}
        if len(sizes) > 1:
            raise ValueError(f"buffers of several sizes ({sorted(sizes)}): STRATA.MGETSIZED reads one size")
        found: list[bool] = []
        error: KVError | None = None
        size = sizes.pop() if sizes else 0
        per_request = max(1, min(KEYS_AT_ONCE, GET_MANY_BYTES // max(size, 1)))
        for first in range(0, len(keys), per_request):
            window = slice(first, first + per_request)
            if self._sized_gets and not self._shared_memory:
                try:
                    outcome = self._mget_sized(keys[window], targets[window], size)
                except _NoSizedGets:
                    self._sized_gets = False
                    outcome = self._get_each(keys[window], targets[window])
            else:
                outcome = self._get_each(keys[window], targets[window])
            found += outcome[0]
            error = error or outcome[1]
        return found, error

    def _get_each(self, keys: Sequence[bytes], targets: Sequence[memoryview]) -> tuple[list[bool], KVError | None]:
        found: list[bool] = []
        error: KVError | None = None
        for key, target in zip(keys, targets, strict=True):
            try:
                found.append(self.get_into(key, target))
            except KVError as e:
                found.append(False)
                error = error or e
        return found, error

    def _mget_sized(
        self, keys: Sequence[bytes], targets: Sequence[memoryview], size: int
    ) -> tuple[list[bool], KVError | None]:
        self._sendall(command("STRATA.MGETSIZED", size, *keys))
        line = self._readline()
        if line[:1] == b"-":
            message = line[1:-2].decode(errors="replace")
            if message.startswith("ERR unknown command"):
                raise _NoSizedGets(message)
            return [False] * len(keys), KVError(message)
        if line[:1] != b"$" or int(line[1:-2]) != len(keys) * (size + 1):
            raise ConnectionError(f"STRATA.MGETSIZED answered {line[:32]!r}: the connection is out of step")
        flags, ending = bytearray(len(keys)), bytearray(2)
        self._receive_all([memoryview(flags), *(t for t in targets if t.nbytes), memoryview(ending)])
        if ending != b"\r\n":
            raise ConnectionError("STRATA.MGETSIZED's reply did not end in CRLF: the connection is out of step")
        error = None
        for key, flag in zip(keys, flags, strict=True):
            if flag == SIZED_OTHER_SIZE:
                error = error or KVError(f"value of {key!r} is not {size} bytes, the size of its buffer")
            elif flag not in (SIZED_FOUND, SIZED_MISSING):
                raise ConnectionError(
                    f"STRATA.MGETSIZED flagged a key {bytes([flag])!r}: the connection is out of step"
                )
        return [flag == SIZED_FOUND for flag in flags], error

    def _receive_all(self, parts: list[memoryview]) -> None:
        """Fill every buffer of `parts` in order: first from what was received ahead, then in one waiting
        `recvmsg_into` (more only after a signal or the timeout cut one short)."""
        while parts and self._start < self._end:
            n = min(parts[0].nbytes, self._end - self._start)
            parts[0][:n] = self._buffer[self._start : self._start + n]
            self._start += n
            parts[0] = parts[0][n:]
            if not parts[0].nbytes:
                parts.pop(0)
        while parts:
            try:
                n = self._sock.recvmsg_into(parts, 0, socket.MSG_WAITALL)[0]
            except BlockingIOError as e:
                raise TimeoutError("timed out waiting for the KV server") from e
            if not n:
                raise ConnectionError("server closed the connection mid-reply")
            while parts and n >= parts[0].nbytes:
                n -= parts[0].nbytes
                parts.pop(0)
            if n:
                parts[0] = parts[0][n:]

    # -- conveniences -----------------------------------------------------------------------------
    def ping(self) -> bool:
        return self.call("PING") == "PONG"

    def set(self, key: bytes | str, value: bytes) -> None:
        self.call("SET", key, value)

    def get(self, key: bytes | str) -> bytes | None:
        result: bytes | None = self.call("GET", key)
        return result

    def get_shared(self, key: bytes) -> memoryview | bytes | None:
        """GET over the Unix socket of a server with `listen.shared_memory`: a read-only view of the value's own
        pages for a large value (copy out of it, then `release()` it), its bytes for a small one, None on a miss."""
        return shared_memory.get_shared(self._sock, key)

    def get_shared_into(self, key: bytes, dest: memoryview) -> bool:
        """Like `get_shared`, copied once into `dest` (exactly the value's size); False on a miss."""
        return shared_memory.get_shared_into(self._sock, key, dest)

    def exists(self, *keys: bytes | str) -> int:
        return int(self.call("EXISTS", *keys))

    def delete(self, *keys: bytes | str) -> int:
        return int(self.call("DEL", *keys))

    def put_chain(self, items: Sequence[tuple[bytes | str, bytes]]) -> None:
        """Store a prefix chain in order (head first), so eviction drops its tail before its head."""
        flat: list[bytes | str] = []
        for k, v in items:
            flat += [k, v]
        self.call("STRATA.MSETCHAIN", *flat)

    def prefix(self, keys: Sequence[bytes | str]) -> list[str]:
        """Tiers ('l1', 'fs', 's3') of the leading chunks of `keys` that are resident."""
        _n, tiers = self.call("STRATA.PREFIX", *keys)
        return [t.decode() for t in tiers]

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.call("STRATA.STATS"))
        return result


class AsyncKVClient:
    """asyncio client; create with `await AsyncKVClient.connect(...)`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 6379,
        unix_socket: str | None = None,
        token: str | bytes | None = None,
    ) -> AsyncKVClient:
        limit = 1024 * 1024
        if unix_socket:
            reader, writer = await asyncio.open_unix_connection(unix_socket, limit=limit)
        else:
            reader, writer = await asyncio.open_connection(host, port, limit=limit)
        client = cls(reader, writer)
        if token is not None:
            await client.call("AUTH", token)
        return client

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()

    async def _read_reply(self) -> Reply:
        line = await self._reader.readuntil(b"\r\n")
        kind, body = line[0], line[1:-2]
        if kind == 0x24 and int(body) >= 0:
            data = await self._reader.readexactly(int(body) + 2)
            return data[:-2]
        is_array, value = _decode(kind, body, lambda n: b"")
        if is_array:
            return None if value < 0 else [await self._read_reply() for _ in range(value)]
        return value

    async def call(self, *args: bytes | str | int) -> Reply:
        async with self._lock:
            self._writer.write(command(*args))
            await self._writer.drain()
            reply = await self._read_reply()
        if isinstance(reply, KVError):
            raise reply
        return reply

    async def set(self, key: bytes | str, value: bytes) -> None:
        await self.call("SET", key, value)

    async def get(self, key: bytes | str) -> bytes | None:
        result: bytes | None = await self.call("GET", key)
        return result

    async def exists(self, *keys: bytes | str) -> int:
        return int(await self.call("EXISTS", *keys))

    async def delete(self, *keys: bytes | str) -> int:
        return int(await self.call("DEL", *keys))

    async def prefix(self, keys: Sequence[bytes | str]) -> list[str]:
        _n, tiers = await self.call("STRATA.PREFIX", *keys)
        return [t.decode() for t in tiers]

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(await self.call("STRATA.STATS"))
        return result
