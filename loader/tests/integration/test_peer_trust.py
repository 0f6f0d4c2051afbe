"""Whom a fetcher trusts (`strata_loader.peer.trust`): a local source (the origin vouches for no checksum, like
S3 multipart objects and pvc://), real `serve-peer` and fetch processes, a pod with the peer labels played by a
real peer over a changed copy or by a server that records what it is sent; and the Hub's git blob ids, which
vouch for files outside LFS."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from strata_loader.contract import MANIFEST_NAME, FetchRequest, VerifyMode
from strata_loader.fetch.run import FetchError, fetch
from strata_testsupport.peers import fetch_process, finish_fetch, running_peer, write_token

pytestmark = pytest.mark.integration

FILES = {
    "config.json": b'{"model_type": "llama", "vocab_size": 32000}',
    "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
    "model.safetensors": os.urandom(2**20 + 3),
}


@pytest.fixture
def token(tmp_path) -> Path:
    return write_token(tmp_path / "token")


@pytest.fixture
def source(tmp_path) -> Path:
    d = tmp_path / "source"
    for rel, data in FILES.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


def node(
    source: Path, dest: Path, peers: Sequence[str] = (), token: Path | None = None, digest: str | None = None
) -> dict[str, object]:
    req = FetchRequest(
        source=str(source),
        dest=str(dest),
        verify=VerifyMode.CHECKSUMS,
        block_size="256Ki",
        concurrency=4,
        peers=list(peers),
        peer_token_file=str(token) if peers else None,
        peer_manifest_sha256=digest,
    )
    log = dest.parent / f"{dest.name}.termination"
    return finish_fetch(fetch_process(req.to_args(), {}, log), log)


def changed_copy(good: Path, bad: Path) -> None:
    """What the issue's pod served: the same files with config.json and tokenizer_config.json changed (same
    sizes), and a manifest that matches them."""
    shutil.copytree(good, bad)
    manifest = json.loads((bad / MANIFEST_NAME).read_text())
    for f in manifest["files"]:
        if f["path"].endswith("config.json"):
            data = bytearray((bad / f["path"]).read_bytes())
            data[2:7] = b"EVIL!"
            (bad / f["path"]).write_bytes(data)
            f["checksums"] = {"sha256": hashlib.sha256(data).hexdigest()}
    (bad / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_a_peer_with_another_manifest_is_refused_where_the_origin_vouches_for_nothing(source, token, tmp_path):
    seed = node(source, tmp_path / "node-1")
    changed_copy(tmp_path / "node-1", tmp_path / "evil")
    with running_peer(tmp_path / "evil", token) as evil, running_peer(tmp_path / "node-1", token) as good:
        result = node(source, tmp_path / "node-2", [evil.url, good.url], token, str(seed["manifest_sha256"]))
    assert f"peer {evil.url}: did not prove it holds our token and the first copy's manifest" in str(result["stderr"])
    for rel, data in FILES.items():
        assert (tmp_path / "node-2" / rel).read_bytes() == data, rel
    assert result["bytes_from_peers"] == sum(len(d) for d in FILES.values())  # all from the good peer
    assert evil.served == {"bytes": 0, "ranges": 0}
    # The copy has the first copy's manifest byte for byte: it can serve the next nodes in turn.
    assert result["manifest_sha256"] == seed["manifest_sha256"]


class _Recorder(BaseHTTPRequestHandler):
    """A pod with the peer labels but not the token: it records what fetchers send and answers as it can."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, str]]
    manifest: bytes

    def do_GET(self) -> None:
        self.seen.append({"path": self.path, **dict(self.headers)})
        body = b"0" * 64 if self.path.startswith("/v1/proof") else self.manifest
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"seen": [], "manifest": b""})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_the_token_is_not_sent_to_a_peer_that_cannot_prove_it_holds_it(source, token, tmp_path, recorder):
    url, handler = recorder
    seed = node(source, tmp_path / "node-1")
    handler.manifest = (tmp_path / "node-1" / MANIFEST_NAME).read_bytes()  # it even has the real manifest
    result = node(source, tmp_path / "node-2", [url], token, str(seed["manifest_sha256"]))
    assert handler.seen, "the fetcher never asked the pod"
    assert not [h for h in handler.seen if "Authorization" in h], (
        "the fetcher sent its token to a pod that proved nothing"
    )
    assert result["bytes_from_peers"] == 0
    assert (tmp_path / "node-2" / "config.json").read_bytes() == FILES["config.json"]


def hf_cache(root: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """A Hugging Face cache holding one commit: blobs named by git blob id (outside LFS) or SHA-256 (LFS)."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    commit = "c" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    for rel, data in files.items():
        if rel.endswith(".safetensors"):
            name = hashlib.sha256(data).hexdigest()
        else:
            name = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        (repo / "blobs").mkdir(exist_ok=True)
        (repo / "blobs" / name).write_bytes(data)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / name, link.parent))


def test_the_git_blob_id_vouches_for_hub_files_outside_lfs(tmp_path, monkeypatch):
    hf_cache(tmp_path / "hub", "org/tiny", FILES)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    req = FetchRequest(source="hf://org/tiny", dest=str(tmp_path / "good"), verify=VerifyMode.CHECKSUMS)
    fetch(req, progress_mode="none")
    manifest = json.loads((tmp_path / "good" / MANIFEST_NAME).read_text())
    assert {f["path"]: sorted(f["checksums"]) for f in manifest["files"]}["config.json"] == ["git-blob-sha1", "sha256"]

    blob = next(p for p in (tmp_path / "hub").rglob("blobs/*") if p.read_bytes() == FILES["config.json"])
    blob.write_bytes(FILES["config.json"].replace(b"llama", b"EVIL!"))  # same size, under the same blob id
    bad = req.model_copy(update={"dest": str(tmp_path / "bad")})
    with pytest.raises(FetchError, match=r"config.json: git-blob-sha1 .* does not match the source's"):
        fetch(bad, progress_mode="none")
    assert not (tmp_path / "bad" / "config.json").exists()
