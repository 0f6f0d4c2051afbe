"""The operator's rendered config runs a real `strata-kv serve`, and its metrics sum into status.usage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.handlers.kvcachetier.io import scrape, scrape_all
from strata_operator.resources.kvcachetier.config import build_server_config
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.usage import summarize
from strata_testsupport.kvserver import running_kv_server

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"


def rendered_config(tmp_path: Path) -> dict[str, Any]:
    """What the operator puts in the ConfigMap, with the pod's paths and ports moved onto loopback."""
    spec = KVCacheTierSpec.model_validate(
        {
            "l1": {"size": "32Mi", "evictionPolicy": "prefix-lirs"},
            "l2": {"fs": {"hostPath": {"path": "/unused"}, "capacity": "256Mi"}},
            "chunkTokens": 256,
            "hash": {"algorithm": "xxhash", "seed": "42"},
            "auth": {"secretRef": {"name": "token"}},
        }
    )
    config = build_server_config(spec, TierRef("kv", "ns", "uid")).model_dump(mode="json", exclude_none=True)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    config["listen"].update(port=0, bind="127.0.0.1")
    config["metrics"].update(port=0, bind="127.0.0.1")
    config["l2"]["fs"]["root_dir"] = str(tmp_path / "l2")
    config["auth"]["token_file"] = str(token_file)
    return dict(config)


def test_rendered_config_serves_and_usage_sums_its_metrics(tmp_path: Path) -> None:
    with running_kv_server(tmp_path / "kv", rendered_config(tmp_path), l2_fs=False) as server:
        client = server.redis(password=TOKEN)
        value = b"x" * 4096
        for index in range(3):
            assert client.set(f"model@0@0@{index:04x}", value)
        assert client.get("model@0@0@0000") == value
        assert client.get("model@0@0@0001") == value
        assert client.get("model@0@0@ffff") is None

        usage = scrape("127.0.0.1", server.metrics_port)
        assert usage is not None
        assert usage.hits["l1"] == 2 and usage.misses == 1
        assert usage.capacity["l1"] == 32 * 1024**2
        assert usage.used["l1"] >= 3 * 4096

        unreachable = scrape_all(["127.0.0.1", "127.0.0.2"], server.metrics_port)
        summary = summarize([u for u in unreachable if u is not None], instances=2)
        assert (summary["scrapedInstances"], summary["unreachableInstances"]) == (1, 1)
        assert (summary["lookups"], summary["misses"], summary["hitRatio"]) == (3, 1, "0.667")
        l1 = next(t for t in summary["tiers"] if t["tier"] == "l1")
        assert l1["hits"] == 2 and l1["hitRatio"] == "0.667" and l1["capacityBytes"] == 32 * 1024**2
