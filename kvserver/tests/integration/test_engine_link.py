"""The engine-side link to a real `strata-kv` process: zero-copy SET/GET of chunk buffers, timeouts, the breaker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from strata_kv.client import KVError
from strata_kv.vllm.engine_link import CircuitBreaker, Endpoint, EngineLink, ServerUnavailable
from strata_testsupport.kvserver import KVServerFactory

pytestmark = pytest.mark.integration

KVSERVER = Path(__file__).resolve().parents[2]


def test_chunks_go_out_of_and_back_into_buffers_bit_exact(kv_server_factory: KVServerFactory) -> None:
    server = kv_server_factory(l2_fs=False)
    link = EngineLink(Endpoint(port=server.port))
    source = bytearray(range(256)) * 4096  # 1 MiB
    dest = bytearray(len(source))
    link.call(lambda c: c.set_from(b"ns/chunk-1", memoryview(source)))
    assert link.call(lambda c: c.get_into(b"ns/chunk-1", memoryview(dest))) is True
    assert dest == source
    assert link.call(lambda c: c.get_into(b"ns/absent", memoryview(dest))) is False
    with pytest.raises(KVError, match="1048576 bytes, the buffer for it 10"):
        link.call(lambda c: c.get_into(b"ns/chunk-1", memoryview(bytearray(10))))
    # The refused value was read off the wire: the same pooled connection still answers in step.
    assert link.call(lambda c: c.get_into(b"ns/chunk-1", memoryview(dest))) is True
    assert link.connects == 1


def test_unix_socket_endpoint(kv_server_factory: KVServerFactory) -> None:
    server = kv_server_factory(l2_fs=False)
    assert server.unix_socket
    link = EngineLink(Endpoint.parse(f"unix://{server.unix_socket}"))
    link.call(lambda c: c.set_from(b"k", b"v" * 100))
    assert link.call(lambda c: c.get(b"k")) == b"v" * 100


def test_a_dead_server_opens_the_breaker_and_calls_fail_without_io(kv_server_factory: KVServerFactory) -> None:
    server = kv_server_factory(l2_fs=False)
    link = EngineLink(Endpoint(port=server.port), breaker=CircuitBreaker(failure_threshold=2, reset_after_s=3600))
    assert link.call(lambda c: c.ping())
    server.kill()
    for _ in range(2):
        with pytest.raises(OSError) as failed:
            link.call(lambda c: c.ping())
        assert not isinstance(failed.value, ServerUnavailable)
    assert link.stale_connections == 1  # the pooled connection was tried once, then a new one was refused
    connects = link.connects
    with pytest.raises(ServerUnavailable):
        link.call(lambda c: c.ping())
    assert link.breaker.opens == 1 and link.connects == connects


def test_the_breaker_lets_one_probe_through_and_closes_when_the_server_is_back(
    kv_server_factory: KVServerFactory,
) -> None:
    server = kv_server_factory(l2_fs=False)
    link = EngineLink(Endpoint(port=server.port), breaker=CircuitBreaker(failure_threshold=1, reset_after_s=0))
    server.kill()
    with pytest.raises(OSError):
        link.call(lambda c: c.ping())
    assert link.breaker.is_open
    server.restart()
    assert link.call(lambda c: c.ping())
    assert not link.breaker.is_open


def test_connections_the_server_closed_while_idle_are_replaced_and_the_call_runs_again(
    kv_server_factory: KVServerFactory,
) -> None:
    """The server closes connections idle past `limits.idle_timeout_seconds` (an engine quiet for a while). The
    link's next call runs again on a new connection: the caller sees no error, the breaker no failure (one would
    open it here), and the pool's other stale connection goes with the first."""
    server = kv_server_factory({"limits": {"idle_timeout_seconds": 0.5}}, l2_fs=False)
    link = EngineLink(
        Endpoint(port=server.port), max_idle=2, breaker=CircuitBreaker(failure_threshold=1, reset_after_s=3600)
    )
    value = bytes(range(256)) * 64
    link.call(lambda c: c.set_from(b"ns/chunk", value))
    assert link.call(lambda outer: link.call(lambda inner: inner.ping()) and outer.ping())  # two in the pool
    assert link.connects == 2
    deadline = time.monotonic() + 30
    while server.log().count("idle_timeout") < 2:
        assert time.monotonic() < deadline, f"the server closed no idle connection:\n{server.log()}"
        time.sleep(0.05)
    dest = bytearray(len(value))
    assert link.call(lambda c: c.get_into(b"ns/chunk", memoryview(dest))) is True
    assert dest == value
    assert link.stale_connections == 1 and link.connects == 3 and not link.breaker.is_open
    assert link.call(lambda c: c.ping()) and link.connects == 3  # the new connection went back to the pool


def test_a_restarted_server_is_reached_on_the_next_call_without_a_failure(kv_server_factory: KVServerFactory) -> None:
    server = kv_server_factory(l2_fs=False)
    link = EngineLink(Endpoint(port=server.port), breaker=CircuitBreaker(failure_threshold=1, reset_after_s=3600))
    assert link.call(lambda c: c.ping())
    server.restart()
    assert link.call(lambda c: c.ping())
    assert link.stale_connections == 1 and not link.breaker.is_open


def test_a_refused_token_counts_as_the_server_being_down(kv_server_factory: KVServerFactory, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("right")
    server = kv_server_factory({"auth": {"token_file": str(token), "failure_delay_seconds": 0}}, l2_fs=False)
    assert EngineLink(Endpoint(port=server.port), token="right").call(lambda c: c.ping())
    wrong = EngineLink(Endpoint(port=server.port), token="wrong", breaker=CircuitBreaker(failure_threshold=1))
    with pytest.raises(ConnectionRefusedError, match="refused AUTH"):
        wrong.call(lambda c: c.ping())
    with pytest.raises(ServerUnavailable):
        wrong.call(lambda c: c.ping())


def test_endpoint_urls_are_checked() -> None:
    assert Endpoint.parse("redis://kv.ns.svc:7000") == Endpoint("kv.ns.svc", 7000)
    assert Endpoint.parse("unix:///run/strata/kv.sock") == Endpoint(unix_socket="/run/strata/kv.sock")
    with pytest.raises(ValueError, match="use redis://host:port"):
        Endpoint.parse("http://kv:6379")


def test_the_engine_side_modules_import_only_the_standard_library() -> None:
    """A serving image gets the tier with `pip install strata` and no extras: nothing beyond the stdlib (and
    pydantic/pyyaml, the core's own) may be imported by the modules the tier uses."""
    probe = (
        f"import sys, json; sys.path.insert(0, {str(KVSERVER)!r}); before = set(sys.modules); "
        "import strata_kv.vllm.engine_link, strata_kv.client; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(json.dumps(sorted(new - set(sys.stdlib_module_names))))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == ["strata_kv"]
