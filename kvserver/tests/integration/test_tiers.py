"""L1 + L2 with real server processes: promotion, restart, kill -9, shared directories, a full disk."""

import hashlib
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from strata_testsupport.kvserver import KVServerProcess

pytestmark = pytest.mark.integration

SMALL_L1 = {"l1": {"size": "1MiB"}}


def value_for(key: str, size: int = 64 * 1024) -> bytes:
    """Deterministic content, so any read can be checked without remembering what was written."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // 32 + 1))[:size]


def wait_until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def stored_past_l1(server: KVServerProcess, keys: list[str]):
    """A client of `server` (SMALL_L1) after it stored `keys`, 64 KiB each, and its write-behind queue drained:
    more than L1 holds, so the first ones are in L2 alone."""
    c = server.client()
    for k in keys:
        c.set(k, value_for(k))
    assert wait_until(lambda: c.stats()["write_behind_depth"] == 0)
    return c


def test_chunks_evicted_from_l1_are_served_from_l2_and_promoted(kv_server_factory) -> None:
    server = kv_server_factory(SMALL_L1)
    keys = [f"chunk{i}" for i in range(64)]  # 4 MiB through a 1 MiB L1
    c = stored_past_l1(server, keys)
    for k in keys:
        assert c.get(k) == value_for(k)
    stats = c.stats()
    assert stats["hits_fs"] > 0 and stats["promotions"] > 0
    assert stats["l1_used_bytes"] <= 1024 * 1024
    assert c.prefix(keys[:2])[0] in ("l1", "fs")


def stored_then_restarted(server: KVServerProcess, keys: list[str], size: int):
    """A client of `server` after it stored `keys` and restarted gracefully: SIGTERM drains the write-behind queue
    before exiting, so every chunk is in the fs tier and L1 starts empty."""
    c = server.client()
    for k in keys:
        c.set(k, value_for(k, size))
    c.close()
    assert server.stop() == 0
    server.start()
    return server.client()


def test_one_sized_mget_reads_what_l1_dropped_from_l2_and_promotes_it(kv_server_factory) -> None:
    """STRATA.MGETSIZED, a load job's chunks at once: the ones L1 holds and the ones only L2 has, in order."""
    server = kv_server_factory(SMALL_L1)
    keys = [f"sized{i}" for i in range(48)]  # 3 MiB through a 1 MiB L1
    c = stored_past_l1(server, keys)
    before = c.stats()
    reply = server.redis(protocol=2).execute_command("STRATA.MGETSIZED", 64 * 1024, *keys)
    assert reply == b"1" * len(keys) + b"".join(value_for(k) for k in keys)
    after = c.stats()
    assert after["hits_fs"] - before["hits_fs"] > 0 and after["hits_l1"] - before["hits_l1"] > 0
    assert after["promotions"] > before["promotions"]


def test_graceful_restart_keeps_every_chunk(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": "64MiB"}})
    keys = [f"keep{i}" for i in range(100)]
    c = stored_then_restarted(server, keys, 32 * 1024)
    assert c.stats()["fs_files"] >= 100  # index rebuilt from disk
    assert all(c.get(k) == value_for(k, 32 * 1024) for k in keys)


def test_kill_9_during_heavy_writes_serves_nothing_corrupt(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": "4MiB"}, "write_behind": {"workers": 8}})
    stop = threading.Event()
    written: list[str] = []

    def writer(n: int) -> None:
        r = server.redis(protocol=2)
        i = 0
        while not stop.is_set():
            k = f"w{n}:{i}"
            try:
                r.set(k, value_for(k, 100 * 1024))
            except redis.ConnectionError:
                return
            written.append(k)
            i += 1

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    assert wait_until(lambda: len(written) > 300)
    server.kill()
    stop.set()
    for t in threads:
        t.join()
    l2 = Path(server.config["l2"]["fs"]["root_dir"])
    files = [p for p in l2.rglob("*.bin")]
    assert files, "nothing reached L2 before the kill"
    # Damage one block the way a torn write on a crashing node would, to prove it is never served.
    victim = files[0]
    data = bytearray(victim.read_bytes())
    data[1000:5000] = bytes(4000)  # pages a crashing node never wrote
    victim.write_bytes(bytes(data))
    server.start()
    c = server.client()
    assert c.stats()["fs_files"] >= len(files) - 1
    served = 0
    for k in written:
        got = c.get(k)
        if got is not None:
            assert got == value_for(k, 100 * 1024), f"{k} served corrupt bytes"
            served += 1
    assert served > 0
    assert not victim.exists()  # the torn block was a miss and was removed


def test_two_servers_sharing_one_l2_directory_see_each_others_chunks(kv_server_factory, tmp_path: Path) -> None:
    shared = {"l2": {"fs": {"root_dir": str(tmp_path / "shared-l2")}}}
    a = kv_server_factory(shared, name="node-a")
    b = kv_server_factory(shared, name="node-b")
    ca, cb = a.client(), b.client()
    ca.set("from-a", value_for("from-a"))
    cb.set("from-b", value_for("from-b"))
    assert wait_until(lambda: cb.exists("from-a") == 1 and ca.exists("from-b") == 1)
    assert cb.get("from-a") == value_for("from-a")
    assert ca.get("from-b") == value_for("from-b")
    assert cb.stats()["hits_fs"] == 1


def test_full_disk_gives_errors_and_a_live_server(kv_server_factory, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "someone-elses-file").write_bytes(b"\0" * (2 * 1024 * 1024 - 40 * 1024))  # not ours to evict
        server = kv_server_factory({"l1": {"size": "1MiB"}, "l2": {"fs": {"root_dir": str(mnt), "capacity": 0}}})
        c = server.client()
        for i in range(40):
            c.set(f"full{i}", value_for(f"full{i}"))
        assert wait_until(lambda: c.stats()["write_behind_depth"] == 0)
        stats = c.stats()
        assert stats["fs_write_errors"] > 0
        assert "No space left" in stats["write_behind_last_error"] or "full" in stats["write_behind_last_error"]
        assert stats["l2_failing"] == 1 and stats["fs_write_failing"] == 1  # reported, not silent
        assert server.redis().info("strata")["l2_failing"] == 1
        ready = urllib.request.urlopen(server.metrics_url + "/readyz", timeout=10)
        assert ready.status == 200 and b"L2 writes failing: fs" in ready.read()  # L1 still serves
        metrics = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10).read().decode()
        assert 'strata_kv_l2_failing{tier="fs"} 1.0' in metrics
        assert 'strata_kv_l2_write_errors_total{tier="fs"}' in metrics
        assert c.ping() and server.alive()
        assert c.get("full39") == value_for("full39")  # the newest chunks are still in L1
        c.set("after", b"still works")
        assert c.get("after") == b"still works"
        c.close()
        server.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_configured_capacity_larger_than_the_disk_still_evicts_and_recovers(kv_server_factory, tmp_path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        config = {"l1": {"size": "512KiB"}, "l2": {"fs": {"root_dir": str(mnt), "capacity": "1GiB"}}}
        server = kv_server_factory(config, name="small-disk")
        c = server.client()
        keys = [f"big{i}" for i in range(80)]  # 5 MiB through a 2 MiB disk that is configured as 1 GiB
        for k in keys:
            c.set(k, value_for(k))
        assert wait_until(lambda: c.stats()["write_behind_depth"] == 0)
        stats = c.stats()
        assert stats["fs_evictions"] > 0  # the real free space counted: old chunks made room
        assert stats["fs_capacity_bytes"] <= 2 * 1024 * 1024  # effective capacity: the smaller of the two
        assert stats["l2_failing"] == 0
        write_errors = stats["fs_write_errors"]
        assert write_errors <= 2
        hits_before = stats["hits_fs"]
        recent_l2 = keys[-16:-8]  # out of L1 by now, so they come from the disk
        answers = {k: c.get(k) for k in recent_l2}
        assert all(v == value_for(k) for k, v in answers.items() if v is not None), "never other bytes"
        # A write the full disk refused (ENOSPC, counted) lost that chunk: at most that many may be missing.
        missing = [k for k, v in answers.items() if v is None]
        assert len(missing) <= write_errors, (missing, stats)
        assert c.stats()["hits_fs"] >= hits_before + (len(recent_l2) - len(missing)) // 2
        c.close()
        server.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_lmcache_exists_then_get_survives_eviction_pressure(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": "1MiB", "exists_grace_seconds": 60}}, l2_fs=False)
    c = server.client()
    c.set("asked", value_for("asked"))
    assert c.exists("asked") == 1
    for i in range(40):  # 2.5 MiB of new chunks through a 1 MiB L1 with no L2 behind it
        try:
            c.set(f"pressure{i}", value_for(f"pressure{i}"))
        except Exception as e:  # L1 may be unable to admit while pinned: that is an error reply
            assert "OOM" in str(e)
    assert c.get("asked") == value_for("asked")


def test_without_l2_a_value_larger_than_l1_is_an_oom_error(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": "1MiB"}}, l2_fs=False)
    r = server.redis()
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="larger than L1"):
        r.set("huge", b"x" * (2 * 1024 * 1024))
    assert r.ping()


def test_two_servers_racing_on_the_same_keys_leave_only_whole_blocks(kv_server_factory, tmp_path: Path) -> None:
    shared = {"l1": {"size": "1MiB"}, "l2": {"fs": {"root_dir": str(tmp_path / "race-l2")}}}
    servers = [kv_server_factory(shared, name=f"racer-{i}") for i in range(2)]
    keys = [f"race{i}" for i in range(30)]

    def writer(server: KVServerProcess, salt: str) -> None:
        c = server.client()
        for _round in range(3):
            for k in keys:
                c.set(k, value_for(k + salt, 48 * 1024))
        c.close()

    threads = [threading.Thread(target=writer, args=(s, f"/{i}")) for i, s in enumerate(servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in servers:
        c = s.client()
        assert wait_until(lambda c=c: c.stats()["write_behind_depth"] == 0)
        c.close()
    reader = kv_server_factory(shared, name="reader")  # cold L1: every GET comes from the shared files
    c = reader.client()
    for k in keys:
        assert c.get(k) in (value_for(k + "/0", 48 * 1024), value_for(k + "/1", 48 * 1024))
    assert not list((tmp_path / "race-l2").rglob("*.tmp"))
    assert c.stats()["hits_fs"] == len(keys)


def test_vllm_tier_keys_land_in_vllms_namespace_directories_and_their_number_is_bounded(
    kv_server_factory, tmp_path: Path
) -> None:
    """Over RESP: a key with a vLLM namespace prefix is filed at vLLM's own path in that namespace; a raw block a
    vLLM `fs` tier wrote there is served to its key; past `l2.fs.max_namespaces` a write is refused and counted."""
    root = tmp_path / "vllm-l2"
    server = kv_server_factory({"l2": {"fs": {"root_dir": str(root), "max_namespaces": 2}}})  # the server's + one
    c = server.client()
    block_hash = hashlib.sha256(b"tokens").digest()
    h = block_hash.hex()
    ours = b"m1_111111111111_r0/" + block_hash + bytes(4)
    c.set(ours, value_for("ours"))
    path = root / "m1_111111111111_r0" / h[:3] / f"{h[3:5]}_g0" / f"{h}.bin"
    assert wait_until(path.exists)
    assert path.read_bytes()[: 64 * 1024] == value_for("ours")  # what vLLM's load_block reads

    vllm_written = hashlib.sha256(b"vllm wrote it").digest()
    vh = vllm_written.hex()
    raw = root / "m1_111111111111_r0" / vh[:3] / f"{vh[3:5]}_g0" / f"{vh}.bin"
    raw.parent.mkdir(parents=True)
    raw.write_bytes(value_for("raw"))  # no trailer: vLLM's own block file
    assert c.get(b"m1_111111111111_r0/" + vllm_written + bytes(4)) == value_for("raw")

    c.set(b"m2_222222222222_r0/" + block_hash + bytes(4), value_for("refused"))
    assert wait_until(lambda: c.stats()["write_behind_depth"] == 0)
    assert not (root / "m2_222222222222_r0").exists()
    stats = c.stats()
    assert stats["fs_namespaces_refused"] == 1 and stats["fs_foreign_served"] == 1
    metrics = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10).read().decode()
    assert "strata_kv_fs_namespaces_refused_total 1.0" in metrics
    assert "strata_kv_fs_vllm_blocks_served_total 1.0" in metrics


def test_a_chain_past_l1_is_looked_up_in_batches_and_still_stops_at_its_first_missing_chunk(
    kv_server_factory,
) -> None:
    """STRATA.PREFIX over chunks only L2 holds (L1 empty after a restart): the answer is the leading run, in
    order, whether the gap falls in the first chunk, inside a batch or at a batch's edge (PREFIX_L2_BATCH 8)."""
    server = kv_server_factory({"l1": {"size": "64MiB"}})
    keys = [f"chain{i}" for i in range(20)]
    c = stored_then_restarted(server, keys, 16 * 1024)
    assert c.prefix(keys) == ["fs"] * 20
    assert c.prefix(["absent", *keys]) == []
    for gap in (1, 5, 9, 12):
        assert c.prefix([*keys[:gap], "absent", *keys[gap:]]) == ["fs"] * gap, gap
    assert c.stats()["misses"] == 21 + sum(21 - gap for gap in (1, 5, 9, 12))  # every chunk past the run
