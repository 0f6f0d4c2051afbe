"""`fetch` from filesystems: complete copies, resume, verification, atomic completion, and a really full disk."""

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from strata_loader.contract import MANIFEST_NAME, PARTIAL_SUFFIX, FetchRequest, FetchResult, VerifyMode
from strata_loader.fetch.catalog import list_source
from strata_loader.fetch.run import PROGRESS_SUFFIX, FetchError, fetch

pytestmark = pytest.mark.integration


def make_model(root: Path, big: int = 3 * 2**20) -> dict[str, bytes]:
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(7)
    save_file({"w": torch.randn(256, 256, generator=gen)}, root / "model-00001-of-00002.safetensors")
    save_file({"v": torch.randn(64, generator=gen)}, root / "model-00002-of-00002.safetensors")
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "original").mkdir(exist_ok=True)
    (root / "original" / "consolidated.pth").write_bytes(os.urandom(big))
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_copy_is_complete_and_marked_last(tmp_path):
    files = make_model(tmp_path / "src")
    req = FetchRequest(
        source=str(tmp_path / "src"),
        dest=str(tmp_path / "dst"),
        block_size="256Ki",
        concurrency=4,
        verify=VerifyMode.CHECKSUMS,
    )
    res = fetch(req, progress_mode="none")
    got = tree(tmp_path / "dst")
    manifest = json.loads(got.pop(MANIFEST_NAME))
    assert got == files
    assert res.files == 4 and res.bytes == sum(len(b) for b in files.values())
    assert {f["path"] for f in manifest["files"]} == set(files)
    for path, data in files.items():
        assert res.checksums[path] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert (
        res.manifest_sha256 == "sha256:" + hashlib.sha256((tmp_path / "dst" / MANIFEST_NAME).read_bytes()).hexdigest()
    )


def test_include_exclude_globs(tmp_path):
    make_model(tmp_path / "src")
    req = FetchRequest(
        source=str(tmp_path / "src"),
        dest=str(tmp_path / "dst"),
        include=["*.safetensors", "*.json"],
        exclude=["model-00002-*"],
    )
    fetch(req, progress_mode="none")
    assert sorted(tree(tmp_path / "dst")) == [MANIFEST_NAME, "config.json", "model-00001-of-00002.safetensors"]


def test_rerun_of_a_complete_copy_copies_nothing(tmp_path):
    make_model(tmp_path / "src")
    req = FetchRequest(source=str(tmp_path / "src"), dest=str(tmp_path / "dst"))
    first = fetch(req, progress_mode="none")
    before = (tmp_path / "dst" / MANIFEST_NAME).stat().st_mtime_ns
    second = fetch(req, progress_mode="none")
    assert second.bytes_resumed == second.bytes == first.bytes
    assert (tmp_path / "dst" / MANIFEST_NAME).stat().st_mtime_ns == before


def test_resume_continues_a_partial_file_from_its_recorded_point(tmp_path):
    files = make_model(tmp_path / "src")
    dst = tmp_path / "dst" / "original"
    dst.mkdir(parents=True)
    data = files["original/consolidated.pth"]
    done = 2 * 2**20
    # what an interrupted run leaves: a verified prefix, bytes past it from out-of-order blocks, a marker
    (dst / ("consolidated.pth" + PARTIAL_SUFFIX)).write_bytes(data[:done] + b"\xff" * 1000)
    req = FetchRequest(
        source=str(tmp_path / "src"), dest=str(tmp_path / "dst"), block_size="256Ki", verify=VerifyMode.CHECKSUMS
    )
    version = {f.relpath: f.version for f in list_source(req)[0]}["original/consolidated.pth"]
    marker = {"contiguous_bytes": done, "version": version}
    (dst / ("consolidated.pth" + PROGRESS_SUFFIX)).write_text(json.dumps(marker))
    res = fetch(req, progress_mode="none")
    assert res.bytes_resumed == done
    got = tree(tmp_path / "dst")
    got.pop(MANIFEST_NAME)
    assert got == files  # no partial or marker left, and the tail past the marker was rewritten


def test_partial_from_another_source_version_is_not_resumed(tmp_path):
    files = make_model(tmp_path / "src")
    dst = tmp_path / "dst" / "original"
    dst.mkdir(parents=True)
    (dst / ("consolidated.pth" + PARTIAL_SUFFIX)).write_bytes(b"\x01" * 2**20)
    marker = {"contiguous_bytes": 2**20, "version": "mtime:1"}
    (dst / ("consolidated.pth" + PROGRESS_SUFFIX)).write_text(json.dumps(marker))
    res = fetch(FetchRequest(source=str(tmp_path / "src"), dest=str(tmp_path / "dst")), progress_mode="none")
    assert res.bytes_resumed == 0
    assert (dst / "consolidated.pth").read_bytes() == files["original/consolidated.pth"]


def test_same_size_change_in_the_source_is_copied_again(tmp_path):
    make_model(tmp_path / "src")
    req = FetchRequest(source=str(tmp_path / "src"), dest=str(tmp_path / "dst"))
    fetch(req, progress_mode="none")
    cfg = tmp_path / "src" / "config.json"
    new = cfg.read_text().replace("llama", "LLAMA")
    cfg.write_text(new)
    os.utime(cfg, ns=(cfg.stat().st_atime_ns, cfg.stat().st_mtime_ns + 10**9))
    res = fetch(req, progress_mode="none")
    assert (tmp_path / "dst" / "config.json").read_text() == new
    assert res.bytes_resumed == res.bytes - len(new)


def test_source_change_makes_a_new_manifest(tmp_path):
    make_model(tmp_path / "src")
    req = FetchRequest(source=str(tmp_path / "src"), dest=str(tmp_path / "dst"))
    fetch(req, progress_mode="none")
    (tmp_path / "src" / "config.json").write_text('{"model_type": "llama", "changed": true}')
    res = fetch(req, progress_mode="none")
    assert res.bytes_resumed < res.bytes
    assert (tmp_path / "dst" / "config.json").read_text().endswith("true}")


@contextlib.contextmanager
def tmpfs(path: Path, size: str, inodes: int | None = None):
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"cannot mount a tmpfs for the full-disk test: {r.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_too_small_volume_fails_before_copying_and_leaves_no_manifest(tmp_path):
    make_model(tmp_path / "src", big=6 * 2**20)
    with tmpfs(tmp_path / "vol", "2m") as vol:
        req = FetchRequest(source=str(tmp_path / "src"), dest=str(vol / "model"))
        with pytest.raises(FetchError, match=r"needs \d+ more; enlarge the volume"):
            fetch(req, progress_mode="none")
        assert not (vol / "model" / MANIFEST_NAME).exists()


def test_disk_filling_up_mid_copy_is_a_clean_error_without_manifest(tmp_path):
    make_model(tmp_path / "src")
    # plenty of bytes but only 4 inodes: the volume runs out of space part-way through the copy
    with tmpfs(tmp_path / "vol", "64m", inodes=4) as vol:
        req = FetchRequest(source=str(tmp_path / "src"), dest=str(vol / "model"), concurrency=1)
        with pytest.raises(FetchError, match="no space left"):
            fetch(req, progress_mode="none")
        assert not (vol / "model" / MANIFEST_NAME).exists()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata_loader.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_cli_fetch_writes_json_progress_and_termination_message(tmp_path):
    make_model(tmp_path / "src")
    term = tmp_path / "termination-log"
    req = FetchRequest(source=str(tmp_path / "src"), dest=str(tmp_path / "dst"))
    r = run_cli(*req.to_args(), env={"STRATA_TERMINATION_MESSAGE_PATH": str(term), **req.to_env()})
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[-1]["event"] == "done" and any(e["event"] == "progress" for e in events)
    res = FetchResult.from_termination_message(term.read_text())
    assert res.succeeded and res.files == 4 and len(term.read_bytes()) <= 4096


def test_cli_fetch_failure_is_one_line_and_a_failed_result(tmp_path):
    term = tmp_path / "termination-log"
    r = run_cli(
        "fetch", str(tmp_path / "missing"), str(tmp_path / "dst"), env={"STRATA_TERMINATION_MESSAGE_PATH": str(term)}
    )
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    res = FetchResult.from_termination_message(term.read_text())
    assert not res.succeeded and "does not exist" in (res.error or "")


def test_cli_verify(tmp_path):
    make_model(tmp_path / "src")
    good = tmp_path / "src" / "model-00001-of-00002.safetensors"
    assert run_cli("verify", str(good)).returncode == 0
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(good.read_bytes()[:-3])
    r = run_cli("verify", str(good), str(bad))
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "truncated" in r.stderr and "Traceback" not in r.stderr


def test_cli_verify_directory_needs_a_manifest(tmp_path):
    make_model(tmp_path / "src")
    r = run_cli("verify", str(tmp_path / "src"))
    assert r.returncode != 0 and "incomplete" in r.stderr
    fetch(FetchRequest(source=str(tmp_path / "src"), dest=str(tmp_path / "dst")), progress_mode="none")
    assert run_cli("verify", str(tmp_path / "dst")).returncode == 0


def make_hf_cache(cache: Path, repo: str, files: dict[str, bytes]) -> str:
    """The real Hugging Face cache layout: blobs named by SHA-256, snapshot symlinks, a ref to the commit."""
    base = cache / ("models--" + repo.replace("/", "--"))
    commit = uuid.uuid4().hex + "0" * 8
    for rel, data in files.items():
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = base / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    return commit


def test_hf_cache_source_is_verified_against_blob_hashes(tmp_path, monkeypatch):
    files = make_model(tmp_path / "src")
    commit = make_hf_cache(tmp_path / "hub", "acme/tiny", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local cache, never the Hub
    req = FetchRequest(source="hf://acme/tiny", dest=str(tmp_path / "dst"), verify=VerifyMode.CHECKSUMS)
    res = fetch(req, progress_mode="none")
    assert res.revision == commit
    got = tree(tmp_path / "dst")
    got.pop(MANIFEST_NAME)
    assert got == files


def test_hf_blob_that_does_not_match_its_hash_is_refused(tmp_path, monkeypatch):
    files = make_model(tmp_path / "src")
    make_hf_cache(tmp_path / "hub", "acme/tiny", files)
    blob = tmp_path / "hub" / "models--acme--tiny" / "blobs" / hashlib.sha256(files["config.json"]).hexdigest()
    blob.write_bytes(b'{"model_type": "evil"}')
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local cache, never the Hub
    req = FetchRequest(source="hf://acme/tiny", dest=str(tmp_path / "dst"), verify=VerifyMode.CHECKSUMS)
    with pytest.raises(FetchError, match="does not match"):
        fetch(req, progress_mode="none")
    assert not (tmp_path / "dst" / MANIFEST_NAME).exists()
    assert not (tmp_path / "dst" / "config.json").exists()


def test_failed_refetch_of_a_changed_source_leaves_no_manifest(tmp_path, monkeypatch):
    files = make_model(tmp_path / "src")
    make_hf_cache(tmp_path / "hub", "acme/tiny", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local cache, never the Hub
    req = FetchRequest(source="hf://acme/tiny", dest=str(tmp_path / "dst"), verify=VerifyMode.CHECKSUMS)
    fetch(req, progress_mode="none")
    assert (tmp_path / "dst" / MANIFEST_NAME).exists()
    blob = tmp_path / "hub" / "models--acme--tiny" / "blobs" / hashlib.sha256(files["config.json"]).hexdigest()
    blob.write_bytes(b'{"model_type": "changed and corrupt"}')  # new size: the old copy no longer matches
    with pytest.raises(FetchError, match="does not match"):
        fetch(req, progress_mode="none")
    assert not (tmp_path / "dst" / MANIFEST_NAME).exists()


def test_hf_revision_missing_from_cache_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local cache, never the Hub
    from strata_loader.fetch.catalog import SourceError

    with pytest.raises(SourceError, match="not in the Hugging Face cache"):
        fetch(FetchRequest(source="hf://acme/none", dest=str(tmp_path / "d")), progress_mode="none")


def test_fetch_then_shard(tmp_path):
    make_model(tmp_path / "src")
    req = FetchRequest.parse_args(["fetch", str(tmp_path / "src"), str(tmp_path / "dst"), "--shard-tp", "2"])
    fetch(req, progress_mode="none")
    names = sorted(p.name for p in (tmp_path / "dst" / "sharded").iterdir())
    assert names == ["model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors"]


def test_pvc_source_reads_the_mounted_claim(tmp_path, monkeypatch):
    files = make_model(tmp_path / "mounts" / "weights-claim" / "llama")
    monkeypatch.setenv("STRATA_PVC_MOUNT_ROOT", str(tmp_path / "mounts"))
    fetch(FetchRequest(source="pvc://weights-claim/llama", dest=str(tmp_path / "dst")), progress_mode="none")
    got = tree(tmp_path / "dst")
    got.pop(MANIFEST_NAME)
    assert got == files


def test_cli_rejects_a_bad_request_in_one_plain_line(tmp_path):
    r = run_cli("fetch", "ftp://host/model", str(tmp_path / "dst"), "--block-size", "lots")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "unsupported scheme" in r.stderr and "pydantic" not in r.stderr and "Traceback" not in r.stderr
