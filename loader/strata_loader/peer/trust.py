"""Whom a fetcher trusts among its peers, and what a peer proves before it gets the token.

The trust model:
- The token is one Secret in the cache's namespace, mounted by its peers and its fetchers. It keeps out
  everything else that reaches the peer port (other namespaces' pods, anything on the node network), not the
  namespace's own users: whoever can create pods there can mount it. So the token alone never vouches for
  content.
- What vouches for content is the first copy's manifest: the seed read the origin and hashed every file, and
  the operator recorded the SHA-256 of that manifest (`status.fanOut.manifestSha256`) and gives it to every
  fetcher (`--peer-manifest-sha256`). A fetcher uses a peer only if the manifest it serves hashes to exactly
  that, and then checks every byte it reads against that manifest's checksums (and the origin's own where it
  has them: S3 MD5 ETags, the Hub's LFS SHA-256 and git blob ids). A peer holding any other manifest (a pod
  with the peer labels and a changed config.json, a copy made from another revision) is refused whole.
- Before the token is sent, the peer proves it holds both the token and that manifest, without either being
  sent: the fetcher asks `GET /v1/proof?nonce=N` (no token) and the peer answers
  HMAC-SHA256(token, "strata-peer-proof/1" | N | the address the fetcher connected to | manifest digest).
  A pod without the token, or serving another manifest, cannot answer, and gets nothing; the address binds
  the answer to the connection, so a pod cannot relay a real peer's proof as its own.
- What remains: a namespace user who holds the token and a copy of the right manifest passes the proof; the
  bytes it serves are still checked, so it can fail a fetch (a file that does not match is removed and the
  Job fails), not change what lands.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re

PROOF_URL_PATH = "/v1/proof"
NONCE = re.compile(r"^[0-9a-f]{32,128}$")
_LABEL = b"strata-peer-proof/1"


def connection_address(sockaddr: tuple[object, ...]) -> str:
    """`host:port` of one end of a TCP connection, written the same on both ends (an IPv4 address seen through
    a dual-stack socket as ::ffff:a.b.c.d is written a.b.c.d; an IPv6 zone is dropped)."""
    host, port = str(sockaddr[0]).split("%", 1)[0], int(str(sockaddr[1]))
    ip = ipaddress.ip_address(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"{ip.compressed}:{port}" if ip.version == 4 else f"[{ip.compressed}]:{port}"


def proof(token: bytes, nonce: str, address: str, manifest_digest: str) -> str:
    """What a peer answers to `nonce` on a connection to `address`, serving a manifest with `manifest_digest`."""
    message = b"\n".join((_LABEL, nonce.encode(), address.encode(), manifest_digest.encode()))
    return hmac.new(token, message, hashlib.sha256).hexdigest()
