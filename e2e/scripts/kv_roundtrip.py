"""Runs in the cluster on the GPU node with the KVCacheTier's `<name>-connection` environment: writes and
reads a chunk through the node-local Service, exactly as an engine configured from that ConfigMap would."""

from __future__ import annotations

import json
import os
import urllib.parse

from strata_kv.client import KVClient


def main() -> None:
    url = urllib.parse.urlparse(os.environ["STRATA_KV_URL"])
    key = f"e2e@{os.environ['NODE_NAME']}@chunk-0".encode()
    value = os.urandom(256 * 1024)
    with KVClient(url.hostname or "", url.port or 6379) as client:
        client.call("SET", key, value)
        found = client.call("EXISTS", key)
        back = client.call("GET", key)
        client.call("DEL", key)
    print(json.dumps({"url": os.environ["STRATA_KV_URL"], "exists": found, "roundtrip": back == value}))


if __name__ == "__main__":
    main()
