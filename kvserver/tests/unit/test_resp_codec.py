"""The RESP codec against the protocol spec's own byte strings (redis.io/docs/reference/protocol-spec)."""

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strata_kv.wire import resp


def parse_all(data: bytes, **limits: int) -> list[list[bytes]]:
    p = resp.RequestParser(**limits)
    p.feed(data)
    out = []
    while (cmd := p.get_command()) is not None:
        out.append(cmd)
    return out


def test_spec_example_llen_request() -> None:
    # The spec's example of a client request: LLEN mylist
    assert parse_all(b"*2\r\n$4\r\nLLEN\r\n$6\r\nmylist\r\n") == [[b"LLEN", b"mylist"]]


def test_binary_safe_bulk_with_crlf_inside() -> None:
    assert parse_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n") == [[b"SET", b"k", b"a\r\nb"]]


def test_empty_bulk_string_is_an_argument() -> None:
    assert parse_all(b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n") == [[b"GET", b""]]


def test_pipelined_requests_come_out_in_order() -> None:
    data = b"*1\r\n$4\r\nPING\r\n" * 3 + b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n"
    assert parse_all(data) == [[b"PING"]] * 3 + [[b"ECHO", b"hi"]]


def test_inline_commands_as_typed_into_telnet() -> None:
    assert parse_all(b"PING\r\nEXISTS somekey\n\r\n") == [[b"PING"], [b"EXISTS", b"somekey"]]


def test_empty_multibulk_is_skipped() -> None:
    assert parse_all(b"*0\r\n*1\r\n$4\r\nPING\r\n") == [[b"PING"]]


@pytest.mark.parametrize(
    "bad",
    [
        b"*2\r\n$3\r\nGET\r\n:1\r\n",  # integer where a bulk string belongs
        b"*1\r\n$x\r\n",  # non-numeric length
        b"*abc\r\n",
        b"*1\r\n$3\r\nGETXX",  # bulk not followed by CRLF
        b"*1\r\n$-5\r\n",
        b"*1\r\n$ 3\r\nGET\r\n",
    ],
)
def test_malformed_requests_raise_protocol_error(bad: bytes) -> None:
    with pytest.raises(resp.ProtocolError):
        parse_all(bad)


def test_oversized_value_is_refused_before_it_is_buffered() -> None:
    with pytest.raises(resp.RequestTooLarge, match="max_value_size"):
        parse_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000\r\n", max_bulk=100)


def test_endless_header_line_is_refused() -> None:
    with pytest.raises(resp.ProtocolError):
        parse_all(b"*" + b"9" * 70000)


def test_partial_input_yields_nothing_until_complete() -> None:
    p = resp.RequestParser()
    whole = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n"
    for i in range(len(whole) - 1):
        p.feed(whole[i : i + 1])
        assert p.get_command() is None
    p.feed(whole[-1:])
    assert p.get_command() == [b"SET", b"key", b"value"]


@given(
    args=st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=5), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=40),
)
def test_any_split_of_a_request_stream_parses_the_same(args: list[list[bytes]], cuts: list[int]) -> None:
    stream = b"".join(resp.command(*a) for a in args)
    p = resp.RequestParser()
    got: list[list[bytes]] = []
    pos = 0
    for c in [*cuts, len(stream)]:
        p.feed(stream[pos : pos + c])
        pos += c
        while (cmd := p.get_command()) is not None:
            got.append(cmd)
    p.feed(stream[pos:])
    while (cmd := p.get_command()) is not None:
        got.append(cmd)
    assert got == args


def test_large_value_across_many_reads() -> None:
    value = bytes(range(256)) * 40000  # ~10 MiB, like LMCache's large chunks
    stream = resp.command("SET", "k", value)
    p = resp.RequestParser()
    for i in range(0, len(stream), 65536):
        p.feed(stream[i : i + 65536])
    assert p.get_command() == [b"SET", b"k", value]
    assert p.buffered == 0


# -- replies: the spec's literal bytes ---------------------------------------------------------------
def test_reply_bytes_match_the_spec() -> None:
    assert resp.OK == b"+OK\r\n"
    assert resp.NULL_BULK == b"$-1\r\n"
    assert resp.integer(0) == b":0\r\n"
    assert resp.integer(1000) == b":1000\r\n"
    assert b"".join(resp.bulk(b"hello")) == b"$5\r\nhello\r\n"
    assert b"".join(resp.bulk(b"")) == b"$0\r\n\r\n"
    assert b"".join(resp.encode([b"hello", b"world"])) == b"*2\r\n$5\r\nhello\r\n$5\r\nworld\r\n"
    assert b"".join(resp.encode([1, 2, 3])) == b"*3\r\n:1\r\n:2\r\n:3\r\n"
    assert b"".join(resp.encode([])) == b"*0\r\n"
    assert resp.error("unknown command 'foobar'") == b"-ERR unknown command 'foobar'\r\n"
    assert resp.error("WRONGTYPE Operation against a key") == b"-WRONGTYPE Operation against a key\r\n"


def test_large_bulk_reply_is_not_joined_but_byte_identical() -> None:
    value = b"x" * 300_000
    parts = resp.bulk(value)
    assert parts[1] is value
    assert b"".join(parts) == b"$300000\r\n" + value + b"\r\n"


def test_error_replies_cannot_break_the_stream() -> None:
    assert resp.error("bad\r\nthing") == b"-ERR bad  thing\r\n"


@pytest.mark.parametrize("read_size", [1000, 65536, 262144, 1 << 20])
def test_large_values_received_as_a_socket_would_deliver_them(read_size: int) -> None:
    """get_buffer/buffer_updated as asyncio's BufferedProtocol calls them, parsing after every read."""
    values = [bytes([i]) * (300_000 + i) for i in range(3)]
    stream = b"".join(resp.command("SET", f"k{i}", v) for i, v in enumerate(values)) + resp.command("PING")
    p = resp.RequestParser()
    got: list[list[bytes]] = []
    pos = 0
    while pos < len(stream):
        with p.get_buffer(-1) as free:
            n = min(len(free), read_size, len(stream) - pos)
            free[:n] = stream[pos : pos + n]
        p.buffer_updated(n)
        pos += n
        while (cmd := p.get_command()) is not None:
            got.append(cmd)
    assert got == [[b"SET", b"k%d" % i, v] for i, v in enumerate(values)] + [[b"PING"]]
    assert p.buffered == 0


def test_large_value_without_its_crlf_is_a_protocol_error() -> None:
    p = resp.RequestParser()
    p.feed(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$300000\r\n" + b"x" * 300_000 + b"XX")
    with pytest.raises(resp.ProtocolError, match="CRLF"):
        p.get_command()


@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_crash_the_parser(data: bytes) -> None:
    """Hostile input ends in commands, a wait for more bytes, or ProtocolError; never anything else."""
    p = resp.RequestParser(max_bulk=4096, max_args=64, max_request=8192)
    p.feed(data)
    try:
        while p.get_command() is not None:
            pass
    except resp.ProtocolError:
        pass


@given(st.lists(st.sampled_from([b"*", b"$", b"\r\n", b"3", b"-1", b"0", b"GET", b"x", b"\n", b"99"]), max_size=60))
def test_protocol_shaped_noise_never_crashes_the_parser(tokens: list[bytes]) -> None:
    p = resp.RequestParser(max_bulk=4096, max_args=64, max_request=8192)
    p.feed(b"".join(tokens))
    try:
        while p.get_command() is not None:
            pass
    except resp.ProtocolError:
        pass


def test_an_announced_huge_value_allocates_only_what_arrives() -> None:
    """A `$536870912` header is a claim, not data: 40 bytes must not reserve 512 MiB."""
    tracemalloc.start()
    try:
        p = resp.RequestParser()
        p.feed(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n" + b"x" * 1000)
        assert p.get_command() is None
        _, peak = tracemalloc.get_traced_memory()
        assert peak < 4 * 1024**2, f"{peak} bytes allocated for 1 KiB of a value"
        received = 1000
        for _ in range(10):  # 10 MiB more: the buffer grows with the data, at most about twice it
            p.feed(b"x" * 1024**2)
            received += 1024**2
        assert p.get_command() is None
        current, peak = tracemalloc.get_traced_memory()  # peak: a grow's zeroes are a transient copy
        assert current < 2 * received + 4 * 1024**2, f"{current} bytes held for {received} received"
        assert peak < 3 * received + 4 * 1024**2, f"{peak} bytes allocated for {received} received"
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("size", [256 * 1024, 300_001, 8 * 1024**2 + 3, 64 * 1024**2 + 1])
def test_growing_value_buffers_end_at_the_exact_size(size: int) -> None:
    value = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    stream = resp.command("SET", "k", value)
    p = resp.RequestParser()
    for i in range(0, len(stream), 1 << 20):
        p.feed(stream[i : i + (1 << 20)])
    got = p.get_command()
    assert got is not None and got[2] == value and len(got[2]) == size
    assert p.get_command() is None and p.buffered == 0


@pytest.mark.parametrize(
    ("request_bytes", "message"),
    [
        (b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n", "unauthenticated bulk length"),
        (b"*1000\r\n", "unauthenticated multibulk length"),
    ],
)
def test_limits_before_authentication(request_bytes: bytes, message: str) -> None:
    p = resp.RequestParser()
    p.limit_until_authenticated(max_bulk=16384, max_args=10)
    with pytest.raises(resp.RequestTooLarge, match=message):
        p.feed(request_bytes)
        p.get_command()
    p = resp.RequestParser()
    p.limit_until_authenticated(max_bulk=16384, max_args=10)
    p.feed(resp.command("AUTH", "x" * 16384))
    assert p.get_command() == [b"AUTH", b"x" * 16384]
    p.authenticated()
    p.feed(request_bytes)
    assert p.get_command() is None  # within the configured limits: waits for the rest
