"""Operations: metrics and health endpoints, flags without a config file, redis-benchmark unmodified."""

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from strata_testsupport.kvserver import KVServerProcess

pytestmark = pytest.mark.integration


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_count_hits_misses_and_latency(kv_server: KVServerProcess) -> None:
    r = kv_server.redis()
    r.set("metric-key", b"v" * 100)
    r.get("metric-key")
    r.get("metric-missing")
    status, body = fetch(f"{kv_server.metrics_url}/metrics")
    assert status == 200
    assert 'strata_kv_hits_total{tier="l1"}' in body
    assert "strata_kv_misses_total" in body
    assert 'strata_kv_command_seconds_bucket{command="GET"' in body
    assert 'strata_kv_used_bytes{tier="l1"}' in body
    assert "strata_kv_write_behind_depth" in body
    assert fetch(f"{kv_server.metrics_url}/healthz")[0] == 200
    assert fetch(f"{kv_server.metrics_url}/readyz")[0] == 200


def metric_values(server: KVServerProcess) -> dict[str, float]:
    """Every sample of the server's /metrics, by its name and labels as written."""
    status, body = fetch(f"{server.metrics_url}/metrics")
    assert status == 200, body
    return {
        name: float(value)
        for line in body.splitlines()
        if line and not line.startswith("#")
        for name, value in [line.rsplit(" ", 1)]
    }


def test_each_lookup_and_each_read_counts_once_whatever_the_path_and_size(kv_server: KVServerProcess) -> None:
    """What the offload verdict divides: a hit per value read and a miss per chunk a lookup did not find.

    A GET too large for the fast path (a 1 MiB chunk, a KV tier's usual size) was counted by the fast path and
    again by the slow path that sent it; a chunk STRATA.PREFIX or EXISTS did not find was never counted at all
    (the engine does not GET what a lookup missed), so the verdict saw hits only."""
    r = kv_server.redis()  # the session's server: keys of this test's own, so other tests see none of them
    big, small, fresh = "counted-big", "counted-small", "counted-fresh"
    chunk = b"c" * (1 << 20)
    r.set(big, chunk)
    r.set(small, b"s" * 100)
    before = metric_values(kv_server)

    def gained(name: str) -> float:
        return metric_values(kv_server)[name] - before[name]

    assert r.get(big) == chunk and r.get(small) == b"s" * 100
    assert gained('strata_kv_hits_total{tier="l1"}') == 2
    assert gained('strata_kv_offload_loaded_bytes_total{tier="l1"}') == len(chunk) + 100
    assert gained("strata_kv_misses_total") == 0
    # An engine's probe: the leading chunk is there, the two after it are not (nor GET by anyone).
    assert r.execute_command("STRATA.PREFIX", big, "counted-gone-1", "counted-gone-2")[0] == 1
    assert gained("strata_kv_misses_total") == 2
    assert r.exists("counted-gone-3") == 0  # LMCache's lookup
    assert gained("strata_kv_misses_total") == 3
    assert r.set(fresh, b"f", nx=True)  # SET NX's own check is no lookup
    assert gained("strata_kv_misses_total") == 3
    assert gained('strata_kv_hits_total{tier="l1"}') == 2
    assert gained("strata_kv_offload_miss_seconds_total") > 0


def test_unknown_command_names_do_not_grow_metric_labels(kv_server: KVServerProcess) -> None:
    r = kv_server.redis()
    for i in range(20):
        with pytest.raises(redis.ResponseError, match="unknown command"):
            r.execute_command(f"NOPE{i}")
    body = fetch(f"{kv_server.metrics_url}/metrics")[1]
    assert "NOPE" not in body and 'command="OTHER"' in body


def test_serve_from_flags_alone_and_stop_gracefully(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "strata_kv.cli", "serve", "--port", "0", "--bind", "127.0.0.1",
             "--l1-size", "8MiB", "--l2-dir", str(tmp_path / "l2"), "--metrics-port", "-1"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "strata-kv ready" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        port = int(log.read_text().split("tcp=127.0.0.1:")[1].split()[0])
        r = redis.Redis(port=port)
        r.set("flag-key", b"x" * 1000)
        assert r.config_get("maxmemory")["maxmemory"] == str(8 * 1024 * 1024)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "write-behind drained" in log.read_text()
    assert list((tmp_path / "l2").rglob("*.bin"))  # the chunk reached L2 before exit


def test_redis_benchmark_runs_unmodified(kv_server: KVServerProcess, redis_benchmark: str) -> None:
    out = subprocess.run(
        [redis_benchmark, "-p", str(kv_server.port), "-t", "ping,set,get,mset", "-n", "2000", "-c", "8",
         "-d", "4096", "-r", "200", "--csv"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    tests = {line.split(",")[0].strip('"') for line in out.stdout.splitlines()[1:]}
    assert {"SET", "GET", "MSET (10 keys)"} <= tests, out.stdout
    assert "ERR" not in out.stderr


def test_redis_benchmark_pipelined(kv_server: KVServerProcess, redis_benchmark: str) -> None:
    out = subprocess.run(
        [redis_benchmark, "-p", str(kv_server.port), "-t", "set,get", "-n", "5000", "-c", "4", "-P", "32",
         "-d", "256", "--csv"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert '"GET"' in out.stdout
