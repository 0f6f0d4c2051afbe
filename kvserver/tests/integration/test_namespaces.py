"""STRATA.NAMESPACES and STRATA.DROPNS against real server processes: a namespace of vLLM-tier keys is listed per
tier and dropped from L1, the fs tier (directories included) and S3, and nothing of another namespace goes."""

import json
import socket
import time
from pathlib import Path

import pytest
import redis
from strata_kv.wire.resp import command

pytestmark = pytest.mark.integration

OLD = "_models_llama_rev-aaaaaaaaaaaa_0123456789ab"
NEW = "_models_llama_rev-bbbbbbbbbbbb_0123456789ab"
BLOCK = 16 * 1024


def tier_key(namespace: str, i: int, rank: int = 0, group: int = 0) -> bytes:
    """A vLLM-tier key as Strata's tier sends it: `<namespace>_r<rank>/` + 16 hash bytes + 4-byte group."""
    return f"{namespace}_r{rank}/".encode() + i.to_bytes(16, "big") + group.to_bytes(4, "big")


def value(i: int) -> bytes:
    return bytes([i % 251]) * BLOCK


def settled(r: redis.Redis) -> None:
    deadline = time.monotonic() + 30
    while json.loads(r.execute_command("STRATA.STATS"))["write_behind_depth"] and time.monotonic() < deadline:
        time.sleep(0.05)


def listing(r: redis.Redis) -> dict:
    return json.loads(r.execute_command("STRATA.NAMESPACES"))


def test_a_dropped_namespace_leaves_every_tier_and_its_directories(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": "256KiB"}})
    r = server.redis()
    for i in range(40):  # 640 KiB through a 256 KiB L1: some blocks only in L2
        r.set(tier_key(OLD, i), value(i))
        r.set(tier_key(NEW, i), value(i))
    r.set(tier_key(OLD, 99, rank=1), value(99))
    settled(r)
    l2 = Path(server.config["l2"]["fs"]["root_dir"])
    (l2 / OLD).mkdir(exist_ok=True)
    (l2 / OLD / "config.json").write_text("{}")  # what vLLM's fs tier writes for its namespace

    on_disk = sum(f.stat().st_size for d in l2.glob(f"{OLD}_r*") for f in d.rglob("*.bin"))
    before = listing(r)
    assert before[OLD]["fs"] == {"blocks": 41, "bytes": on_disk}
    assert 0 < before[OLD]["l1"]["blocks"] < 41

    dropped = json.loads(r.execute_command("STRATA.DROPNS", OLD))
    assert dropped["freed"]["l1"] == before[OLD]["l1"]
    assert dropped["freed"]["fs"] == {"blocks": 41, "bytes": on_disk + 2}  # the blocks and config.json
    assert dropped["bytes"] == before[OLD]["l1"]["bytes"] + on_disk + 2
    assert not [p for p in l2.iterdir() if p.name.startswith(OLD)]
    assert all(r.get(tier_key(OLD, i)) is None for i in range(40))
    assert all(r.get(tier_key(NEW, i)) == value(i) for i in range(40))
    assert OLD not in listing(r) and listing(r)[NEW]["fs"]["blocks"] == 40

    again = json.loads(r.execute_command("STRATA.DROPNS", OLD))  # idempotent
    assert again["bytes"] == 0 and again["freed"] == {}


def test_only_vllm_namespaces_other_than_the_servers_own_are_listed_or_dropped(kv_server_factory) -> None:
    server = kv_server_factory({"namespace": {"model": "served"}})
    r = server.redis()
    with pytest.raises(redis.ResponseError, match="not a vLLM namespace"):
        r.execute_command("STRATA.DROPNS", "../etc")
    r.set(b"lmcache@1@0@abc@bfloat16", b"x")
    settled(r)
    l2 = Path(server.config["l2"]["fs"]["root_dir"])
    (own,) = [
        p.name.removesuffix("_r0") for p in l2.iterdir() if p.name.startswith("served_") and p.name.endswith("_r0")
    ]
    with pytest.raises(redis.ResponseError, match="configured namespace"):
        r.execute_command("STRATA.DROPNS", own)
    assert listing(r) == {}  # keys outside vLLM namespaces are never listed, so never attributed


def test_dropns_needs_the_token_like_every_data_command(kv_server_factory, tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    server = kv_server_factory({"auth": {"token_file": str(token)}}, l2_fs=False)
    with pytest.raises(redis.AuthenticationError):
        server.redis().execute_command("STRATA.DROPNS", OLD)
    r = server.redis(password="s3cret")
    r.set(tier_key(OLD, 1), value(1))
    assert json.loads(r.execute_command("STRATA.DROPNS", OLD))["freed"] == {"l1": {"blocks": 1, "bytes": BLOCK}}


def test_a_namespace_is_dropped_from_s3_too(kv_server_factory, s3_server) -> None:
    bucket = s3_server.create_bucket()
    server = kv_server_factory(
        {
            "l1": {"size": "64KiB"},
            "l2": {"s3": {"bucket": bucket, "prefix": "kv", "endpoint_url": s3_server.endpoint_url}},
        },
        l2_fs=False,
        env={**s3_server.env()},
    )
    r = server.redis()
    for i in range(8):
        r.set(tier_key(OLD, i), value(i))
        r.set(tier_key(NEW, i), value(i))
    settled(r)
    assert listing(r)[OLD]["s3"]["blocks"] == 8
    dropped = json.loads(r.execute_command("STRATA.DROPNS", OLD))
    assert dropped["freed"]["s3"]["blocks"] == 8
    s3 = s3_server.client()
    names = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents") or []]
    assert names and not [n for n in names if OLD in n]
    assert r.get(tier_key(NEW, 3)) == value(3)


def test_two_drops_of_one_namespace_at_once_count_each_block_once(kv_server_factory) -> None:
    """Two operators (a peering handover, or a reconcile beside the operator) may drop one namespace together: the
    bytes both answers report add up to what the server held, so the collection log counts every block once."""
    server = kv_server_factory()
    r = server.redis()
    for i in range(24):
        r.set(tier_key(OLD, i), value(i))
    settled(r)
    held = sum(tier["bytes"] for tier in listing(r)[OLD].values())
    drop = command("STRATA.DROPNS", OLD)
    first, second = (socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(2))
    with first, second:
        first.sendall(drop)
        second.sendall(drop)  # arrives while the first one lists the filesystem in a thread
        answers = [json.loads(bulk_reply(s)) for s in (first, second)]
    assert sum(a["bytes"] for a in answers) == held
    assert sorted(a["bytes"] for a in answers) == [0, held]
    assert OLD not in listing(r)


def bulk_reply(sock: socket.socket) -> bytes:
    """One RESP bulk string read off a raw socket."""
    data = b""
    while b"\r\n" not in data:
        data += sock.recv(65536)
    header, _, rest = data.partition(b"\r\n")
    assert header[:1] == b"$", header
    size = int(header[1:])
    while len(rest) < size + 2:
        rest += sock.recv(65536)
    return rest[:size]
