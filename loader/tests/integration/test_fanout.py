"""Download once, fan out: several real fetcher processes on loopback, each a "node" with its own directory,
the real S3 server as the origin behind a proxy that counts what it serves, and real `serve-peer` processes
over the copies already fetched."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from strata_loader.contract import MANIFEST_NAME, FetchRequest, VerifyMode, manifest_digest
from strata_testsupport.counting_proxy import CountingProxy
from strata_testsupport.peers import PeerStartError, fetch_process, finish_fetch, running_peer, write_token

pytestmark = pytest.mark.integration


class Origin:
    def __init__(self, bucket: str, files: dict[str, bytes], proxy: CountingProxy, env: dict[str, str]) -> None:
        self.bucket, self.files, self.proxy, self.env = bucket, files, proxy, env
        self.total = sum(len(d) for d in files.values())

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/model"


def make_origin(s3_server, files: dict[str, bytes]) -> Origin:
    bucket = s3_server.create_bucket()
    c = s3_server.client()
    for rel, data in files.items():
        c.put_object(Bucket=bucket, Key=f"model/{rel}", Body=data)
    proxy = CountingProxy(int(s3_server.endpoint_url.rsplit(":", 1)[1]))
    return Origin(bucket, files, proxy, {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url})


@pytest.fixture
def origin(s3_server):
    files = {
        "config.json": b'{"model_type": "llama"}',
        "model-00001-of-00002.safetensors": os.urandom(3 * 2**20 + 17),
        "nested/model-00002-of-00002.safetensors": os.urandom(2 * 2**20 + 5),
    }
    o = make_origin(s3_server, files)
    yield o
    o.proxy.close()


@pytest.fixture
def token(tmp_path) -> Path:
    return write_token(tmp_path / "token")


def node_args(origin: Origin, dest: Path, peers: list[str], token: Path | None, **kw: object) -> list[str]:
    """A node's fetch; with peers, trusting the manifest of the first copy (`seed`, default: node-1 beside
    `dest`), as the operator does with the seed's manifestSha256."""
    seed = Path(str(kw.pop("seed", dest.parent / "node-1")))
    req = FetchRequest(
        source=origin.uri,
        dest=str(dest),
        verify=VerifyMode.CHECKSUMS,
        block_size=kw.pop("block_size", "256Ki"),
        concurrency=kw.pop("concurrency", 4),
        peers=peers,
        peer_token_file=str(token) if peers and token else None,
        peer_manifest_sha256=manifest_digest((seed / MANIFEST_NAME).read_bytes()) if peers else None,
    )
    return req.to_args()


def run_node(origin: Origin, dest: Path, peers: list[str] = (), token: Path | None = None) -> dict[str, object]:
    log = dest.parent / f"{dest.name}.termination"
    return finish_fetch(fetch_process(node_args(origin, dest, list(peers), token), origin.env, log), log)


def assert_copy(origin: Origin, dest: Path) -> None:
    for rel, data in origin.files.items():
        assert (dest / rel).read_bytes() == data, rel
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    sums = {f["path"]: f["checksums"]["sha256"] for f in manifest["files"]}
    assert sums == {rel: hashlib.sha256(d).hexdigest() for rel, d in origin.files.items()}


def test_origin_serves_each_byte_once_while_every_node_verifies(origin, token, tmp_path):
    first = run_node(origin, tmp_path / "node-1")
    assert first["bytes_from_peers"] == 0
    assert origin.proxy.range_bytes == origin.total
    with running_peer(tmp_path / "node-1", token) as p1:
        logs = {n: tmp_path / f"node-{n}.termination" for n in (2, 3)}
        procs = {
            n: fetch_process(node_args(origin, tmp_path / f"node-{n}", [p1.url], token), origin.env, logs[n])
            for n in (2, 3)
        }
        results = {n: finish_fetch(procs[n], logs[n]) for n in procs}
        with running_peer(tmp_path / "node-2", token) as p2:
            results[4] = run_node(origin, tmp_path / "node-4", [p1.url, p2.url], token)
    assert p2.served is not None and 0 < p2.served["bytes"] < origin.total  # node 4 read from both peers ...
    assert p1.served is not None and p1.served["bytes"] == 3 * origin.total - p2.served["bytes"]  # ... in parallel
    assert origin.proxy.range_bytes == origin.total, "the origin served some byte more than once"
    assert origin.proxy.unranged_gets == 0
    assert origin.proxy.response_bytes < origin.total + 2**20  # headers and listings, no second copy
    for n in (1, 2, 3, 4):
        assert_copy(origin, tmp_path / f"node-{n}")
    for n in (2, 3, 4):
        assert results[n]["bytes_from_peers"] == origin.total
        assert results[n]["checksums"] == first["checksums"]


def test_a_peer_killed_mid_transfer_does_not_fail_the_fetch(s3_server, token, tmp_path):
    origin = make_origin(s3_server, {"big.safetensors": os.urandom(24 * 2**20), "config.json": b"{}"})
    try:
        run_node(origin, tmp_path / "node-1")
        with running_peer(tmp_path / "node-1", token) as victim:
            run_node(origin, tmp_path / "node-2", [victim.url], token)
            with running_peer(tmp_path / "node-2", token) as survivor:
                origin.proxy.reset()
                dest = tmp_path / "node-3"
                log = tmp_path / "node-3.termination"
                args = node_args(origin, dest, [victim.url, survivor.url], token, block_size="64Ki", concurrency=1)
                proc = fetch_process(args, origin.env, log)
                wait_for_partial_bytes(dest / "big.safetensors.strata-partial", 2**20, proc)
                assert not (dest / MANIFEST_NAME).exists()
                victim.process.send_signal(signal.SIGKILL)
                result = finish_fetch(proc, log)
        assert victim.process.returncode == -signal.SIGKILL
        assert_copy(origin, dest)
        assert result["bytes_from_peers"] == origin.total
        assert origin.proxy.range_bytes == 0
        assert "peer http://127.0.0.1:" in str(result["stderr"])  # the dead peer was named and dropped
    finally:
        origin.proxy.close()


def test_when_the_last_peer_dies_the_rest_comes_from_the_origin(s3_server, token, tmp_path):
    origin = make_origin(s3_server, {"big.safetensors": os.urandom(16 * 2**20)})
    try:
        run_node(origin, tmp_path / "node-1")
        with running_peer(tmp_path / "node-1", token) as only:
            origin.proxy.reset()
            dest = tmp_path / "node-2"
            log = tmp_path / "node-2.termination"
            proc = fetch_process(
                node_args(origin, dest, [only.url], token, block_size="64Ki", concurrency=1), origin.env, log
            )
            wait_for_partial_bytes(dest / "big.safetensors.strata-partial", 2**20, proc)
            only.process.send_signal(signal.SIGKILL)
            result = finish_fetch(proc, log)
        assert_copy(origin, dest)
        from_peers = int(str(result["bytes_from_peers"]))
        assert 0 < from_peers < origin.total
        assert origin.proxy.range_bytes == origin.total - from_peers  # the origin filled in only what was left
    finally:
        origin.proxy.close()


def wait_for_partial_bytes(path: Path, n: int, proc: subprocess.Popen[str]) -> None:
    """Until the fetch has written `n` bytes of the file: the transfer is under way."""
    while proc.poll() is None:
        try:
            if path.stat().st_size >= n:
                return
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    raise AssertionError(f"the fetch ended ({proc.returncode}) before {path} held {n} bytes")


def request(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_peer_serves_only_the_copys_files_to_token_holders(origin, token, tmp_path):
    run_node(origin, tmp_path / "node-1")
    (tmp_path / "node-1" / "extra.bin").write_bytes(b"not in the manifest")
    (tmp_path / "outside.txt").write_bytes(b"secret")
    auth = {"Authorization": f"Bearer {token.read_text().strip()}"}
    rel = "nested/model-00002-of-00002.safetensors"
    with running_peer(tmp_path / "node-1", token) as p:
        status, headers, _ = request(p.url, f"/v1/files/{rel}")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert request(p.url, "/v1/manifest")[0] == 401
        assert request(p.url, f"/v1/files/{rel}", {"Authorization": "Bearer " + "x" * 64})[0] == 403
        assert request(p.url, "/v1/manifest", {"Authorization": "Basic dXNlcjpwYXNz"})[0] == 401
        assert request(p.url, "/healthz")[0] == 200  # the probe needs no token and says only "ready"

        status, headers, body = request(p.url, f"/v1/files/{rel}", {**auth, "Range": "bytes=10-1033"})
        assert status == 206 and body == origin.files[rel][10:1034]
        assert headers["Content-Range"] == f"bytes 10-1033/{len(origin.files[rel])}"
        assert request(p.url, "/v1/manifest", auth)[0] == 200

        for path in (
            "/v1/files/../outside.txt",
            "/v1/files/%2e%2e/outside.txt",
            "/v1/files/nested/../config.json",
            "/v1/files//etc/passwd",
            "/v1/files/./config.json",
        ):
            status, _, body = request(p.url, path, auth)
            assert status == 400 and b"secret" not in body, path
        for path in ("/v1/files/extra.bin", f"/v1/files/{MANIFEST_NAME}", "/v1/files/nested", "/", "/v1/files/"):
            assert request(p.url, path, auth)[0] in (400, 404), path
        assert request(p.url, f"/v1/files/{rel}", {**auth, "Range": "bytes=0-1,5-9"})[0] == 416
        assert request(p.url, f"/v1/files/{rel}", {**auth, "Range": f"bytes={10**9}-"})[0] == 416


def test_a_fetcher_with_the_wrong_token_is_refused_and_reads_the_origin(origin, token, tmp_path):
    run_node(origin, tmp_path / "node-1")
    wrong = write_token(tmp_path / "wrong-token")
    with running_peer(tmp_path / "node-1", token) as p:
        origin.proxy.reset()
        result = run_node(origin, tmp_path / "node-2", [p.url], wrong)
    assert result["bytes_from_peers"] == 0
    assert "did not prove it holds our token" in str(result["stderr"])
    assert origin.proxy.range_bytes == origin.total
    assert_copy(origin, tmp_path / "node-2")


def test_peer_refuses_to_serve_a_damaged_or_incomplete_copy(origin, token, tmp_path):
    run_node(origin, tmp_path / "node-1")
    target = tmp_path / "node-1" / "model-00001-of-00002.safetensors"
    data = bytearray(target.read_bytes())
    data[100] ^= 1
    target.write_bytes(bytes(data))
    node = tmp_path / "node-1"
    with pytest.raises(PeerStartError, match=r"content differs.*re-run fetch"), running_peer(node, token):
        pass
    (tmp_path / "empty").mkdir()
    with pytest.raises(PeerStartError, match="the copy is incomplete"), running_peer(tmp_path / "empty", token):
        pass
    short = tmp_path / "short-token"
    short.write_text("abc")
    with pytest.raises(PeerStartError, match="shorter than 16"), running_peer(tmp_path / "node-1", short):
        pass


def test_a_connection_over_the_limit_closes_the_one_waiting_longest_and_is_served(origin, token, tmp_path):
    """With room for one connection, each new one pushes out the one waiting for its next request.

    Every step waits on something the peer did, never on time: a connection is known to be waiting once the
    doorman has answered a health probe on it (it answers only connections it holds), and a served request's
    connection is handed back to the doorman after the response has left, so the test asks again on that
    connection before counting on it being pushed out (a new connection while it is still being served is
    refused, by design).
    """
    run_node(origin, tmp_path / "node-1")
    auth = {"Authorization": f"Bearer {token.read_text().strip()}"}
    manifest = (tmp_path / "node-1" / MANIFEST_NAME).read_bytes()
    with running_peer(tmp_path / "node-1", token, max_connections=1) as p:
        host, port = p.url.removeprefix("http://").split(":")
        held = http.client.HTTPConnection(host, int(port), timeout=10)
        served = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            held.request("GET", "/healthz")
            assert held.getresponse().read() == b"ready\n"  # kept alive: the one connection, waiting for a request
            served.request("GET", "/v1/manifest", headers=auth)
            response = served.getresponse()
            assert (response.status, response.read()) == (200, manifest)
            assert held.sock is not None and held.sock.recv(1) == b"", "the idle connection made room"
            served.request("GET", "/healthz")  # answered once the doorman holds the connection again
            assert served.getresponse().read() == b"ready\n"
            assert request(p.url, "/healthz")[0:3:2] == (200, b"ready\n")
            assert served.sock is not None and served.sock.recv(1) == b"", "the served one, waiting again, made room"
        finally:
            held.close()
            served.close()
