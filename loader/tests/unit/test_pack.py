"""`strata-loader pack` without a registry: which files go in which layer, the layers' tar bytes, reproducible
digests, the image documents, and the refusals."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
from strata_loader.cli import main
from strata_loader.contract import MANIFEST_NAME
from strata_loader.core.manifest import Manifest, ManifestFile, write_manifest
from strata_loader.pack import PackError, Reference, pack
from strata_loader.pack import vocabulary as v
from strata_loader.pack.layers import MAX_LAYERS, model_files, plan_layers
from strata_testsupport.models import WEIGHTS
from strata_testsupport.models import write_raw_model as write_model


def layer_bytes(image, index: int) -> bytes:
    return b"".join(image.layers[index].layer.chunks())


def untar(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_same_files_give_the_same_digest_whenever_and_however_they_were_written(tmp_path):
    write_model(tmp_path / "a")
    write_model(tmp_path / "b", reverse=True)
    for path in (tmp_path / "b").rglob("*"):  # other times, other modes: none of it is in the image
        os.utime(path, (1_000_000, 1_000_000))
        if path.is_file():
            path.chmod(0o600)
    first, second = pack(tmp_path / "a"), pack(tmp_path / "b")
    assert first.digest == second.digest
    assert [p.digest for p in first.layers] == [p.digest for p in second.layers]
    assert pack(tmp_path / "a").digest == first.digest


def test_a_new_config_json_changes_the_small_files_layer_and_nothing_under_it(tmp_path):
    write_model(tmp_path / "v1")
    write_model(tmp_path / "v2", config='{"model_type": "tiny", "max_position_embeddings": 4096}')
    old, new = pack(tmp_path / "v1"), pack(tmp_path / "v2")
    assert [p.digest for p in old.layers[:-1]] == [p.digest for p in new.layers[:-1]]
    assert old.layers[-1].digest != new.layers[-1].digest
    assert new.layers[-1].size < 64 * 2**10
    assert old.digest != new.digest


def test_large_files_get_a_layer_each_and_the_small_ones_share_the_last(tmp_path):
    files = write_model(tmp_path / "m")
    image = pack(tmp_path / "m")
    assert [[f.path for f in p.layer.files] for p in image.layers] == [
        ["model-00001-of-00002.safetensors"],
        ["model-00002-of-00002.safetensors"],
        ["config.json", "tokenizer/special_tokens.json"],
    ]
    for index, packed in enumerate(image.layers):
        data = layer_bytes(image, index)
        assert len(data) == packed.size  # the size computed from headers is the stream's
        members = untar(data)
        assert members["models"].isdir() and members["models"].mode == 0o755
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for f in packed.layer.files:
                member = members[f"models/{f.path}"]
                assert (member.mode, member.uid, member.gid, member.mtime) == (0o644, 0, 0, 0)
                extracted = tar.extractfile(member)
                assert extracted is not None and extracted.read() == files[f.path]
    assert "models/tokenizer" in untar(layer_bytes(image, 2))


def test_the_documents_name_every_layer_for_each_platform(tmp_path):
    write_model(tmp_path / "m")
    image = pack(tmp_path / "m", annotations={v.TITLE: "tiny"})
    index = json.loads(image.index.data)
    assert index["mediaType"] == v.MEDIA_TYPE_INDEX
    assert [m["platform"] for m in index["manifests"]] == [
        {"os": "linux", "architecture": "amd64"},
        {"os": "linux", "architecture": "arm64"},
    ]
    assert [m["digest"] for m in index["manifests"]] == [m.digest for m in image.manifests]
    for manifest_blob, config_blob in zip(image.manifests, image.configs, strict=True):
        manifest, config = json.loads(manifest_blob.data), json.loads(config_blob.data)
        assert manifest["config"]["digest"] == config_blob.digest
        assert manifest["config"]["mediaType"] == v.MEDIA_TYPE_CONFIG
        assert [layer["digest"] for layer in manifest["layers"]] == config["rootfs"]["diff_ids"]
        assert {layer["mediaType"] for layer in manifest["layers"]} == {v.MEDIA_TYPE_LAYER}
        assert manifest["annotations"] == {v.TITLE: "tiny"}
        assert "created" not in config
    weights = json.loads(image.manifests[0].data)["layers"][0]["annotations"]
    assert weights[v.MODEL_FILEPATH] == "model-00001-of-00002.safetensors"
    metadata = json.loads(weights[v.MODEL_FILE_METADATA])
    assert metadata == {
        "name": "model-00001-of-00002.safetensors",
        "mode": 0o644,
        "uid": 0,
        "gid": 0,
        "size": WEIGHTS,
        "mtime": "1970-01-01T00:00:00Z",
        "typeflag": ord("0"),
    }
    assert "annotations" not in json.loads(image.manifests[0].data)["layers"][-1]


def test_a_created_time_is_recorded_only_when_given(tmp_path):
    write_model(tmp_path / "m")
    image = pack(tmp_path / "m", created="2026-12-01T00:00:00Z", platforms=("linux/amd64",))
    assert json.loads(image.configs[0].data)["created"] == "2026-12-01T00:00:00Z"
    assert image.annotations[v.CREATED] == "2026-12-01T00:00:00Z"
    assert image.digest != pack(tmp_path / "m", platforms=("linux/amd64",)).digest


def test_a_verified_copy_is_packed_as_its_manifest_lists_it(tmp_path):
    files = write_model(tmp_path / "copy")
    entries = [ManifestFile(path=name, size=len(data)) for name, data in files.items()]
    write_manifest(tmp_path / "copy", Manifest(source="s3://models/tiny", revision="r7", files=entries))
    (tmp_path / "copy" / "notes.txt").write_text("written after the fetch")
    image = pack(tmp_path / "copy")
    packed = sorted(f.path for p in image.layers for f in p.layer.files)
    assert packed == sorted(files)  # neither the manifest nor the stray file
    assert MANIFEST_NAME not in packed
    assert image.annotations == {v.SOURCE: "s3://models/tiny", v.REVISION: "r7"}

    (tmp_path / "copy" / "config.json").write_text("{}")
    with pytest.raises(PackError, match=r"config.json has 2 bytes, the manifest says \d+; re-run fetch"):
        pack(tmp_path / "copy")


def test_sizes_beyond_ustar_and_long_names_get_pax_headers(tmp_path):
    big = tmp_path / "m" / ("a" * 120) / "weights.safetensors"
    big.parent.mkdir(parents=True)
    with open(big, "wb") as f:  # sparse: nothing is read, only the header is made
        f.truncate(9 * 2**30)
    layer = plan_layers(model_files(tmp_path / "m"), prefix="models")[0]
    chunks = layer.chunks()
    directories, file_header = next(chunks) + next(chunks), next(chunks)  # the file's data is never read
    assert f"path=models/{'a' * 120}/\n".encode() in directories
    assert f"path=models/{'a' * 120}/weights.safetensors\n".encode() in file_header
    assert f"size={9 * 2**30}\n".encode() in file_header
    header = directories + file_header
    assert layer.size == len(header) + 9 * 2**30 + 1024


def test_hugging_face_snapshot_symlinks_are_followed(tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"weights" * 1000)
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "model.safetensors").symlink_to(blobs / "abc")
    image = pack(snapshot, threshold=0)
    data = layer_bytes(image, 0)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        member = tar.getmember("models/model.safetensors")
        assert member.isfile()
        extracted = tar.extractfile(member)
        assert extracted is not None and extracted.read() == b"weights" * 1000


def test_what_cannot_be_packed_is_refused_with_the_reason(tmp_path):
    with pytest.raises(PackError, match="not a directory"):
        pack(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackError, match="no files to pack"):
        pack(tmp_path / "empty")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "pipe")
    with pytest.raises(PackError, match="pipe: not a regular file"):
        pack(tmp_path / "fifo")
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "x").write_text("x")
    (tmp_path / "loop" / "again").symlink_to(tmp_path / "loop")
    with pytest.raises(PackError, match="reached twice through symlinks"):
        pack(tmp_path / "loop")
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "w.safetensors.strata-partial").write_text("half")
    with pytest.raises(PackError, match="partial download"):
        pack(tmp_path / "partial")
    write_model(tmp_path / "m")
    with pytest.raises(PackError, match=r"prefix '\.\./etc' has a '\.\.' segment"):
        pack(tmp_path / "m", prefix="../etc")
    with pytest.raises(PackError, match="expected os/arch"):
        pack(tmp_path / "m", platforms=("amd64",))
    many = tmp_path / "many"
    many.mkdir()
    for i in range(MAX_LAYERS + 1):
        (many / f"{i:03d}.bin").write_bytes(b"xx")
    with pytest.raises(PackError, match="raise --layer-threshold"):
        pack(many, threshold=1)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("models/tiny:v1", "name the registry"),
        ("registry.local/models/tiny", "name a tag"),
        ("registry.local/Models/tiny:v1", "must be lowercase"),
        ("registry.local/models/tiny:v1@sha256:" + "0" * 64, "push to a tag"),
        ("registry.local/models/tiny:-v1", "tag '-v1'"),
    ],
)
def test_references_name_a_registry_repository_and_tag(text, problem):
    with pytest.raises(PackError, match=problem):
        Reference.parse(text)


def test_references_parse():
    assert Reference.parse("oci://10.0.0.1:5000/models/tiny:v1") == Reference("10.0.0.1:5000", "models/tiny", "v1")
    assert str(Reference.parse("localhost/a/b_c:1.0")) == "localhost/a/b_c:1.0"


def test_the_cli_dry_run_prints_the_digest_and_errors_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("STRATA_REGISTRY_PASSWORD", raising=False)
    write_model(tmp_path / "m")
    assert main(["pack", str(tmp_path / "m"), "--platform", "linux/amd64"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["event"] == "packed"
    assert summary["digest"] == pack(tmp_path / "m", platforms=("linux/amd64",)).digest
    assert [layer["files"] for layer in summary["layers"]] == [1, 1, 2]
    assert main(["pack", str(tmp_path / "m"), "--to", "models/tiny:v1"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "strata-loader pack: error: reference 'models/tiny:v1': name the registry, e.g."
        " registry.example.com/models/name:tag"
    ]
    assert main(["pack", str(tmp_path / "m"), "--to", "r.local/m:v1", "--username", "u"]) == 1
    assert "--password-stdin or $STRATA_REGISTRY_PASSWORD" in capsys.readouterr().err


def test_an_empty_prefix_puts_the_files_at_the_image_root(tmp_path):
    write_model(tmp_path / "m")
    image = pack(tmp_path / "m", prefix="")
    members = untar(layer_bytes(image, 2))
    assert sorted(members) == ["config.json", "tokenizer", "tokenizer/special_tokens.json"]
