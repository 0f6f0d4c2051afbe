"""The S3 tier against a real S3-compatible server process on loopback (the shared `s3_server` fixture)."""

import hashlib
import time

import pytest

pytestmark = pytest.mark.integration


def value_for(key: str, size: int = 64 * 1024) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // 32 + 1))[:size]


def test_chunks_reach_s3_and_come_back_after_l1_eviction(kv_server_factory, s3_server) -> None:
    bucket = s3_server.create_bucket()
    server = kv_server_factory(
        {
            "l1": {"size": "1MiB"},
            "l2": {"s3": {"bucket": bucket, "prefix": "kv", "endpoint_url": s3_server.endpoint_url}},
        },
        l2_fs=False,
        env={**s3_server.env()},
    )
    c = server.client()
    keys = [f"s3chunk{i}" for i in range(40)]  # 2.5 MiB through a 1 MiB L1
    for k in keys:
        c.set(k, value_for(k))
    deadline = time.monotonic() + 60
    while c.stats()["write_behind_depth"] and time.monotonic() < deadline:
        time.sleep(0.1)
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="kv/")
    assert listed["KeyCount"] == 40
    assert all(o["Key"].endswith(".bin") for o in listed["Contents"])
    for k in keys:
        assert c.get(k) == value_for(k)
    stats = c.stats()
    assert stats["hits_s3"] > 0
    assert c.prefix(keys[:1]) in (["l1"], ["s3"])
    assert c.delete(keys[0]) == 1
    assert c.get(keys[0]) is None


def test_corrupt_s3_object_is_a_miss_and_is_removed(kv_server_factory, s3_server) -> None:
    bucket = s3_server.create_bucket()
    server = kv_server_factory(
        {
            "l1": {"size": "1MiB", "eviction_policy": "lru"},  # so the first chunk surely leaves L1
            "l2": {"s3": {"bucket": bucket, "endpoint_url": s3_server.endpoint_url}},
        },
        l2_fs=False,
        env={**s3_server.env()},
    )
    c = server.client()
    c.set("victim", value_for("victim"))
    for i in range(30):
        c.set(f"filler{i}", value_for(f"filler{i}"))
    s3 = s3_server.client()
    deadline = time.monotonic() + 60
    while c.stats()["write_behind_depth"] and time.monotonic() < deadline:
        time.sleep(0.1)
    (obj,) = [
        o for o in s3.list_objects_v2(Bucket=bucket)["Contents"] if o["Size"] and _holds(s3, bucket, o, b"victim")
    ]
    body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    s3.put_object(Bucket=bucket, Key=obj["Key"], Body=body[:-1] + bytes([body[-1] ^ 1]))
    assert c.get("victim") is None
    assert s3.list_objects_v2(Bucket=bucket, Prefix=obj["Key"])["KeyCount"] == 0


def _holds(s3, bucket: str, obj: dict, key: bytes) -> bool:
    head = s3.get_object(Bucket=bucket, Key=obj["Key"], Range="bytes=-64")["Body"].read()  # key + trailer
    return key in head
