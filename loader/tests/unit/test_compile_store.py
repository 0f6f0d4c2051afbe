"""The compile cache store on real files: a capture restores byte for byte at another path; links, odd entries,
hostile manifests, damaged files and a full store are refused with the reason and lose nothing; generations
replace each other whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from strata_loader.compilecache import INDUCTOR_ROOT, VLLM_ROOT, CacheMiss, CaptureError, CompileStore, StoreFullError
from strata_loader.compilecache.store import CURRENT, MANIFEST
from strata_testsupport.compilecache import AVX2_TARGET, real_key, tree_bytes, write_engine_cache

KEY = real_key()


def engine_dirs(root: Path) -> dict[str, Path]:
    return {VLLM_ROOT: root / "vllm-cache" / "torch_compile_cache"}


def captured(tmp_path: Path, store: CompileStore | None = None) -> tuple[CompileStore, dict[str, bytes]]:
    files = write_engine_cache(tmp_path / "engine" / "vllm-cache")
    store = store or CompileStore(tmp_path / "store")
    result = store.capture(KEY, engine_dirs(tmp_path / "engine"))
    assert not result.unchanged and result.files == len(files) and result.bytes == sum(map(len, files.values()))
    return store, files


def generation_dir(store: CompileStore) -> Path:
    return store.root / KEY.digest / (store.root / KEY.digest / CURRENT).read_text().strip()


def test_a_capture_restores_byte_for_byte_at_another_path(tmp_path: Path) -> None:
    store, files = captured(tmp_path)
    restored = store.restore(KEY, engine_dirs(tmp_path / "other-node"))
    assert restored.files == len(files)
    got = tree_bytes(tmp_path / "other-node" / "vllm-cache")
    assert got == files


def test_the_manifest_records_each_files_sha256(tmp_path: Path) -> None:
    import hashlib

    store, files = captured(tmp_path)
    manifest = json.loads((generation_dir(store) / MANIFEST).read_text())
    assert manifest["key"] == dict(KEY.parts)
    recorded = {f["path"]: f["sha256"] for f in manifest["files"]}
    assert recorded == {
        f"vllm/{rel.removeprefix('torch_compile_cache/')}": hashlib.sha256(data).hexdigest()
        for rel, data in files.items()
    }


def test_scratch_files_are_not_captured(tmp_path: Path) -> None:
    engine = tmp_path / "engine" / "vllm-cache" / "torch_compile_cache"
    write_engine_cache(engine.parent)
    (engine / ".1234.5678.tmp").write_bytes(b"half")
    (engine / "x.lock").write_bytes(b"")
    store = CompileStore(tmp_path / "store")
    store.capture(KEY, engine_dirs(tmp_path / "engine"))
    paths = {f.path for f in store.current(KEY.digest).manifest.files}
    assert not any(p.endswith((".tmp", ".lock")) for p in paths)


def test_a_separate_inductor_directory_is_a_root_of_its_own(tmp_path: Path) -> None:
    write_engine_cache(tmp_path / "engine" / "vllm-cache")
    inductor = tmp_path / "engine" / "inductor"
    (inductor / "fxgraph" / "zz").mkdir(parents=True)
    (inductor / "fxgraph" / "zz" / "entry").write_bytes(b"\x00graph")
    sources = {**engine_dirs(tmp_path / "engine"), INDUCTOR_ROOT: inductor}
    store = CompileStore(tmp_path / "store")
    store.capture(KEY, sources)
    with pytest.raises(CacheMiss, match=r"files for \['inductor'\] and this engine gave no directory"):
        store.restore(KEY, engine_dirs(tmp_path / "node2"))
    assert not (tmp_path / "node2" / "vllm-cache" / "torch_compile_cache" / "3f1c0a9b2e").exists()
    store.restore(KEY, {**engine_dirs(tmp_path / "node2"), INDUCTOR_ROOT: tmp_path / "node2" / "ind"})
    assert (tmp_path / "node2" / "ind" / "fxgraph" / "zz" / "entry").read_bytes() == b"\x00graph"


def test_a_miss_names_the_part_that_differs(tmp_path: Path) -> None:
    store, _ = captured(tmp_path)
    avx2_host = real_key(target=AVX2_TARGET)
    with pytest.raises(CacheMiss) as miss:
        store.restore(avx2_host, engine_dirs(tmp_path / "avx2-node"))
    assert f"no cache for this engine's key {avx2_host.digest[:12]}" in miss.value.reason
    assert "target differs (this engine: 'x86_64:avx,avx2,f16c,fma,sse4_2 aten:AVX2'" in miss.value.reason
    assert "config differs" not in miss.value.reason
    assert not (tmp_path / "avx2-node").exists() or tree_bytes(tmp_path / "avx2-node") == {}


def test_an_empty_store_says_so(tmp_path: Path) -> None:
    with pytest.raises(CacheMiss, match="holds no compile cache yet"):
        CompileStore(tmp_path / "store").restore(KEY, engine_dirs(tmp_path / "node"))


def test_nothing_to_capture_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "engine" / "vllm-cache" / "torch_compile_cache").mkdir(parents=True)
    with pytest.raises(CaptureError, match="nothing to capture"):
        CompileStore(tmp_path / "store").capture(KEY, engine_dirs(tmp_path / "engine"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "remove"])
def test_a_damaged_file_is_a_miss_and_nothing_is_restored(tmp_path: Path, damage: str) -> None:
    store, _ = captured(tmp_path)
    victim = generation_dir(store) / "files" / "vllm" / "3f1c0a9b2e" / "rank_0_0" / "inductor_cache" / "xq" / "cxq0.so"
    data = victim.read_bytes()
    if damage == "flip":
        victim.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "truncate":
        victim.write_bytes(data[:-1])
    elif damage == "extend":
        victim.write_bytes(data + b"\x00")
    else:
        victim.unlink()
    target = tmp_path / "node"
    with pytest.raises(CacheMiss) as miss:
        store.restore(KEY, engine_dirs(target))
    assert "cxq0.so" in miss.value.reason or damage == "remove"
    if damage != "remove":
        assert "the cache is damaged and was not used" in miss.value.reason
    assert tree_bytes(target) == {}, "a partial or unverified cache was left for the engine"


def test_a_truncated_manifest_is_a_miss(tmp_path: Path) -> None:
    store, _ = captured(tmp_path)
    manifest = generation_dir(store) / MANIFEST
    manifest.write_bytes(manifest.read_bytes()[:-40])
    with pytest.raises(CacheMiss, match="is not a valid compile cache manifest"):
        store.restore(KEY, engine_dirs(tmp_path / "node"))
    assert tree_bytes(tmp_path / "node") == {}


@pytest.mark.parametrize(
    "hostile",
    ["vllm/../../../escaped", "/etc/passwd", "vllm//x", "elsewhere/x", "vllm/./x", "vllm"],
)
def test_a_manifest_with_a_hostile_path_is_refused_and_nothing_escapes(tmp_path: Path, hostile: str) -> None:
    store, _ = captured(tmp_path)
    gen = generation_dir(store)
    manifest = json.loads((gen / MANIFEST).read_text())
    manifest["files"][0]["path"] = hostile
    (gen / MANIFEST).write_text(json.dumps(manifest))
    target = tmp_path / "deep" / "node"
    with pytest.raises(CacheMiss, match="not a valid compile cache manifest"):
        store.restore(KEY, engine_dirs(target))
    assert not (tmp_path / "deep" / "escaped").exists() and not (tmp_path / "escaped").exists()
    assert tree_bytes(tmp_path / "deep") == {}


def test_a_manifest_recording_another_key_is_a_miss(tmp_path: Path) -> None:
    store, _ = captured(tmp_path)
    gen = generation_dir(store)
    manifest = json.loads((gen / MANIFEST).read_text())
    manifest["key"]["target"] = AVX2_TARGET  # an AVX2 cache filed under the AVX-512 key
    (gen / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CacheMiss, match="records another key"):
        store.restore(KEY, engine_dirs(tmp_path / "node"))


def test_current_naming_a_path_outside_the_store_is_a_miss(tmp_path: Path) -> None:
    store, _ = captured(tmp_path)
    (store.root / KEY.digest / CURRENT).write_text("../../../etc\n")
    with pytest.raises(CacheMiss, match="not a generation"):
        store.restore(KEY, engine_dirs(tmp_path / "node"))


def test_a_link_planted_in_the_store_is_never_followed(tmp_path: Path) -> None:
    store, _ = captured(tmp_path)
    secret = tmp_path / "secret"
    victim = generation_dir(store) / "files" / "vllm" / "3f1c0a9b2e" / "rank_0_0" / "backbone" / "computation_graph.py"
    secret.write_bytes(victim.read_bytes())  # even the right bytes are not read through a link
    victim.unlink()
    victim.symlink_to(secret)
    with pytest.raises(CacheMiss, match="symlink"):
        store.restore(KEY, engine_dirs(tmp_path / "node"))
    assert tree_bytes(tmp_path / "node") == {}


def test_a_link_in_the_engines_directory_is_not_written_through(tmp_path: Path) -> None:
    store, _ = captured(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = tmp_path / "node" / "vllm-cache" / "torch_compile_cache"
    cache.mkdir(parents=True)
    (cache / "3f1c0a9b2e").symlink_to(outside)
    with pytest.raises(CacheMiss, match="symlink"):
        store.restore(KEY, engine_dirs(tmp_path / "node"))
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("kind", ["file-link", "dir-link", "fifo"])
def test_a_capture_with_a_link_or_odd_entry_is_refused_whole(tmp_path: Path, kind: str) -> None:
    write_engine_cache(tmp_path / "engine" / "vllm-cache")
    rank = tmp_path / "engine" / "vllm-cache" / "torch_compile_cache" / "3f1c0a9b2e" / "rank_0_0"
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0\n")
    if kind == "file-link":
        (rank / "inductor_cache" / "stolen").symlink_to(passwd)
    elif kind == "dir-link":
        (rank / "elsewhere").symlink_to(tmp_path)
    else:
        os.mkfifo(rank / "pipe")
    store = CompileStore(tmp_path / "store")
    with pytest.raises(CaptureError, match=r"symlink|not a regular file") as refused:
        store.capture(KEY, engine_dirs(tmp_path / "engine"))
    assert str(rank) in str(refused.value) and "not captured" in str(refused.value)
    assert store.caches() == [] and store.used_bytes() == 0
    assert passwd.read_text() == "root:x:0:0\n"


def test_a_full_store_refuses_the_capture_and_keeps_what_it_has(tmp_path: Path) -> None:
    store, files = captured(tmp_path)
    used = store.used_bytes()
    assert used == sum(map(len, files.values()))
    limited = CompileStore(store.root, max_bytes=used + 1000)
    write_engine_cache(tmp_path / "engine2" / "vllm-cache", seed=1)
    other = real_key(config="53727cb1dc")
    with pytest.raises(StoreFullError) as full:
        limited.capture(other, engine_dirs(tmp_path / "engine2"))
    assert f"over its limit of {used + 1000} ({used} in use)" in str(full.value)
    assert [s.digest for s in limited.caches()] == [KEY.digest]
    assert not [p for p in (store.root / other.digest).glob("*")], "a refused capture left files behind"
    limited.restore(KEY, engine_dirs(tmp_path / "node"))
    assert tree_bytes(tmp_path / "node" / "vllm-cache") == files


def test_a_new_capture_replaces_the_old_generation_whole(tmp_path: Path) -> None:
    store, _ = captured(tmp_path)
    first = store.current(KEY.digest).generation
    again = store.capture(KEY, engine_dirs(tmp_path / "engine"))
    assert again.unchanged and again.generation == first
    second_files = write_engine_cache(tmp_path / "engine" / "vllm-cache", seed=7)
    second = store.capture(KEY, engine_dirs(tmp_path / "engine"))
    assert not second.unchanged and second.generation != first
    assert store.current(KEY.digest).generation == second.generation
    assert (store.root / KEY.digest / first).is_dir(), "a reader may still be copying the replaced generation"
    assert store.used_bytes() > second.bytes
    assert store.prune(grace_s=0) == [store.root / KEY.digest / first]
    assert store.used_bytes() == second.bytes
    store.restore(KEY, engine_dirs(tmp_path / "node"))
    got = tree_bytes(tmp_path / "node" / "vllm-cache")
    assert {k: got[k] for k in second_files} == second_files


def test_a_crashed_capture_is_invisible_and_pruned(tmp_path: Path) -> None:
    """A capture killed before its rename leaves a temp generation; one killed after the rename but before
    CURRENT leaves a generation nobody names. Readers see neither; prune removes both."""
    store, files = captured(tmp_path)
    key_dir = store.root / KEY.digest
    current = generation_dir(store)
    (key_dir / ".tmp-gen-1-deadbeef" / "files" / "vllm").mkdir(parents=True)
    (key_dir / ".tmp-gen-1-deadbeef" / "files" / "vllm" / "half").write_bytes(b"\x00" * 10)
    orphan = key_dir / "gen-2-deadbeef"
    orphan.mkdir()
    (orphan / MANIFEST).write_bytes((current / MANIFEST).read_bytes())
    store.restore(KEY, engine_dirs(tmp_path / "node"))
    assert tree_bytes(tmp_path / "node" / "vllm-cache") == files
    assert store.prune(grace_s=3600) == []
    assert sorted(p.name for p in store.prune(grace_s=0)) == [".tmp-gen-1-deadbeef", "gen-2-deadbeef"]
    assert [p.name for p in key_dir.iterdir() if p.name != CURRENT] == [current.name]


def test_a_root_whose_directory_does_not_exist_is_left_out(tmp_path: Path) -> None:
    """An engine whose vLLM compiled nothing yet, with inductor's own directory full: only that is captured."""
    inductor = tmp_path / "engine" / "inductor"
    (inductor / "fxgraph" / "ab").mkdir(parents=True)
    (inductor / "fxgraph" / "ab" / "entry").write_bytes(b"\x01\x02")
    store = CompileStore(tmp_path / "store")
    store.capture(KEY, {**engine_dirs(tmp_path / "engine"), INDUCTOR_ROOT: inductor})
    assert [f.path for f in store.current(KEY.digest).manifest.files] == ["inductor/fxgraph/ab/entry"]
    store.restore(KEY, {**engine_dirs(tmp_path / "node"), INDUCTOR_ROOT: tmp_path / "node" / "ind"})
    assert tree_bytes(tmp_path / "node") == {"ind/fxgraph/ab/entry": b"\x01\x02"}
