"""The large-value bench's ceiling server (`bench/null_server.c`), compiled by the bench and driven by redis-py:
it must answer like a server, or the ceiling it gives measures a broken exchange."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.integration
BENCH = Path(__file__).resolve().parents[3] / "bench" / "kv_large.py"


def kv_large():
    spec = importlib.util.spec_from_file_location("kv_large", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kv_large"] = module
    spec.loader.exec_module(module)
    return module


def test_the_null_server_takes_sets_and_answers_gets_with_its_reply() -> None:
    bench = kv_large()
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
