"""F1: nothing a source holds can make `fetch` write outside DEST or copy files from outside the source: unsafe
object keys and names are refused, symlinks never lead out of the source, and links planted in DEST are never
written through."""

import os
import re
from pathlib import Path

import pytest
from strata_loader.contract import MANIFEST_NAME, FetchRequest
from strata_loader.fetch.catalog import SourceError, list_source
from strata_loader.paths import UnsafePathError

from .test_fetch_local import make_model, tree

pytestmark = pytest.mark.integration


def files_outside(root: Path, dest: Path) -> list[str]:
    """Regular files under `root` that are not under `dest` (nor the source trees a test built)."""
    return sorted(
        str(p)
        for p in root.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and dest not in p.parents
        and not any(part in ("src", "outside", "mounts", "hub") for part in p.relative_to(root).parts)
    )


# --- S3 keys -------------------------------------------------------------------------------------------------


@pytest.fixture
def bucket_with(s3_env):
    def make(bad_key: str) -> str:
        bucket = s3_env.create_bucket()
        c = s3_env.client()
        c.put_object(Bucket=bucket, Key="m/config.json", Body=b"{}")
        c.put_object(Bucket=bucket, Key=bad_key, Body=b"escaped")
        return bucket

    return make


@pytest.mark.parametrize(
    "remainder,problem",
    [
        ("../../escaped", "'..'"),
        ("a/../../../escaped", "'..'"),
        ("..", "'..'"),
        ("./escaped", "'.'"),
        ("a//escaped", "empty segment"),
        ("a\\..\\escaped", "backslash"),
        ("a\x00b", "NUL"),
    ],
)
def test_s3_keys_that_break_the_path_rule_are_refused(bucket_with, tmp_path, remainder, problem):
    key = "m/" + remainder
    bucket = bucket_with(key)
    dest = tmp_path / "a" / "b" / "dst"
    with pytest.raises(SourceError, match=re.escape(problem)) as e:
        fetch_to(f"s3://{bucket}/m", dest)
    assert repr(key) in str(e.value) and "\n" not in str(e.value)
    assert files_outside(tmp_path, dest) == []
    assert not (dest / MANIFEST_NAME).exists()


def test_s3_key_with_an_absolute_remainder_is_refused(bucket_with, tmp_path):
    dest = tmp_path / "dst"
    target = tmp_path / "escaped" / "file"  # `prefix//<abs>` would join onto DEST as an absolute path
    key = "m/" + str(target)
    bucket = bucket_with(key)
    with pytest.raises(SourceError, match="absolute"):
        fetch_to(f"s3://{bucket}/m", dest)
    assert not target.exists() and files_outside(tmp_path, dest) == []


def test_s3_folder_markers_are_still_skipped(s3_env, tmp_path):
    bucket = s3_env.create_bucket()
    c = s3_env.client()
    c.put_object(Bucket=bucket, Key="m/", Body=b"")
    c.put_object(Bucket=bucket, Key="m/sub/", Body=b"")
    c.put_object(Bucket=bucket, Key="m/sub/config.json", Body=b"{}")
    fetch_to(f"s3://{bucket}/m", tmp_path / "dst")
    assert sorted(tree(tmp_path / "dst")) == [MANIFEST_NAME, "sub/config.json"]


def fetch_to(source: str, dest: Path, **kw):
    from strata_loader.fetch.run import fetch

    return fetch(FetchRequest(source=source, dest=str(dest), **kw), progress_mode="none")


# --- directory sources: names and symlinks -------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("not part of the model")
    return d


def test_directory_symlink_out_of_a_local_source_is_refused(tmp_path, outside):
    make_model(tmp_path / "src")
    (tmp_path / "src" / "extra").symlink_to(outside)
    with pytest.raises(SourceError, match=r"extra: a symlink to .*outside the source"):
        fetch_to(str(tmp_path / "src"), tmp_path / "dst")
    assert not (tmp_path / "dst" / "extra").exists()


def test_file_symlink_out_of_a_local_source_is_refused(tmp_path, outside):
    make_model(tmp_path / "src")
    (tmp_path / "src" / "secret.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(SourceError, match="outside the source"):
        fetch_to(str(tmp_path / "src"), tmp_path / "dst")
    assert not (tmp_path / "dst" / "secret.txt").exists()


def test_relative_symlink_climbing_out_is_refused_even_when_excluded(tmp_path, outside):
    make_model(tmp_path / "src")
    (tmp_path / "src" / "original" / "up").symlink_to("../../outside")
    with pytest.raises(SourceError, match="outside the source"):
        fetch_to(str(tmp_path / "src"), tmp_path / "dst", exclude=["original/*"])


def test_symlinks_within_the_source_are_followed_as_plain_files(tmp_path):
    files = make_model(tmp_path / "src")
    (tmp_path / "src" / "alias.json").symlink_to("config.json")
    (tmp_path / "src" / "mirror").symlink_to("original")
    fetch_to(str(tmp_path / "src"), tmp_path / "dst")
    got = tree(tmp_path / "dst")
    got.pop(MANIFEST_NAME)
    assert got == {
        **files,
        "alias.json": files["config.json"],
        "mirror/consolidated.pth": files["original/consolidated.pth"],
    }
    assert not any(p.is_symlink() for p in (tmp_path / "dst").rglob("*"))


def test_symlink_loop_is_refused(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "back").symlink_to("..")
    with pytest.raises(SourceError, match="loop"):
        list_source(FetchRequest(source=str(src), dest=str(tmp_path / "dst")))


def test_dangling_symlink_is_a_clear_error(tmp_path):
    make_model(tmp_path / "src")
    (tmp_path / "src" / "gone.json").symlink_to("missing.json")
    with pytest.raises(SourceError, match="dangling symlink"):
        fetch_to(str(tmp_path / "src"), tmp_path / "dst")


def test_local_name_with_a_backslash_is_refused(tmp_path):
    make_model(tmp_path / "src")
    (tmp_path / "src" / "a\\b.json").write_text("{}")
    with pytest.raises(SourceError, match="backslash"):
        fetch_to(str(tmp_path / "src"), tmp_path / "dst")


def test_pvc_symlink_into_another_claim_is_refused(tmp_path, monkeypatch):
    mounts = tmp_path / "mounts"
    make_model(mounts / "weights" / "llama")
    (mounts / "other" / "private").mkdir(parents=True)
    (mounts / "other" / "private" / "key.pem").write_text("secret")
    (mounts / "weights" / "llama" / "keys").symlink_to(mounts / "other" / "private")
    monkeypatch.setenv("STRATA_PVC_MOUNT_ROOT", str(mounts))
    with pytest.raises(SourceError, match="outside the source"):
        fetch_to("pvc://weights/llama", tmp_path / "dst")
    assert not (tmp_path / "dst" / "keys").exists()


def test_pvc_path_that_is_a_symlink_out_of_its_claim_is_refused(tmp_path, monkeypatch):
    mounts = tmp_path / "mounts"
    make_model(mounts / "other" / "llama")
    (mounts / "weights").mkdir()
    (mounts / "weights" / "llama").symlink_to(mounts / "other" / "llama")
    monkeypatch.setenv("STRATA_PVC_MOUNT_ROOT", str(mounts))
    with pytest.raises(SourceError, match="outside the claim's mount"):
        fetch_to("pvc://weights/llama", tmp_path / "dst")


def test_hf_revision_cannot_climb_out_of_the_repository(tmp_path, monkeypatch, outside):
    from .test_fetch_local import make_hf_cache

    make_hf_cache(tmp_path / "hub", "acme/tiny", {"config.json": b"{}"})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local cache, never the Hub
    (outside / "ref").write_text("../../../outside")  # what a ref read from outside the repository could say
    with pytest.raises(SourceError, match=r"revision '.*' has a '\.\.' segment"):
        list_source(FetchRequest(source="hf://acme/tiny", dest=str(tmp_path / "d"), revision="../../../outside/ref"))


def test_hf_ref_that_is_not_a_commit_is_refused(tmp_path, monkeypatch, outside):
    from .test_fetch_local import make_hf_cache

    make_hf_cache(tmp_path / "hub", "acme/tiny", {"config.json": b"{}"})
    ref = tmp_path / "hub" / "models--acme--tiny" / "refs" / "main"
    ref.write_text(os.path.relpath(outside, ref.parent.parent / "snapshots"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the local cache, never the Hub
    with pytest.raises(SourceError, match="not a commit hash"):
        list_source(FetchRequest(source="hf://acme/tiny", dest=str(tmp_path / "d")))


# --- the writer: links planted inside DEST -------------------------------------------------------------------


def untouched(outside: Path) -> bool:
    return (
        sorted(p.name for p in outside.rglob("*")) == ["secret.txt"]
        and (outside / "secret.txt").read_text() == "not part of the model"
    )


def test_directory_link_planted_in_dest_is_refused_not_written_through(tmp_path, outside):
    make_model(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "original").symlink_to(outside)
    with pytest.raises(UnsafePathError, match=r"dst/original is a symlink"):
        fetch_to(str(tmp_path / "src"), tmp_path / "dst")
    assert untouched(outside) and not (tmp_path / "dst" / MANIFEST_NAME).exists()


@pytest.mark.parametrize("name", ["config.json.strata-partial", "config.json.strata-partial.progress.tmp"])
def test_file_link_planted_under_a_name_the_writer_opens_is_refused(tmp_path, outside, name):
    make_model(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / name).symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafePathError, match="is a symlink"):
        fetch_to(str(tmp_path / "src"), tmp_path / "dst")
    assert untouched(outside)


@pytest.mark.parametrize("name", ["config.json", "config.json.strata-partial.progress"])
def test_link_planted_at_a_name_the_writer_renames_onto_is_replaced(tmp_path, outside, name):
    files = make_model(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / name).symlink_to(outside / "secret.txt")
    fetch_to(str(tmp_path / "src"), tmp_path / "dst")
    assert untouched(outside)
    assert not any(p.is_symlink() for p in (tmp_path / "dst").iterdir())
    assert (tmp_path / "dst" / "config.json").read_bytes() == files["config.json"]


def test_shard_output_link_planted_in_dest_is_refused(tmp_path, outside):
    make_model(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "sharded").symlink_to(outside)
    req = FetchRequest.parse_args(["fetch", str(tmp_path / "src"), str(tmp_path / "dst"), "--shard-tp", "2"])
    from strata_loader.fetch.run import fetch

    with pytest.raises(UnsafePathError, match="sharded is a symlink"):
        fetch(req, progress_mode="none")
    assert untouched(outside)


def test_writer_refuses_an_unsafe_path_even_if_a_source_lists_one(tmp_path, monkeypatch):
    """Defence in depth: were a source to let `../x` through, the writer still would not write it."""
    from strata_loader.core.sources import LocalReader
    from strata_loader.fetch import run as fetch_module
    from strata_loader.fetch.catalog import SourceFile

    (tmp_path / "src").mkdir()
    data = tmp_path / "src" / "data"
    data.write_bytes(b"x" * 10)
    rogue = SourceFile("../escaped", 10, lambda: LocalReader(data), {}, "v1")
    monkeypatch.setattr(fetch_module, "list_source", lambda req: ([rogue], None))
    with pytest.raises(UnsafePathError, match=r"'\.\.' segment"):
        fetch_to(str(tmp_path / "src"), tmp_path / "dst")
    assert not (tmp_path / "escaped").exists()
