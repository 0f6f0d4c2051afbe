"""STRATA.MGETSIZED on the wire, through redis-py (a client that knows nothing of it): the layout its request fixes,
and the refusals that keep a reply from growing past the server's limits."""

import pytest
import redis
from strata_testsupport.kvserver import KVServerProcess

pytestmark = pytest.mark.integration


def test_the_reply_is_a_byte_per_key_then_each_value_or_zeros(kv_server: KVServerProcess) -> None:
    r = redis.Redis(port=kv_server.port)
    r.set("sized/a", b"A" * 8)
    r.set("sized/short", b"S" * 3)
    r.set("sized/b", b"B" * 8)
    reply = r.execute_command("STRATA.MGETSIZED", 8, "sized/a", "sized/absent", "sized/short", "sized/b")
    assert reply == b"10x1" + b"A" * 8 + bytes(8) + bytes(8) + b"B" * 8
    assert r.execute_command("STRATA.MGETSIZED", 0, "sized/absent") == b"0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("eight", "sized/a"), "not an integer"),
        ((-1, "sized/a"), "size must be 0 to limits.max_value_size"),
        ((2**40, "sized/a"), "size must be 0 to limits.max_value_size"),
        ((8,), "wrong number of arguments"),
        ((512 * 1024**2, "sized/a", "sized/b", "sized/c"), "would exceed limits.max_output_buffer"),
    ],
)
def test_a_request_whose_reply_could_not_be_laid_out_or_sent_is_refused(
    kv_server: KVServerProcess, args: tuple[object, ...], message: str
) -> None:
    r = redis.Redis(port=kv_server.port)
    with pytest.raises(redis.ResponseError, match=message):
        r.execute_command("STRATA.MGETSIZED", *args)
    assert r.ping()
