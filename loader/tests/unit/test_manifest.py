"""The manifest only ever holds clean relative paths: such a manifest is never written, and one read back is
not trusted."""

import json

import pytest
from pydantic import ValidationError
from strata_loader.contract import MANIFEST_NAME
from strata_loader.core.manifest import (
    Manifest,
    ManifestError,
    ManifestFile,
    load_manifest,
    read_manifest,
    write_manifest,
)

DIRTY = ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a\\b", "a\x00b", ""]


def manifest(*paths: str) -> Manifest:
    return Manifest(source="/src", files=[ManifestFile(path=p, size=1) for p in paths])


@pytest.mark.parametrize("path", DIRTY)
def test_a_manifest_with_a_dirty_path_cannot_be_made(path):
    with pytest.raises(ValidationError, match="path"):
        manifest("config.json", path)


@pytest.mark.parametrize("path", DIRTY)
def test_a_manifest_read_back_with_a_dirty_path_is_refused(tmp_path, path):
    data = manifest("config.json", "model.safetensors").model_dump(mode="json")
    data["files"][1]["path"] = path
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    assert read_manifest(tmp_path) is None
    with pytest.raises(ManifestError, match=r"files\.1\.path: path .* the copy is incomplete") as e:
        load_manifest(tmp_path)
    assert "\n" not in str(e.value)


def test_clean_manifest_round_trips(tmp_path):
    m = manifest("config.json", "original/consolidated.pth")
    write_manifest(tmp_path, m)
    assert load_manifest(tmp_path) == m


def test_missing_manifest_says_the_copy_is_incomplete(tmp_path):
    assert read_manifest(tmp_path) is None
    with pytest.raises(ManifestError, match="incomplete"):
        load_manifest(tmp_path)


def test_manifest_is_not_written_through_a_planted_temp_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / (MANIFEST_NAME + ".tmp")).symlink_to(victim)
    write_manifest(dest, manifest("config.json"))
    assert victim.read_text() == "keep me"
    assert not (dest / MANIFEST_NAME).is_symlink() and load_manifest(dest).files[0].path == "config.json"
