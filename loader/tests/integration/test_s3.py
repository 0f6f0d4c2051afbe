"""S3 against a real S3-compatible server process on loopback (moto's server mode): fetch, streaming loads,
missing objects, and connections reset mid-response."""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import strata_loader
import torch
from safetensors.torch import load_file as reference_load_file
from safetensors.torch import save
from strata_loader.contract import MANIFEST_NAME, FetchRequest, VerifyMode
from strata_loader.core import settings
from strata_loader.core.s3 import S3Error, S3Reader
from strata_loader.fetch.run import fetch
from strata_testsupport.counting_proxy import CountingProxy

from .faulty_proxy import FaultyProxy

pytestmark = pytest.mark.integration


def weights(seed: int, n: int = 4) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    first = (seed - 1) * n
    return save(
        {f"layers.{first + i}.w": torch.randn(128, 96, generator=gen).to(torch.bfloat16) for i in range(n)}
        | {f"scalar{seed}": torch.tensor(seed, dtype=torch.int64), f"empty{seed}": torch.zeros(0, 3)}
    )


@pytest.fixture
def model_bucket(s3_env, tmp_path):
    """A bucket holding a small sharded model under `llama/`; returns (bucket, {relpath: bytes})."""
    bucket = s3_env.create_bucket()
    c = s3_env.client()
    files = {
        "config.json": b'{"model_type": "llama"}',
        "model-00001-of-00002.safetensors": weights(1),
        "model-00002-of-00002.safetensors": weights(2),
    }
    for rel, data in files.items():
        c.put_object(Bucket=bucket, Key=f"llama/{rel}", Body=data)
    return bucket, files


def test_fetch_from_s3_copies_and_verifies_md5_etags(model_bucket, tmp_path):
    bucket, files = model_bucket
    req = FetchRequest(
        source=f"s3://{bucket}/llama",
        dest=str(tmp_path / "dst"),
        verify=VerifyMode.CHECKSUMS,
        block_size="64Ki",
        concurrency=4,
    )
    res = fetch(req, progress_mode="none")
    for rel, data in files.items():
        assert (tmp_path / "dst" / rel).read_bytes() == data
        assert res.checksums[rel] == "sha256:" + hashlib.sha256(data).hexdigest()
    manifest = json.loads((tmp_path / "dst" / MANIFEST_NAME).read_text())
    md5s = {f["path"]: f["checksums"]["md5"] for f in manifest["files"]}
    assert md5s == {rel: hashlib.md5(data).hexdigest() for rel, data in files.items()}


def test_multipart_object_has_no_md5_but_still_copies(s3_env, tmp_path):
    bucket = s3_env.create_bucket()
    c = s3_env.client()
    data = os.urandom(11 * 2**20)
    up = c.create_multipart_upload(Bucket=bucket, Key="m/big.bin")
    parts = []
    for i, off in enumerate(range(0, len(data), 5 * 2**20), start=1):
        r = c.upload_part(
            Bucket=bucket, Key="m/big.bin", UploadId=up["UploadId"], PartNumber=i, Body=data[off : off + 5 * 2**20]
        )
        parts.append({"PartNumber": i, "ETag": r["ETag"]})
    c.complete_multipart_upload(
        Bucket=bucket, Key="m/big.bin", UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
    )
    res = fetch(
        FetchRequest(source=f"s3://{bucket}/m", dest=str(tmp_path / "d"), verify=VerifyMode.CHECKSUMS),
        progress_mode="none",
    )
    assert (tmp_path / "d" / "big.bin").read_bytes() == data
    assert res.checksums["big.bin"].startswith("sha256:")


def test_streamer_reads_s3_objects_bit_exact(model_bucket, tmp_path):
    bucket, files = model_bucket
    uris = [f"s3://{bucket}/llama/{rel}" for rel in files if rel.endswith(".safetensors")]
    want = {}
    for rel, data in files.items():
        if rel.endswith(".safetensors"):
            (tmp_path / rel).write_bytes(data)
            want.update(reference_load_file(tmp_path / rel))
    got = strata_loader.load_files(uris, block_size=16 * 1024)
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
    streamed = {n: t.clone() for n, t in strata_loader.iter_tensors(uris, copy=False, batch_bytes=30_000)}
    assert all(torch.equal(streamed[k], want[k]) for k in want)
    with strata_loader.SafetensorsFile(uris[0]) as f:
        assert torch.equal(f.shard("layers.0.w", 1, 1, 2), want["layers.0.w"][:, 48:])


def test_missing_object_and_bucket_are_clear_errors(model_bucket, tmp_path):
    bucket, _ = model_bucket
    with pytest.raises(FileNotFoundError, match="no such object"):
        strata_loader.load_file(f"s3://{bucket}/llama/nope.safetensors")
    from strata_loader.fetch.catalog import SourceError

    with pytest.raises(SourceError, match="no objects under"):
        fetch(FetchRequest(source=f"s3://{bucket}/absent", dest=str(tmp_path / "d")), progress_mode="none")
    with pytest.raises(FileNotFoundError, match="no such bucket"):
        fetch(FetchRequest(source="s3://no-such-bucket-x/m", dest=str(tmp_path / "d")), progress_mode="none")


def test_connections_reset_mid_body_are_retried(model_bucket, s3_env, monkeypatch):
    bucket, files = model_bucket
    data = files["model-00001-of-00002.safetensors"]
    proxy = FaultyProxy(int(s3_env.endpoint_url.rsplit(":", 1)[1]), resets=3)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        r = S3Reader(bucket, "llama/model-00001-of-00002.safetensors", len(data))
        buf = bytearray(len(data))
        r.read_into(0, memoryview(buf))
        assert bytes(buf) == data
        assert proxy.reset_count == 3
    finally:
        proxy.close()


def test_throttling_is_retried_with_backoff(model_bucket, s3_env, monkeypatch):
    bucket, files = model_bucket
    data = files["config.json"]
    proxy = FaultyProxy(int(s3_env.endpoint_url.rsplit(":", 1)[1]), resets=4, throttle=True)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        buf = bytearray(len(data))
        S3Reader(bucket, "llama/config.json", len(data)).read_into(0, memoryview(buf))
        assert bytes(buf) == data and proxy.reset_count == 4
    finally:
        proxy.close()


def test_endless_throttling_ends_in_a_clear_error(model_bucket, s3_env, monkeypatch):
    bucket, files = model_bucket
    proxy = FaultyProxy(int(s3_env.endpoint_url.rsplit(":", 1)[1]), resets=-1, throttle=True)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        monkeypatch.setattr(settings, "_current", settings.LoaderSettings(s3_retries=2))
        r = S3Reader(bucket, "llama/config.json", len(files["config.json"]))
        with pytest.raises(S3Error, match="SlowDown"):
            r.read_into(0, memoryview(bytearray(len(files["config.json"]))))
    finally:
        proxy.close()


def test_endless_resets_end_in_a_clear_error(model_bucket, s3_env, monkeypatch):
    bucket, files = model_bucket
    proxy = FaultyProxy(int(s3_env.endpoint_url.rsplit(":", 1)[1]), resets=-1)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        monkeypatch.setattr(settings, "_current", settings.LoaderSettings(s3_retries=2))
        r = S3Reader(bucket, "llama/config.json", len(files["config.json"]))
        with pytest.raises(S3Error, match="after 2 attempts"):
            r.read_into(0, memoryview(bytearray(len(files["config.json"]))))
    finally:
        proxy.close()


def test_killed_fetch_resumes_where_it_stopped(s3_env, tmp_path):
    bucket = s3_env.create_bucket()
    data = os.urandom(24 * 2**20)
    s3_env.client().put_object(Bucket=bucket, Key="big/model.bin", Body=data)
    args = FetchRequest(
        source=f"s3://{bucket}/big", dest=str(tmp_path / "d"), block_size="1Mi", concurrency=1
    ).to_args()
    env = {**os.environ, **s3_env.env(), "STRATA_PROGRESS": "none"}
    marker = tmp_path / "d" / "model.bin.strata-partial.progress"
    # The copy reaches the origin through a gate that lets 8 blocks through and holds the next one: it is
    # killed exactly there, whatever the speed of this machine, and resumes from the last checkpoint (every
    # CHECKPOINT_BLOCKS = 4 blocks, so at block 8).
    with CountingProxy(urlsplit(os.environ["AWS_ENDPOINT_URL"]).port or 80, hold_ranges_after=8) as gate:
        env["AWS_ENDPOINT_URL"] = gate.endpoint_url
        proc = subprocess.Popen([sys.executable, "-m", "strata_loader", *args], env=env)
        try:
            gate.wait_until_holding(proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert marker.exists()
    assert not (tmp_path / "d" / MANIFEST_NAME).exists()
    res = fetch(FetchRequest.parse_args(args), progress_mode="none")
    assert res.bytes_resumed == 8 * 2**20
    assert (tmp_path / "d" / "model.bin").read_bytes() == data
    assert not marker.exists() and not Path(str(marker).removesuffix(".progress")).exists()
