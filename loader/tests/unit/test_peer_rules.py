"""The peer server's range rule and the fetch request's peer arguments (pure parts; the processes are tested in
integration/test_fanout.py)."""

import pytest
from pydantic import ValidationError
from strata_loader.contract import FetchRequest
from strata_loader.peer.server import _parse_range

DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize(
    ("header", "size", "want"),
    [
        (None, 100, (0, 100)),
        ("bytes=0-9", 100, (0, 10)),
        ("bytes=90-200", 100, (90, 10)),  # clamped to the end, like any HTTP server
        ("bytes=90-", 100, (90, 10)),
        ("bytes=-5", 100, (95, 5)),
        ("bytes=100-", 100, None),
        ("bytes=5-4", 100, None),
        ("bytes=0-1,3-4", 100, None),
        ("items=0-1", 100, None),
        ("bytes=a-b", 100, None),
        ("bytes=-0", 100, None),
        ("bytes=0-0", 0, None),
    ],
)
def test_single_byte_ranges_only(header, size, want):
    assert _parse_range(header, size) == want


def test_peer_arguments_round_trip():
    req = FetchRequest(
        source="s3://bucket/m",
        dest="/d",
        peers=["http://strata-peer.ns.svc:8477", "http://[fd00::1]:8477", "http://10.0.0.7"],
        peer_token_file="/var/run/strata/peer/token",
        peer_manifest_sha256="sha256:" + "ab" * 32,
    )
    assert FetchRequest.parse_args(req.to_args()) == req


@pytest.mark.parametrize("url", ["https://x:1", "http://x/path", "x:8477", "http://x:8477?q", "http://a b"])
def test_peer_url_must_be_plain_http_host_port(url):
    with pytest.raises(ValidationError, match="expected http://host"):
        FetchRequest(source="s3://bucket/m", dest="/d", peers=[url], peer_token_file="/t", peer_manifest_sha256=DIGEST)


def test_peers_need_a_token_file_and_the_first_copys_manifest_digest():
    with pytest.raises(ValidationError, match="no peer_token_file"):
        FetchRequest(source="s3://bucket/m", dest="/d", peers=["http://x:1"], peer_manifest_sha256=DIGEST)
    with pytest.raises(ValidationError, match="no peer_manifest_sha256: a peer is trusted only when"):
        FetchRequest(source="s3://bucket/m", dest="/d", peers=["http://x:1"], peer_token_file="/t")
    with pytest.raises(ValidationError, match="expected sha256:<64 hex digits>"):
        FetchRequest(source="s3://m/m", dest="/d", peers=["http://x:1"], peer_token_file="/t", peer_manifest_sha256="x")
