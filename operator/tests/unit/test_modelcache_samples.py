"""The ModelCache samples `make demo` applies parse as specs; the API server's own check of them (schema and
CEL rules) is in the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from strata_operator.api.modelcache import ModelCacheSpec

SAMPLES = sorted((Path(__file__).resolve().parents[3] / "samples").glob("modelcache-*.yaml"))


def test_there_is_a_sample_per_mode() -> None:
    modes = set()
    for path in SAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "ModelCache":
                modes.add(doc["spec"]["storage"]["mode"])
    assert modes == {"SharedPVC", "NodeLocal", "ImageVolume"}


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_sample_parses(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc["kind"] == "ModelCache":
            assert len(doc["metadata"]["name"]) <= 63
            ModelCacheSpec.model_validate(doc["spec"])
