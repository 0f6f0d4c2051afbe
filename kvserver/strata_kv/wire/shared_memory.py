"""GET by handing over memory: a large value's pages go to a client on the same node as a sealed memfd.

Over a Unix socket a GET of a large value costs two copies (into the kernel and out of it), which here
moves about 0.4x of one thread's memcpy bandwidth at best. With `listen.shared_memory`, large values
are received into memfd-backed mappings instead of anonymous ones, and `STRATA.GETFD key` answers a
client on the Unix socket with `:<size>` and the value's memfd attached (SCM_RIGHTS): the client copies
it once (`copy_from_memfd`), or maps it read-only and reads it where it lies.

Safety of what is handed over:
- Before its first export a value's memfd is sealed (`F_SEAL_FUTURE_WRITE`, `F_SEAL_SHRINK`,
  `F_SEAL_GROW`, `F_SEAL_SEAL`): no holder of the fd can write it, map it writable, resize it or
  reopen it writable through /proc; the server's own mapping keeps working.
- An exported value's mapping is never recycled for another value (`ValuePool.give` skips it), so
  bytes a client was given never change under it. Its pages are freed once L1 has dropped it and
  every client has closed its fd and unmapped it.
- Memory a client keeps mapped after L1 dropped the value stays charged to the server's cgroup until
  the client lets go: Strata's client (`KVClient.get_shared`) maps, and its caller copies and
  releases. What clients still hold is counted (`ExportHandle`, `server.exports`) and bounded per
  client and per server; past a budget a GETFD is answered inline.

Values below `SHARED_FROM`, values that came some other way (from L2, or while the process was out of file
descriptors) have no memfd: `STRATA.GETFD` then answers with an ordinary bulk reply, so a client handles both.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import mmap
import os
import socket
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)  # Linux 5.1; Python names it from 3.12
EXPORT_SEALS = F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
GETFD = b"STRATA.GETFD"
OFF_PREFIXES = ("ERR STRATA.GETFD is off", "ERR STRATA.GETFD answers only on the Unix socket")
"""The server's refusals that mean "never here" (commands.cmd_strata_getfd), as opposed to one failed call."""
MAX_HEADER = 64
SHARED_FROM = 1024 * 1024
"""Values of at least this size are memfd-backed (two fds each: the memfd and the mapping's own); smaller ones
are answered inline, where a copy costs less than the round of map and unmap."""


class ValueMapping(mmap.mmap):
    """A memfd's pages mapped read-write by the server; `fd` is what `export` hands out."""

    fd: int
    exported: bool


def shared_mapping(size: int) -> ValueMapping:
    """A memfd of exactly `size` bytes, mapped; the fd closes when the mapping is collected."""
    fd = os.memfd_create("strata-kv-value", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        m = ValueMapping(fd, size)
    except BaseException:
        os.close(fd)
        raise
    m.fd, m.exported = fd, False
    weakref.finalize(m, os.close, fd)
    return m


def exportable(value: object) -> ValueMapping | None:
    """The mapping behind `value` when it is a whole memfd-backed value, else None."""
    if isinstance(value, memoryview) and isinstance(value.obj, ValueMapping) and value.nbytes == len(value.obj):
        return value.obj
    return None


def export(m: ValueMapping) -> int:
    """Seal `m`'s memfd against every writer but the server's own mapping (once), make it unopenable through /proc
    by other users (mode 0400: a client of another uid keeps only what it was handed, which `ExportHandle`'s lock
    marks), and mark it never to be reused."""
    if not m.exported:
        fcntl.fcntl(m.fd, fcntl.F_ADD_SEALS, EXPORT_SEALS)
        os.fchmod(m.fd, 0o400)
        m.exported = True
    return m.fd


class ExportHandle:
    """What one hand-over sends: a read-only open file of the value's memfd of its own, holding a shared lock.

    The lock belongs to that open file, which every copy a client gets (its descriptor, its mapping, a dup, a
    fork) shares, and it goes only when the last of them does: so the server tells whether any client still
    holds a value it handed over (`still_handed_out`) without asking anyone. Closed by the server once sent (or
    not sent); closing twice is harmless."""

    def __init__(self, memfd: int) -> None:
        self.fd = os.open(f"/proc/self/fd/{memfd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    __del__ = close


def probe_handle(memfd: int) -> int:
    """An open file of the value's memfd for `still_handed_out`: it keeps the value's memory (hence its
    identity) until the server closes it."""
    return os.open(f"/proc/self/fd/{memfd}", os.O_RDONLY | os.O_CLOEXEC)


def still_handed_out(probe: int) -> bool:
    """Whether any `ExportHandle` of the memfd `probe` opened is still open anywhere (a client's descriptor,
    mapping or message in flight). False leaves `probe` locked: close it next."""
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False


@dataclass(frozen=True)
class SharedReply:
    """A reply that hands over a memfd: `header` is sent with `handle`'s descriptor attached; `fallback` is the
    same value as an ordinary bulk reply, sent instead when the header cannot go out alone right now (pipelined
    output queued). The writer closes `handle` either way."""

    header: bytes
    handle: ExportHandle
    fallback: list[bytes]

    def __len__(self) -> int:
        return len(self.header)


def send_with_fd(sock: socket.socket, data: bytes, fd: int) -> bool:
    """Send `data` with `fd` attached in one non-blocking `sendmsg`; False when the socket cannot take all of it
    now (nothing was sent then: the caller falls back)."""
    try:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
        sent = sock.sendmsg([data], rights, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    if sent != len(data):  # a header of a few bytes into an empty socket buffer: not seen, but never leave half
        raise ConnectionError(f"sent {sent} of {len(data)} header bytes with a memfd")
    return True


# -- the client side ----------------------------------------------------------------------------------
class SharedValueError(Exception):
    """The server answered `STRATA.GETFD` with an error, or a value of another size than the buffer; the
    connection is still in step."""


class SharedMemoryOff(SharedValueError):
    """The server runs without `listen.shared_memory` (or this is not its Unix socket): use GET."""


class OutOfStep(SharedValueError):
    """The reply did not parse as one: the connection must be closed."""


def get_shared(sock: socket.socket, key: bytes) -> memoryview | bytes | None:
    """`STRATA.GETFD key` on a connected Unix socket with nothing else in flight: a read-only view of the value's
    pages (handed over as a memfd), its bytes (the server had no memfd for it), or None on a miss.

    The view keeps the mapping alive; release it (`view.release()`, then drop it) when done, so the server's
    memory is given back once L1 drops the value.
    """
    with _asked(sock, key) as reply:
        if reply.size < 0:
            return None
        if reply.fd is not None:
            return memoryview(mmap.mmap(reply.fd, reply.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ))
        return _read_rest(sock, reply.rest, reply.size + 2)[:-2]


def get_shared_into(sock: socket.socket, key: bytes, dest: memoryview) -> bool:
    """`STRATA.GETFD key` straight into `dest` (exactly the value's size): one copy out of the handed-over memfd
    (`copy_from_memfd`), or from the socket for an inline reply. False on a miss."""
    target = dest.cast("B") if dest.format != "B" else dest
    if target.readonly:
        raise TypeError("get_shared_into needs a writable buffer")
    with _asked(sock, key) as reply:
        if reply.size < 0:
            return False
        if reply.size != target.nbytes:
            if reply.fd is None:
                _read_rest(sock, reply.rest, reply.size + 2)  # the connection stays in step
            raise SharedValueError(f"a value of {reply.size} bytes for a buffer of {target.nbytes}")
        if reply.fd is not None:
            copy_from_memfd(reply.fd, target)
        else:
            target[:] = _read_rest(sock, reply.rest, reply.size + 2)[:-2]
        return True


KERNEL_COPY_ALIGNMENT = 64
"""Destinations aligned to this many bytes are read by the kernel (`preadv`); others through a mapping."""
SPLIT_COPY_FROM = 8 * 1024 * 1024
"""Aligned copies of at least this many bytes are split over `COPY_THREADS` threads."""
COPY_THREADS = max(1, min(4, os.cpu_count() or 1))
"""The kernel copies a memfd's 4 KiB pages at 4-5 GB/s per thread here, about 0.6x of memcpy; two threads
reach 7-9 GB/s. More than four buys nothing on the machines measured."""
_SPLIT_ALIGNMENT = 2 * 1024 * 1024  # pieces start on huge-page (hence 64-byte) boundaries of the destination
_copiers: ThreadPoolExecutor | None = None


def _copier() -> ThreadPoolExecutor:
    global _copiers
    if _copiers is None:
        _copiers = ThreadPoolExecutor(COPY_THREADS - 1, thread_name_prefix="strata-kv-copy")
    return _copiers


def _forget_copiers() -> None:
    """A forked child has none of its parent's threads: it makes its own pool when it first needs one."""
    global _copiers
    _copiers = None


os.register_at_fork(after_in_child=_forget_copiers)


def copy_from_memfd(fd: int, target: memoryview) -> None:
    """Copy the first `target.nbytes` of memfd `fd` into `target` (format "B"), whichever way is faster for it.

    Into an aligned buffer (page-aligned like vLLM's CPU tier, or 64-byte like torch's and numpy's) `preadv`
    lets the kernel copy from the memfd's pages without building a mapping, which costs faulting in one
    page-table entry per 4 KiB; from `SPLIT_COPY_FROM` on, in pieces on `COPY_THREADS` threads (the kernel
    copies without the GIL). Into a buffer off that alignment (a bytearray of 32 MiB or more sits 16 bytes
    past a page) the kernel's copy falls to about 2 GB/s while user space realigns, so those go through a
    read-only mapping.
    """
    if _address(target) % KERNEL_COPY_ALIGNMENT:
        with mmap.mmap(fd, target.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mapped:
            target[:] = mapped
        return
    size = target.nbytes
    if size < SPLIT_COPY_FROM or COPY_THREADS == 1:
        _pread_exactly(fd, target, 0)
        return
    piece = -(-size // COPY_THREADS // _SPLIT_ALIGNMENT) * _SPLIT_ALIGNMENT
    starts = range(0, size, piece)
    others = [_copier().submit(_pread_exactly, fd, target[start : start + piece], start) for start in starts[1:]]
    try:
        _pread_exactly(fd, target[:piece], 0)
    finally:
        for future in others:
            future.result()  # every piece done (or its error raised) before the caller may reuse `target`


def _pread_exactly(fd: int, target: memoryview, offset: int) -> None:
    done = 0
    while done < target.nbytes:
        n = os.preadv(fd, [target[done:]], offset + done)
        if n == 0:
            raise SharedValueError(f"the handed-over value ended after {offset + done} bytes")
        done += n


def _address(view: memoryview) -> int:
    """Where a writable buffer starts in memory (read through ctypes, which borrows the buffer for the call)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


@dataclass(frozen=True)
class _Reply:
    fd: int | None  # the value's memfd, or None: its bytes follow inline
    size: int  # -1: a miss
    rest: bytearray  # bytes of an inline value read along with the header


@contextlib.contextmanager
def _asked(sock: socket.socket, key: bytes) -> Iterator[_Reply]:
    """Send `STRATA.GETFD key` and read its reply's header; every descriptor that came is closed afterwards."""
    sock.sendall(b"*2\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(GETFD), GETFD, len(key), key))
    data, fds = _read_header(sock)
    try:
        end = data.index(b"\r\n")
        kind, line, rest = data[:1], data[1:end], data[end + 2 :]
        if kind == b":":
            if len(fds) != 1 or rest:
                raise OutOfStep(f"a shared reply came with {len(fds)} fds and {len(rest)} extra bytes")
            yield _Reply(fds[0], int(line), bytearray())
        elif kind == b"$":
            yield _Reply(None, int(line), bytearray(rest))
        elif kind == b"-":
            message = line.decode(errors="replace")
            raise (SharedMemoryOff if message.startswith(OFF_PREFIXES) else SharedValueError)(message)
        else:
            raise OutOfStep(f"unexpected reply {data[:32]!r}: the connection is out of step; reconnect")
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_header(sock: socket.socket) -> tuple[bytes, list[int]]:
    """Read until a reply line is complete, keeping any fd that comes with it."""
    data, fds = b"", []
    while b"\r\n" not in data:
        chunk, got, _flags, _addr = socket.recv_fds(sock, 256 * 1024, 1)
        fds.extend(got)
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise ConnectionError("server closed the connection")
        data += chunk
        if len(data) > MAX_HEADER and b"\r\n" not in data:
            raise OutOfStep("reply header too long: the connection is out of step; reconnect")
    return data, fds


def _read_rest(sock: socket.socket, have: bytearray, want: int) -> bytes:
    if len(have) < want:
        view = memoryview(bytearray(want))
        view[: len(have)] = have
        got = len(have)
        while got < want:
            n = sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("server closed the connection mid-reply")
            got += n
        return bytes(view)
    return bytes(have[:want])
