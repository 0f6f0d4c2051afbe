"""RESP2 codec: an incremental request parser and reply encoders. No I/O.

Replies are byte-exact with Redis (LMCache compares reply headers as raw bytes). Large values are
returned as separate parts so the server can hand them to the transport without joining.
"""

from __future__ import annotations

from collections.abc import Iterable

from .valuepool import ValuePool, mapping_refused, value_buffer

CRLF = b"\r\n"
OK = b"+OK\r\n"
PONG = b"+PONG\r\n"
NULL_BULK = b"$-1\r\n"
NULL_ARRAY = b"*-1\r\n"
NULL3 = b"_\r\n"
EMPTY_ARRAY = b"*0\r\n"
ZERO = b":0\r\n"
ONE = b":1\r\n"

_MAX_HEADER_LINE = 64 * 1024  # a '*<n>' or '$<n>' line longer than this is garbage
_MAX_INLINE = 64 * 1024  # Redis's PROTO_INLINE_MAX_SIZE
_READ_CHUNK = 256 * 1024
_JOIN_BELOW = 256 * 1024  # one send for small replies; larger values are written without a copy
_BIG_VALUE = 256 * 1024  # values from this size get a buffer of their own, filled by recv_into
_SHRINK_ABOVE = 8 * 1024 * 1024  # give back a buffer grown for a huge value once it is consumed


class ProtocolError(Exception):
    """The byte stream is not RESP: reply with the error, then close the connection (out of step)."""


class RequestTooLarge(ProtocolError):
    """A bulk string or the whole request exceeds a configured limit."""


class CommandRefused(Exception):
    """A command read in full but not run: the memory for one of its large values could not be had.

    The connection stays in step (the value's bytes were read and dropped), so the client gets an error reply
    for this command alone. `value_bytes` is the size of the value that was dropped.
    """

    def __init__(self, message: str, value_bytes: int) -> None:
        super().__init__(message)
        self.value_bytes = value_bytes


class RequestParser:
    """Take bytes in, complete commands (lists of byte strings) out.

    Handles RESP multibulk requests (what every client library sends) and inline commands
    (`PING\\r\\n`, as typed into telnet). Keeps partial state between reads, so a multi-MiB value
    split across many reads is never re-scanned. `get_buffer`/`buffer_updated` let an
    `asyncio.BufferedProtocol` receive straight into the parser's buffer (one copy less per value).
    """

    def __init__(
        self,
        max_bulk: int = 512 * 1024**2,
        max_args: int = 1024 * 1024,
        max_request: int = 1024**3,
        pool: ValuePool | None = None,
    ) -> None:
        self.pool = pool  # where large values' buffers come from (recycled mappings); None: always new ones
        self.max_bulk = max_bulk
        self.max_args = max_args
        self.max_request = max_request
        self._buf = bytearray(_READ_CHUNK)
        self._pos = 0  # first unconsumed byte
        self._end = 0  # end of received bytes
        self._args: list[bytes] | None = None
        self._need = 0
        self._bulk = -1
        self._request_bytes = 0
        self._big: memoryview | None = None  # a large value being received straight into its own mapping
        self._big_filled = 0
        self._big_want = 0  # a large value announced whose buffer is not taken yet (see `get_buffer`)
        self._big_head = (0, 0)  # where its first bytes, which arrived with the header, lie in _buf (start, length)
        self.big_values_started = 0  # large values begun so far (the server reserves memory for each)
        self._dropping = 0  # bytes still to read and drop of a large value that got no buffer (`_take_big`)
        self._refused: CommandRefused | None = None  # why the command being read will not run
        self._scratch: memoryview | None = None  # where the dropped bytes are read into
        self._crlf_pending = False
        self._pre_auth: tuple[int, int] | None = None  # (bulk, multibulk) limits until AUTH succeeds

    def limit_until_authenticated(self, max_bulk: int, max_args: int) -> None:
        """Refuse bulks and multibulks above these sizes until `authenticated` is called.

        A client that has not proven it knows the token has no business announcing large requests;
        the errors are Redis's own for the same rule.
        """
        self._pre_auth = (max_bulk, max_args)

    def authenticated(self) -> None:
        """The client authenticated: only the configured limits apply from now on."""
        self._pre_auth = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed by a complete command."""
        return self._end - self._pos

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Free space to receive into: at least a read chunk, or the rest of a large pending value."""
        if self._big_want:
            self._take_big()
        if self._big is not None:
            return self._big[self._big_filled :]
        if self._dropping:
            if self._scratch is None:
                self._scratch = memoryview(bytearray(_READ_CHUNK))
            return self._scratch[: self._dropping]
        if self._pos == self._end:
            self._pos = self._end = 0
            if len(self._buf) > _SHRINK_ABOVE:
                self._buf = bytearray(_READ_CHUNK)
        need = _READ_CHUNK
        if self._bulk >= 0:
            need = max(need, self._pos + self._bulk + 2 - self._end)
        if len(self._buf) - self._end < need:
            if self._pos:
                live = self._end - self._pos
                self._buf[:live] = self._buf[self._pos : self._end]
                self._pos, self._end = 0, live
            short = need - (len(self._buf) - self._end)
            if short > 0:
                self._buf.extend(bytes(short))
        return memoryview(self._buf)[self._end :]

    def release(self) -> None:
        """Drop every buffer and any half-received command (the connection is gone).

        Freeing them here, not when the parser object dies, matters: a closed connection can stay
        reachable for a while (a cancelled task's traceback points back at it) and the cyclic
        collector runs on object counts, not bytes, so a half-sent 512 MiB value could outlive it.
        """
        self._buf = bytearray()
        self._pos = self._end = 0
        self._args, self._bulk, self._need, self._request_bytes = None, -1, 0, 0
        self._big, self._big_filled, self._big_want, self._big_head = None, 0, 0, (0, 0)
        self._crlf_pending = False
        self._dropping, self._refused, self._scratch = 0, None, None

    @property
    def big_remaining(self) -> int:
        """Bytes of the large value now announced or being received that have not arrived yet, or 0."""
        if self._big is not None:
            return len(self._big) - self._big_filled
        return self._big_want - self._big_head[1] if self._big_want else 0

    @property
    def receiving(self) -> int:
        """The announced size of the large value being received now, or 0."""
        return len(self._big) if self._big is not None else self._big_want

    def _take_big(self) -> None:
        """Take the buffer for the announced large value, now that bytes are wanted for it.

        Taken this late, not when the header arrives, so a connection the server holds back (its
        in-flight budget is spent) holds no buffer, and a recycled, fully resident one least of all.
        """
        want, (start, have) = self._big_want, self._big_head
        try:
            big = self.pool.take(want) if self.pool is not None else value_buffer(want, shared=False)
        except OSError as e:  # ENOMEM: out of address space or memory areas; drop the value, keep the connection
            self._refused = CommandRefused("OOM " + mapping_refused(want, e), want)
            self._dropping, self._big_want, self._big_head = want - have, 0, (0, 0)
            assert self._args is not None
            self._args.append(b"")  # in its place; the command is refused once read to its end
            self._crlf_pending = True
            return
        with memoryview(self._buf) as view:  # the head is still where it arrived: nothing reads into _buf before this
            big[:have] = view[start : start + have]
        self._big, self._big_filled, self._big_want, self._big_head = big, have, 0, (0, 0)

    def buffer_updated(self, nbytes: int) -> None:
        if self._big is not None:
            self._big_filled += nbytes
        elif self._dropping:
            self._dropping -= nbytes
        else:
            self._end += nbytes

    def feed(self, data: bytes) -> None:
        """Copy `data` in (for callers that are not buffered protocols, and for tests)."""
        view = memoryview(data)
        while view:
            with self.get_buffer(len(view)) as free:
                n = min(len(free), len(view))
                free[:n] = view[:n]
            self.buffer_updated(n)
            view = view[n:]

    def _line(self) -> int | None:
        nl = self._buf.find(CRLF, self._pos, self._end)
        if nl < 0:
            if self._end - self._pos > _MAX_HEADER_LINE:
                raise ProtocolError("Protocol error: too big count string")
            return None
        return nl

    def _count(self, nl: int, what: str, limit: int) -> int:
        raw = bytes(self._buf[self._pos + 1 : nl])
        try:
            n = int(raw)
        except ValueError:
            n = None
        if n is None or not raw.lstrip(b"-").isdigit() or len(raw) > 20:
            raise ProtocolError(f"Protocol error: invalid {what} length")
        if self._pre_auth is not None and n > self._pre_auth[0 if what == "bulk" else 1]:
            raise RequestTooLarge(f"Protocol error: unauthenticated {what} length")
        if n > limit:
            if what == "bulk":
                raise RequestTooLarge(
                    f"value of {n} bytes exceeds limits.max_value_size ({limit} bytes); "
                    "store smaller chunks or raise the limit"
                )
            raise RequestTooLarge(f"Protocol error: invalid {what} length")
        return n

    def get_command(self) -> list[bytes] | None:
        """The next complete command, or None until more bytes arrive.

        Raises ProtocolError (the stream is out of step: answer and close) or CommandRefused (this command alone
        failed; the next one follows)."""
        buf = self._buf
        while self._args is None:
            if self._pos >= self._end:
                return None
            if buf[self._pos] != 0x2A:  # '*'
                inline = self._inline()
                if inline is None or inline:
                    return inline
                continue  # empty line: ignored, like Redis
            nl = self._line()
            if nl is None:
                return None
            n = self._count(nl, "multibulk", self.max_args)
            self._pos = nl + 2
            if n <= 0:
                continue
            self._args, self._need, self._bulk, self._request_bytes = [], n, -1, 0
        args = self._args
        while len(args) < self._need or self._crlf_pending:
            if self._big_want or self._dropping:
                return None  # nothing of it can be here yet: the next get_buffer takes its buffer
            if self._big is not None:
                if self._big_filled < len(self._big):
                    return None
                args.append(self._big)  # type: ignore[arg-type]  # a memoryview: compares, slices and sends as bytes
                self._big, self._crlf_pending = None, True
            if self._crlf_pending:
                if self._end - self._pos < 2:
                    return None
                if buf[self._pos : self._pos + 2] != CRLF:
                    raise ProtocolError("Protocol error: bulk string not terminated by CRLF")
                self._pos += 2
                self._crlf_pending = False
                continue
            if self._bulk < 0:
                if self._pos >= self._end:
                    return None
                if buf[self._pos] != 0x24:  # '$'
                    raise ProtocolError(f"Protocol error: expected '$', got '{chr(buf[self._pos])}'")
                nl = self._line()
                if nl is None:
                    return None
                n = self._count(nl, "bulk", self.max_bulk)
                if n < 0:
                    raise ProtocolError("Protocol error: invalid bulk length")
                self._request_bytes += n
                if self._request_bytes > self.max_request:
                    raise RequestTooLarge(
                        f"request of more than {self.max_request} bytes exceeds limits.max_request_size"
                    )
                self._pos = nl + 2
                self._bulk = n
            if self._bulk >= _BIG_VALUE:  # receive the rest straight into the value's own mapping
                have = min(self._end - self._pos, self._bulk)
                self._big_head = (self._pos, have)
                self._pos += have
                self._big_want, self._bulk = self._bulk, -1
                self.big_values_started += 1
                if have == self._big_want:
                    self._take_big()  # all of it is here already
                continue
            end = self._pos + self._bulk
            if self._end < end + 2:
                return None
            if buf[end : end + 2] != CRLF:
                raise ProtocolError("Protocol error: bulk string not terminated by CRLF")
            with memoryview(buf) as view:
                args.append(bytes(view[self._pos : end]))
            self._pos = end + 2
            self._bulk = -1
        self._args = None
        if self._refused is not None:
            refused, self._refused = self._refused, None
            raise refused
        return args

    def _inline(self) -> list[bytes] | None:
        nl = self._buf.find(b"\n", self._pos, self._end)
        if nl < 0:
            if self._end - self._pos > _MAX_INLINE:
                raise ProtocolError("Protocol error: too big inline request")
            return None
        line = bytes(self._buf[self._pos : nl]).rstrip(b"\r")
        self._pos = nl + 1
        if b'"' in line or b"'" in line:
            raise ProtocolError("Protocol error: quoted inline arguments are not supported; use RESP arrays")
        return line.split()


def is_big(arg: bytes) -> bool:
    """Whether a parsed argument was received into a buffer of its own.

    Values of 256 KiB and up are received in place into an anonymous mapping of exactly their size
    (`valuepool`) and stored as is: no growth, no joins, no copies. The kernel backs it only as bytes
    arrive, so announcing a size costs address space, not memory.
    """
    return isinstance(arg, memoryview)


# -- reply encoders ---------------------------------------------------------------------------------
def simple(text: str) -> bytes:
    if "\r" in text or "\n" in text:
        raise ValueError("simple strings cannot contain CR or LF")
    return b"+" + text.encode() + CRLF


def error(message: str) -> bytes:
    """`-ERR ...` (or another code when the message starts with an upper-case word like WRONGPASS)."""
    message = message.replace("\r", " ").replace("\n", " ")
    head = message.split(" ", 1)[0]
    if not (head.isupper() and head.isalpha()):
        message = "ERR " + message
    return b"-" + message.encode() + CRLF


def integer(n: int) -> bytes:
    return b":%d\r\n" % n


def null(proto: int = 2) -> bytes:
    """RESP2 null bulk `$-1`, or RESP3's null `_` after HELLO 3."""
    return NULL_BULK if proto < 3 else NULL3


def bulk(value: bytes | None, proto: int = 2) -> list[bytes]:
    """Bulk string parts; large values stay a separate part (no copy)."""
    if value is None:
        return [null(proto)]
    if len(value) <= _JOIN_BELOW:
        return [b"$%d\r\n%b\r\n" % (len(value), value)]
    return [b"$%d\r\n" % len(value), value, CRLF]


class Map(dict[bytes, "Reply"]):
    """A reply that is a RESP3 map (`%`), or a flat name/value array under RESP2."""


Reply = bytes | int | str | None | list["Reply"] | Map


def encode(reply: Reply, proto: int = 2) -> list[bytes]:
    """Encode nested replies: bytes/str -> bulk, int -> integer, None -> null, list -> array, Map -> map."""
    if isinstance(reply, bool):
        return [ONE if reply else ZERO]
    if isinstance(reply, int):
        return [integer(reply)]
    if isinstance(reply, str):
        return bulk(reply.encode())
    if reply is None or isinstance(reply, bytes):
        return bulk(reply, proto)
    if isinstance(reply, Map):
        if proto < 3:
            return encode([x for kv in reply.items() for x in kv], proto)
        parts = [b"%%%d\r\n" % len(reply)]
        for k, v in reply.items():
            parts += encode(k, proto) + encode(v, proto)
        return parts
    parts = [b"*%d\r\n" % len(reply)]
    for item in reply:
        parts.extend(encode(item, proto))
    return parts


def array(items: Iterable[Reply], proto: int = 2) -> list[bytes]:
    return encode(list(items), proto)


SIZED_FOUND, SIZED_MISSING, SIZED_OTHER_SIZE = ord("1"), ord("0"), ord("x")
"""STRATA.MGETSIZED's byte per key: its value follows, the key is missing, its value is not the size asked
(`server/commands.cmd_strata_mgetsized`, `client.KVClient.get_many_into`); zeros stand in for the last two."""


def command(*args: bytes | str | int) -> bytes:
    """Encode a request (used by the client): an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(b), b))
    return b"".join(out)
