"""`hf://` against a real Hub-compatible server on loopback (olah serving git repositories with LFS weights):
branches, tags and commits resolved to the commit copied, include/exclude, the Hub's SHA-256 checked, a moving
branch, a missing repository, an unreachable endpoint, resume after kill -9, and the offline rule.

olah cannot serve gated repositories or check tokens (see `strata_testsupport.hub`; those answers are in
`loader/tests/unit/test_hub_errors.py`), and it answers ranged GETs with the whole file, so the fetches here
run the reader's fallback; the 206 path is read against a server that serves ranges (the last test).
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch
from safetensors.torch import load_file as reference_load_file
from safetensors.torch import save
from strata_loader.contract import MANIFEST_NAME, FetchRequest, FetchResult, VerifyMode
from strata_loader.fetch.catalog import SourceError, list_source
from strata_loader.fetch.run import FetchError, fetch
from strata_testsupport.counting_proxy import CountingProxy
from strata_testsupport.hub import HubServer

pytestmark = pytest.mark.integration


def weights(seed: int, rows: int = 64) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    return save({f"layers.{i}.w": torch.randn(rows, 32, generator=gen).to(torch.bfloat16) for i in range(3)})


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def copy(repo_id: str, dest: Path, **kw: object) -> FetchResult:
    req = FetchRequest(source=f"hf://{repo_id}", dest=str(dest), verify=VerifyMode.CHECKSUMS, **kw)
    return fetch(req, progress_mode="none")


@pytest.fixture
def versions(hub_env: HubServer) -> tuple[str, dict[str, dict[str, bytes]], dict[str, str]]:
    """A repository with three commits: v1 (tagged), main after it, and branch dev; files and shas of each."""
    repo = hub_env.create_repo()
    one = {
        "config.json": b'{"model_type": "llama"}',
        "model-00001-of-00002.safetensors": weights(1),
        "model-00002-of-00002.safetensors": weights(2),
    }
    sha1 = hub_env.commit(repo, one, "v1")
    hub_env.tag(repo, "v1", sha1)
    two = {**one, "model-00002-of-00002.safetensors": weights(3)}
    sha2 = hub_env.commit(repo, two, "v2")
    dev = {**two, "config.json": b'{"model_type": "llama", "dev": true}'}
    sha3 = hub_env.commit(repo, dev, "dev", branch="dev")
    return repo, {"v1": one, "main": two, "dev": dev}, {"v1": sha1, "main": sha2, "dev": sha3}


def test_branch_tag_and_commit_each_copy_the_commit_they_name(versions, tmp_path):
    repo, files, shas = versions
    for label, revision in [("main", None), ("main", "main"), ("v1", "v1"), ("v1", shas["v1"]), ("dev", "dev")]:
        dest = tmp_path / f"{label}-{revision}"
        res = copy(repo, dest, revision=revision)
        assert res.revision == shas[label], (label, revision)
        got = tree(dest)
        manifest = json.loads(got.pop(MANIFEST_NAME))
        assert got == files[label]
        assert manifest["revision"] == shas[label]
        assert res.checksums == {p: "sha256:" + hashlib.sha256(b).hexdigest() for p, b in files[label].items()}
    loaded = reference_load_file(str(tmp_path / "v1-v1" / "model-00001-of-00002.safetensors"))
    assert loaded["layers.0.w"].shape == (64, 32)


def test_listing_carries_the_hubs_sha256_for_lfs_files(versions, tmp_path):
    repo, files, shas = versions
    listed, revision = list_source(FetchRequest(source=f"hf://{repo}", dest=str(tmp_path / "d"), revision="v1"))
    assert revision == shas["v1"]
    by_path = {f.relpath: f for f in listed}
    weight = "model-00001-of-00002.safetensors"
    assert by_path[weight].checksums == {"sha256": hashlib.sha256(files["v1"][weight]).hexdigest()}
    assert by_path[weight].size == len(files["v1"][weight])
    config = files["v1"]["config.json"]  # a plain git file: the Hub's git blob id vouches for it
    blob_id = hashlib.sha1(b"blob %d\0" % len(config) + config, usedforsecurity=False).hexdigest()
    assert by_path["config.json"].checksums == {"git-blob-sha1": blob_id}
    assert by_path["config.json"].version.startswith("git:")


def test_include_and_exclude_select_the_same_way_as_other_sources(versions, tmp_path):
    repo, files, _ = versions
    copy(repo, tmp_path / "d", include=["*.safetensors"], exclude=["model-00002*"])
    got = tree(tmp_path / "d")
    got.pop(MANIFEST_NAME)
    assert got == {"model-00001-of-00002.safetensors": files["main"]["model-00001-of-00002.safetensors"]}
    with pytest.raises(SourceError, match="no files to fetch"):
        copy(repo, tmp_path / "e", include=["*.gguf"])


def test_a_moved_branch_is_a_new_revision_and_only_changed_files_travel_again(versions, hub_env, tmp_path):
    repo, files, shas = versions
    first = copy(repo, tmp_path / "d")
    assert first.revision == shas["main"]
    newer = {**files["main"], "model-00001-of-00002.safetensors": weights(9)}
    sha = hub_env.commit(repo, newer, "v3")
    again = copy(repo, tmp_path / "d")
    assert again.revision == sha != first.revision
    unchanged = len(files["main"]["config.json"]) + len(files["main"]["model-00002-of-00002.safetensors"])
    assert again.bytes_resumed == unchanged
    got = tree(tmp_path / "d")
    got.pop(MANIFEST_NAME)
    assert got == newer


def test_bytes_that_do_not_match_the_hubs_sha256_are_refused(versions, hub_env, tmp_path):
    repo, files, _ = versions
    weight = "model-00002-of-00002.safetensors"
    blob = hub_env.lfs_object(repo, hashlib.sha256(files["main"][weight]).hexdigest())
    good = blob.read_bytes()
    blob.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))  # same size, one byte flipped on the server
    with pytest.raises(FetchError, match=rf"{weight}: sha256 .* does not match the source's"):
        copy(repo, tmp_path / "d")
    assert not (tmp_path / "d" / MANIFEST_NAME).exists()
    assert not (tmp_path / "d" / weight).exists()


def test_missing_repository_is_one_line_naming_it_and_what_to_check(hub_env, tmp_path):
    req = FetchRequest(source="hf://strata/no-such-model", dest=str(tmp_path / "d"))
    env = {**os.environ, "STRATA_TERMINATION_MESSAGE_PATH": str(tmp_path / "msg"), "STRATA_PROGRESS": "none"}
    r = subprocess.run([sys.executable, "-m", "strata_loader", *req.to_args()], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "hf://strata/no-such-model" in lines[0] and "source.uri" in lines[0], r.stderr
    assert "HF_TOKEN" in lines[0]  # anonymous: a private or gated repository looks the same
    result = FetchResult.from_termination_message((tmp_path / "msg").read_text())
    assert not result.succeeded and "hf://strata/no-such-model" in (result.error or "")


def test_unreachable_endpoint_names_it(hub_env, monkeypatch, tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    with pytest.raises(SourceError, match=rf"cannot reach {closed}.*HF_ENDPOINT"):
        copy("strata/anything", tmp_path / "d")


def test_offline_rule_reads_the_cache_only_and_the_hub_otherwise(versions, monkeypatch, tmp_path):
    repo, _, _ = versions
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError, match=r"not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        copy(repo, tmp_path / "d")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert copy(repo, tmp_path / "d").files == 3


def test_killed_fetch_resumes_where_it_stopped_and_verifies(hub_env, tmp_path):
    repo = hub_env.create_repo()
    data = save({"w": torch.randn(1536, 1024, generator=torch.Generator().manual_seed(7))})  # 6 MiB
    sha = hub_env.commit(repo, {"model.safetensors": data})
    args = FetchRequest(
        source=f"hf://{repo}", dest=str(tmp_path / "d"), block_size="64Ki", concurrency=1, verify=VerifyMode.CHECKSUMS
    ).to_args()
    env = {**os.environ, "STRATA_PROGRESS": "none"}
    marker = tmp_path / "d" / "model.safetensors.strata-partial.progress"
    # The copy reaches the origin through a gate that lets 8 blocks through and holds the next one: it is
    # killed exactly there, whatever the speed of this machine, and resumes from the last checkpoint (every
    # CHECKPOINT_BLOCKS = 4 blocks, so at block 8).
    with CountingProxy(urlsplit(os.environ["HF_ENDPOINT"]).port or 80, hold_ranges_after=8) as gate:
        env["HF_ENDPOINT"] = gate.endpoint_url
        proc = subprocess.Popen([sys.executable, "-m", "strata_loader", *args], env=env)
        try:
            gate.wait_until_holding(proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert marker.exists()
    assert not (tmp_path / "d" / MANIFEST_NAME).exists()
    res = fetch(FetchRequest.parse_args(args), progress_mode="none")
    assert res.bytes_resumed == 8 * 64 * 1024
    assert res.revision == sha
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == data
    assert res.checksums["model.safetensors"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert not marker.exists()
    verify = subprocess.run(
        [sys.executable, "-m", "strata_loader", "verify", str(tmp_path / "d")], capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stderr  # the manifest, the Hub's checksum and the safetensors header


def test_ranged_reads_on_an_endpoint_that_serves_ranges(s3_env, monkeypatch, capfd):
    """olah ignores Range on the repositories it serves, but the Hub's resolve URLs (its CDN, the Xet bridge)
    answer 206, and that is the path every block takes in production. The S3 server stands in for it here: a
    real HTTP server whose GET of `/<bucket>/<key>` honours Range, and a resolve URL
    `<endpoint>/<org>/<name>/resolve/<commit>/<path>` is such a path with the org as the bucket."""
    from concurrent.futures import ThreadPoolExecutor

    from strata_loader.fetch.hub import HubReader

    org = s3_env.create_bucket()
    commit = "c" * 40
    data = os.urandom(3 * 2**20 + 17)
    key = f"tiny/resolve/{commit}/model.safetensors"
    s3_env.client().put_object(Bucket=org, Key=key, Body=data, ACL="public-read")  # anonymous, as the CDN
    monkeypatch.setenv("HF_ENDPOINT", s3_env.endpoint_url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    reader = HubReader(f"{org}/tiny", commit, "model.safetensors", len(data))
    block = 256 * 1024 + 3
    spans = [(o, min(block, len(data) - o)) for o in range(0, len(data), block)]

    def read(span: tuple[int, int]) -> bytes:
        buf = bytearray(span[1])
        reader.read_into(span[0], memoryview(buf))
        return bytes(buf)

    with ThreadPoolExecutor(8) as ex:
        got = b"".join(ex.map(read, spans))
    assert got == data
    assert "ignores Range" not in capfd.readouterr().err  # every answer was a 206
    with pytest.raises(ValueError, match="past the end"):
        reader.read_into(len(data) - 1, memoryview(bytearray(2)))
