"""The bundled Python clients (sync and asyncio) against a real server, over TCP and the Unix socket."""

import asyncio

import pytest
from strata_kv.client import AsyncKVClient, KVClient, KVError
from strata_testsupport.kvserver import KVServerProcess

pytestmark = pytest.mark.integration


def test_sync_client_round_trip_over_the_unix_socket(kv_server: KVServerProcess) -> None:
    with KVClient(unix_socket=kv_server.unix_socket) as c:
        assert c.ping()
        c.set(b"\x00bin\xffkey", b"\x00" * 100_000)
        assert c.get(b"\x00bin\xffkey") == b"\x00" * 100_000
        assert c.exists(b"\x00bin\xffkey", "nope") == 1
        assert c.delete(b"\x00bin\xffkey") == 1
        assert c.get(b"\x00bin\xffkey") is None
        with pytest.raises(KVError, match="unknown command"):
            c.call("NOPE")
        assert c.ping()  # still in step after an error reply


async def test_async_client_concurrent_calls_share_one_connection(kv_server: KVServerProcess) -> None:
    c = await AsyncKVClient.connect("127.0.0.1", kv_server.port)
    try:
        values = {f"async:{i}": bytes([i]) * (i * 1000 + 1) for i in range(20)}
        await asyncio.gather(*(c.set(k, v) for k, v in values.items()))
        got = await asyncio.gather(*(c.get(k) for k in values))
        assert got == list(values.values())
        assert await c.exists(*values) == 20
        assert await c.prefix(list(values)[:3]) == ["l1", "l1", "l1"]
        assert (await c.stats())["l1_keys"] >= 20
        assert await c.delete(*values) == 20
    finally:
        await c.close()
