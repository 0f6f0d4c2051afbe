"""The filesystem tier on a real directory: layout, atomic files, checksums, watermarks, index rebuild."""

import hashlib
import os
import socket
import subprocess
from pathlib import Path

import pytest
from strata_kv.config import L2FsConfig, NamespaceConfig
from strata_kv.store.blockfile import TRAILER_SIZE, locate
from strata_kv.store.fstier import FsTier

NS = NamespaceConfig(model="meta-llama/Llama-3.1-8B", layout={"block_size": 16, "dtype": "bfloat16"})


def make(root: Path, **kw) -> FsTier:
    """A tier with its own capacity unless a test sets one: `capacity: 0` would count the host disk's usage
    (tests of that mode pass 0 on a tmpfs of their own)."""
    kw.setdefault("capacity", 1 << 30)
    t = FsTier(L2FsConfig(root_dir=str(root), **kw), NS)
    t.prepare()
    return t


def test_layout_follows_vllm_file_mapper(tmp_path: Path) -> None:
    t = make(tmp_path)
    block_hash = hashlib.sha256(b"tokens").digest()
    key = block_hash + (1).to_bytes(4, "big")  # vLLM offload key: hash bytes + big-endian KV group
    h = block_hash.hex()
    expected = tmp_path / f"meta-llama_Llama-3.1-8B_{NS.digest}_r0" / h[:3] / f"{h[3:5]}_g1" / f"{h}.bin"
    assert t.path(key) == expected
    assert (tmp_path / f"meta-llama_Llama-3.1-8B_{NS.digest}" / "config.json").is_file()


def test_lmcache_keys_follow_the_0_5_6_format_and_every_suffix_gets_its_own_file() -> None:
    # LMCache 0.5.6: model@world_size@worker_id@chunk_hash@dtype[@suffix]; its redis connector appends
    # `kv_bytes` / `metadata` to the key.
    a = locate(b"llama@4@3@deadbeef01@bfloat16@tenantA")
    b = locate(b"llama@4@3@deadbeef01@bfloat16@tenantB")
    assert (a.rank, a.group) == (3, 0)
    assert a.hash_hex.startswith("deadbeef01") and a.hash_hex != b.hash_hex
    kv = locate(b"llama@4@3@deadbeef01@bfloat16kv_bytes")
    meta = locate(b"llama@4@3@deadbeef01@bfloat16metadata")
    assert kv.rank == meta.rank == 3 and kv.hash_hex != meta.hash_hex


# Pairs of keys that differ as bytes but that an earlier parser normalised to one block file.
ALIASES = [
    pytest.param(b"llama@2@1@DEADBEEF01@bfloat16", b"llama@2@1@deadbeef01@bfloat16", id="hash-case"),
    pytest.param(b"llama@2@1@1@bfloat16", b"llama@2@1@00001@bfloat16", id="hash-leading-zeros"),
    pytest.param(b"llama@2@1@abcdef@bfloat16", b"llama@0002@0001@abcdef@bfloat16", id="rank-group-padding"),
    pytest.param(b"llama@1@2@abcdef@salt", b"llama@0001@00002@abcdef@salt", id="old-rank-group-padding"),
    pytest.param(hashlib.sha256(b"tokens").digest() + bytes(4), b"tokens", id="binary-key-vs-the-plain-key-it-encodes"),
    pytest.param(
        hashlib.sha256(b"tokens").digest() + bytes(4),
        hashlib.sha256(b"tokens").hexdigest().encode(),
        id="binary-key-vs-its-hex",
    ),
]


@pytest.mark.parametrize(("a", "b"), ALIASES)
def test_keys_that_differ_as_bytes_never_share_a_block_file(tmp_path: Path, a: bytes, b: bytes) -> None:
    t = make(tmp_path)
    assert t.relpath(a) != t.relpath(b)
    t.put(a, b"value-a")
    t.put(b, b"value-b")  # must not replace a's file
    assert t.contains(a) and t.get(a) == b"value-a"
    assert t.delete(b)
    assert t.get(b) is None and not t.contains(b)
    assert t.get(a) == b"value-a"  # DEL b left a alone
    assert t.delete(a) and not t.contains(a)


def test_round_trip_and_value_sits_at_the_end_of_the_file(tmp_path: Path) -> None:
    t = make(tmp_path)
    value = os.urandom(70_000)
    t.put(b"k1", value)
    assert t.get(b"k1") == value
    raw = t.path(b"k1").read_bytes()
    assert raw[: len(value)] == value  # vLLM reads a block from offset 0: it sees the value unchanged
    assert not list(tmp_path.rglob("*.tmp"))


def test_corrupt_file_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    t = make(tmp_path)
    t.put(b"k", b"a" * 1000)
    path = t.path(b"k")
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    assert t.get(b"k") is None
    assert not path.exists()
    assert t.corrupt_removed == 1


@pytest.mark.parametrize("damage", ["torn-middle", "flipped-length", "empty", "short", "flipped-crc"])
def test_damaged_files_are_never_served(tmp_path: Path, damage: str) -> None:
    t = make(tmp_path)
    t.put(b"k", b"v" * 5000)
    path = t.path(b"k")
    data = bytearray(path.read_bytes())
    if damage == "torn-middle":
        data[2000:2600] = bytes(600)  # a block of zeros where a torn write left no data
        path.write_bytes(bytes(data))
    elif damage in ("flipped-length", "flipped-crc"):
        field = 12 if damage == "flipped-length" else 20  # value length / crc32 in the trailer
        data[len(data) - TRAILER_SIZE + field] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "short":
        path.write_bytes(b"STKV\x02")
    else:
        path.write_bytes(b"")
    assert t.get(b"k") is None
    assert not path.exists()


def test_file_cut_short_is_never_served(tmp_path: Path) -> None:
    t = make(tmp_path)
    t.put(b"k", b"v" * 5000)
    path = t.path(b"k")
    path.write_bytes(path.read_bytes()[:-7])  # trailer gone: indistinguishable from a vLLM block
    assert t.get(b"k") is None


def test_capacity_watermarks_evict_least_recently_used(tmp_path: Path) -> None:
    t = make(tmp_path, capacity=100_000, high_watermark=0.9, low_watermark=0.5)
    for i in range(30):
        t.put(b"k%d" % i, b"x" * 5_000)
        assert t.used <= 100_000 * 0.9
    assert t.evictions > 0
    assert t.get(b"k29") == b"x" * 5_000
    assert t.get(b"k0") is None


def test_index_is_rebuilt_and_only_orphaned_temp_files_are_cleaned(tmp_path: Path) -> None:
    t = make(tmp_path)
    for i in range(10):
        t.put(b"k%d" % i, b"y" * 1000)
    host = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs: its temp file is a leftover of a killed writer
    leftover = t.path(b"k0").parent / f".k0.bin.{host}-{dead.pid}-abcd1234.tmp"
    leftover.write_bytes(b"half written")
    in_flight = t.path(b"k1").parent / f".k1.bin.{host}-1-abcd1234.tmp"  # pid 1 is alive: still writing
    in_flight.write_bytes(b"being written")
    other_node = t.path(b"k2").parent / f".k2.bin.other-node-{dead.pid}-abcd1234.tmp"
    other_node.write_bytes(b"another node's write")
    again = make(tmp_path)
    assert again.stats()["files"] == 10
    assert again.used == t.used
    assert not leftover.exists()
    assert in_flight.exists() and other_node.exists()


def test_two_tiers_on_one_directory_see_each_others_blocks(tmp_path: Path) -> None:
    a, b = make(tmp_path), make(tmp_path)
    a.put(b"shared", b"z" * 3000)
    assert b.get(b"shared") == b"z" * 3000
    assert b.contains(b"shared")


def test_block_of_another_key_at_the_same_path_is_a_miss_not_a_deletion(tmp_path: Path) -> None:
    t = make(tmp_path)
    t.put(b"k", b"1" * 10)
    other = t.path(b"other")
    other.parent.mkdir(parents=True, exist_ok=True)
    os.link(t.path(b"k"), other)
    assert t.get(b"other") is None
    assert other.exists()


def test_block_written_by_vllm_is_served_to_its_key_and_never_removed(tmp_path: Path) -> None:
    t = make(tmp_path)
    key = hashlib.sha256(b"vllm block").digest() + (0).to_bytes(4, "big")
    path = t.path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    block = os.urandom(4096)
    path.write_bytes(block)  # vLLM writes raw KV bytes, no header
    assert t.get(key) == block  # a key in vLLM's form: the file is vLLM's block for that hash, whole
    assert path.exists() and t.foreign_served == 1
    assert t.contains(key)  # it still counts for capacity and prefix lookups


def test_a_raw_file_is_never_served_to_a_key_not_in_vllms_form(tmp_path: Path) -> None:
    t = make(tmp_path)
    for key in (b"plain-key", b"llama@2@1@deadbeef01@bfloat16"):
        path = t.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(4096))  # no trailer, no checksum: nothing says it is this key's value
        assert t.get(key) is None
        assert path.exists()
    assert t.foreign_skipped == 2 and t.foreign_served == 0


def test_a_vllm_block_larger_than_the_largest_value_is_a_miss(tmp_path: Path) -> None:
    t = FsTier(L2FsConfig(root_dir=str(tmp_path)), NS, max_value_size=4096)
    t.prepare()
    key = hashlib.sha256(b"big").digest() + bytes(4)
    t.path(key).parent.mkdir(parents=True, exist_ok=True)
    t.path(key).write_bytes(os.urandom(4097))
    assert t.get(key) is None and t.path(key).exists()


def test_block_of_a_longer_key_at_the_same_path_is_kept(tmp_path: Path) -> None:
    t = make(tmp_path)
    t.put(b"a-much-longer-key-than-k", b"1" * 10)
    short = t.path(b"k")
    short.parent.mkdir(parents=True, exist_ok=True)
    os.link(t.path(b"a-much-longer-key-than-k"), short)
    assert t.get(b"k") is None
    assert short.exists() and t.corrupt_removed == 0


def test_directory_matches_what_vllm_computes_for_the_same_run(tmp_path: Path) -> None:
    import json

    fields = {  # vLLM FileMapper fields for one run
        "model_name": "meta-llama/Llama-3.1-8B",
        "hash_block_size": 16,
        "gpu_blocks_per_file": 1,
        "tp_size": 1,
        "pp_size": 1,
        "pcp_size": 1,
        "dcp_size": 1,
        "dtype": "bfloat16",
        "kv_cache_groups": [{"block_size": 16, "layer_names": ["model.layers.0.self_attn.attn"]}],
        "inference_engine": "vllm",
    }
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    expected = "meta-llama_Llama-3.1-8B_" + hashlib.sha256(canonical.encode()).hexdigest()[:12]
    ns = NamespaceConfig(model="meta-llama/Llama-3.1-8B", layout=fields, hash_seed="123")
    assert ns.directory_name == expected
    t = FsTier(L2FsConfig(root_dir=str(tmp_path)), ns)
    t.prepare()
    assert json.loads((tmp_path / expected / "config.json").read_text()) == fields
    assert (tmp_path / f"{expected}_r0").is_dir()


def test_a_block_exists_reported_is_kept_by_the_watermark_for_the_grace_period(tmp_path: Path) -> None:
    t = make(tmp_path, capacity=100_000, high_watermark=0.9, low_watermark=0.5)
    t.put(b"asked", b"a" * 5_000)
    assert t.contains(b"asked", pin_seconds=60)
    for i in range(40):
        t.put(b"k%d" % i, b"x" * 5_000)
    assert t.get(b"asked") == b"a" * 5_000
    assert t.evictions > 0


def test_vllm_style_load_reads_a_block_the_server_wrote(tmp_path: Path) -> None:
    """vLLM's load_block: open the mapped path and readv block_size bytes from offset 0."""
    t = make(tmp_path)
    block_hash = hashlib.sha256(b"prefix tokens").digest()
    key = block_hash + (0).to_bytes(4, "big")
    block = os.urandom(64 * 1024)
    t.put(key, block)
    h = block_hash.hex()
    path = tmp_path / f"{NS.directory_name}_r0" / h[:3] / f"{h[3:5]}_g0" / f"{h}.bin"
    buf = bytearray(len(block))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.readv(fd, [buf]) == len(block)
    finally:
        os.close(fd)
    assert bytes(buf) == block


def test_rescan_counts_blocks_other_nodes_wrote_and_enforces_capacity(tmp_path: Path) -> None:
    ours = make(tmp_path, capacity=60_000, high_watermark=0.9, low_watermark=0.5)
    other_node = make(tmp_path)  # unbounded writer sharing the directory
    for i in range(12):
        other_node.put(b"n%d" % i, b"z" * 5_000)
    assert ours.used == 0
    ours.rebuild_index()
    assert ours.used > 60_000 * 0.9  # above the high watermark once counted
    ours.make_room(0)
    assert ours.used <= 60_000 * 0.5
    assert ours.stats()["files"] < 12


def _dirs_below_ranks(root: Path) -> list[Path]:
    """Directories under the rank directories (`<ns>_r<rank>/...`)."""
    return [p for top in root.iterdir() if top.is_dir() and "_r" in top.name for p in top.rglob("*") if p.is_dir()]


def test_sets_and_dels_leave_no_empty_directories(tmp_path: Path) -> None:
    t = make(tmp_path)
    keys = [b"llama@2@%d@%x@bfloat16" % (i % 2, i * 7919) for i in range(300)] + [b"plain%d" % i for i in range(300)]
    keys += [hashlib.sha256(b"%d" % i).digest() + (i % 3).to_bytes(4, "big") for i in range(300)]
    for k in keys:
        t.put(k, b"v")
    assert len(_dirs_below_ranks(tmp_path)) > 100
    for k in keys:
        assert t.delete(k)
    assert _dirs_below_ranks(tmp_path) == []
    t.put(keys[0], b"again")  # a removed directory is made again
    assert t.get(keys[0]) == b"again"


def test_eviction_removes_the_directories_it_empties(tmp_path: Path) -> None:
    t = make(tmp_path, capacity=200_000, high_watermark=0.9, low_watermark=0.5)
    for i in range(400):
        t.put(b"e%d" % i, b"x" * 5_000)
    files = list(tmp_path.rglob("*.bin"))
    dirs = _dirs_below_ranks(tmp_path)
    assert len(files) < 40 and len(dirs) <= 2 * len(files)
    assert all(any(d.iterdir()) for d in dirs)


def test_a_hostile_key_spray_creates_a_bounded_set_of_directories(tmp_path: Path) -> None:
    t = make(tmp_path, max_ranks=4, max_kv_groups=2)
    for i in range(1000):  # every key names another rank / group
        t.put(b"m@%d@%d@abcdef@bf16" % (i + 1, i), b"v")
        t.put(b"m@%d@%d@abcdef@bf16@%d" % (i % 4 + 1, i % 4, i), b"v")
        t.put(hashlib.sha256(b"%d" % (i % 7)).digest() + i.to_bytes(4, "big"), b"v")
    rank_dirs = [p for p in tmp_path.iterdir() if p.is_dir() and "_r" in p.name]
    assert len(rank_dirs) <= 4
    groups = {p.name.split("_g")[1] for p in _dirs_below_ranks(tmp_path) if "_g" in p.name}
    assert groups <= {"0", "1"}


# -- one directory with vLLM's own `fs` tier -------------------------------------------------------------------
VLLM_DIR = "Qwen_Qwen3-0.6B_0123456789ab"


def vllm_key(name: bytes, group: int = 0, namespace: str = VLLM_DIR, rank: int = 0) -> bytes:
    """What StrataTier sends: `<model>_<digest12>_r<rank>/` + vLLM's offload key."""
    return f"{namespace}_r{rank}/".encode() + hashlib.sha256(name).digest() + group.to_bytes(4, "big")


def test_a_vllm_tier_key_maps_to_vllms_own_path_in_its_namespace(tmp_path: Path) -> None:
    t = make(tmp_path)
    h = hashlib.sha256(b"blk").hexdigest()
    assert t.path(vllm_key(b"blk", 2, rank=3)) == tmp_path / f"{VLLM_DIR}_r3" / h[:3] / f"{h[3:5]}_g2" / f"{h}.bin"
    local = "_models_llama-3.1+fp8_v2_0123456789ab"  # `--model /models/llama-3.1+fp8.v2`, "/" as "_"
    assert t.relpath(vllm_key(b"blk", namespace=local)).startswith(f"{local}_r0/")


def test_vllm_tier_keys_that_differ_in_any_part_never_share_a_file(tmp_path: Path) -> None:
    t = make(tmp_path)
    keys = [
        vllm_key(b"a"),
        vllm_key(b"b"),
        vllm_key(b"a", group=1),
        vllm_key(b"a", rank=1),
        vllm_key(b"a", namespace="Qwen_Qwen3-0.6B_0123456789ac"),
        vllm_key(b"a", namespace="Qwen_Qwen3-0.6B_r1_0123456789ab"),  # `_r` inside the model part
        f"{VLLM_DIR}_r0/".encode() + hashlib.sha256(b"a").digest()[:16] + bytes(4),  # a 16-byte hash
        hashlib.sha256(b"a").digest() + bytes(4),  # the bare offload key: the server's own namespace
    ]
    assert len({t.relpath(k) for k in keys}) == len(keys)
    for i, k in enumerate(keys):
        t.put(k, b"%d" % i)
    assert [t.get(k) for k in keys] == [b"%d" % i for i in range(len(keys))]


HOSTILE_KEYS = [
    pytest.param(b"../../etc_0123456789ab_r0/", id="dot-dot"),
    pytest.param(b"a/b_0123456789ab_r0/", id="slash-in-model"),
    pytest.param(b".hidden_0123456789ab_r0/", id="leading-dot"),
    pytest.param(b"m\x00_0123456789ab_r0/", id="nul"),
    pytest.param(b"m od_0123456789ab_r0/", id="space"),
    pytest.param(b"m@4@1_0123456789ab_r0/", id="at-sign"),
    pytest.param(b"m_0123456789AB_r0/", id="upper-case-digest"),
    pytest.param(b"m_0123456789a_r0/", id="short-digest"),
    pytest.param(b"m_0123456789ab_r01/", id="rank-leading-zero"),
    pytest.param(b"m_0123456789ab_r64/", id="rank-past-max-ranks"),
    pytest.param(b"m_0123456789ab_r/", id="no-rank"),
    pytest.param(b"m_0123456789ab/", id="no-rank-suffix"),
    pytest.param(b"x" * 201 + b"_0123456789ab_r0/", id="model-too-long"),
    pytest.param("mödel_0123456789ab_r0/".encode(), id="non-ascii"),
]


@pytest.mark.parametrize("prefix", HOSTILE_KEYS)
def test_a_hostile_namespace_in_a_key_is_stored_under_a_hash_of_the_key(tmp_path: Path, prefix: bytes) -> None:
    t = make(tmp_path)
    key = prefix + hashlib.sha256(b"blk").digest() + bytes(4)
    loc = t.location(key)
    assert loc.namespace is None and not loc.vllm and loc.hash_hex.endswith("_k")
    t.put(key, b"v")
    assert t.get(key) == b"v"
    assert sorted(p.name for p in tmp_path.iterdir()) == [NS.directory_name, f"{NS.directory_name}_r0"]


@pytest.mark.parametrize("rest", [bytes(35), bytes(32) + (16).to_bytes(4, "big")], ids=["hash-size", "group"])
def test_a_valid_namespace_with_no_offload_key_behind_it_is_stored_under_a_hash(tmp_path: Path, rest: bytes) -> None:
    key = f"{VLLM_DIR}_r0/".encode() + rest
    loc = make(tmp_path).location(key)
    assert loc.namespace is None and loc.hash_hex.endswith("_k")


def test_namespace_directories_are_bounded_and_a_refusal_is_counted(tmp_path: Path) -> None:
    t = make(tmp_path, max_namespaces=3)  # the server's own namespace is one of them
    (tmp_path / "vllm-made_aaaaaaaaaaaa_r0").mkdir()  # a vLLM fs tier created this one itself
    t.rebuild_index()
    t.put(vllm_key(b"1", namespace="m1_111111111111"), b"one")
    t.put(vllm_key(b"2", namespace="m2_222222222222"), b"two")  # a fourth directory: refused
    assert t.get(vllm_key(b"1", namespace="m1_111111111111")) == b"one"
    assert t.get(vllm_key(b"2", namespace="m2_222222222222")) is None
    assert not (tmp_path / "m2_222222222222_r0").exists()
    assert t.stats()["namespaces_refused"] == 1 and t.stats()["namespaces"] == 3
    (tmp_path / "m3_333333333333_r0").mkdir()  # directories vLLM made are always used
    t.put(vllm_key(b"3", namespace="m3_333333333333"), b"three")
    assert t.get(vllm_key(b"3", namespace="m3_333333333333")) == b"three"
    t.put(vllm_key(b"kept", namespace="vllm-made_aaaaaaaaaaaa"), b"x")
    assert t.get(vllm_key(b"kept", namespace="vllm-made_aaaaaaaaaaaa")) == b"x"


def test_a_block_vllm_wrote_is_not_overwritten_by_a_set_of_its_key(tmp_path: Path) -> None:
    t = make(tmp_path)
    key = vllm_key(b"both wrote it")
    path = t.path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    block = os.urandom(8192)
    path.write_bytes(block)
    t.put(key, os.urandom(8192))  # vLLM skips an existing block file, and so does the server
    assert path.read_bytes() == block
    assert t.get(key) == block and t.holds(key)
    other = b"plain"  # a key not in vLLM's form is a plain SET: written again
    t.put(other, b"1")
    t.put(other, b"2")
    assert t.get(other) == b"2"


def test_the_watermarks_evict_blocks_vllm_wrote_in_its_own_namespace(tmp_path: Path) -> None:
    blocks = []
    for i in range(12):  # a vLLM fs tier's files, written before the server starts
        path = tmp_path / make(tmp_path).relpath(vllm_key(b"%d" % i))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(5_000))
        blocks.append(path)
    t = make(tmp_path, capacity=60_000, high_watermark=0.9, low_watermark=0.5)  # the start-up scan finds them
    assert t.used == 12 * 5_000
    t.make_room(0)
    assert t.used <= 30_000 and t.evictions >= 6
    assert sum(p.exists() for p in blocks) == len(t._index)


def test_over_the_high_watermark_with_nothing_indexed_the_tier_rescans(tmp_path: Path) -> None:
    """A vLLM fs tier filling the disk between rescans: the server finds its files at once, without waiting for
    `rescan_interval_seconds`. `capacity: 0` means the filesystem's size, so a small tmpfs (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        t = make(mnt, capacity=0, min_rescan_seconds=0, high_watermark=0.9, low_watermark=0.5)
        for i in range(240):  # vLLM writes ~940 KiB of the 1 MiB; the server has not seen any of it
            path = mnt / t.relpath(vllm_key(b"%d" % i))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(4_096))
        st = os.statvfs(mnt)
        assert (st.f_blocks - st.f_bavail) / st.f_blocks > 0.9
        assert t.used == 0
        t.put(b"ours", b"v" * 4_096)
        assert t.evictions > 0 and t.get(b"ours") == b"v" * 4_096
        st = os.statvfs(mnt)
        assert (st.f_blocks - st.f_bavail) / st.f_blocks <= 0.9
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_each_change_of_the_index_is_told_with_the_key_its_path_names(tmp_path: Path) -> None:
    """What KV events are built from: a write, a write that finds the block there, an eviction (the key from vLLM's
    path, the file unread), a delete and a corrupt file removed, each told once, in order; other keys are not told."""
    t = make(tmp_path, capacity=100_000, high_watermark=0.9, low_watermark=0.5)
    told: list[tuple[bytes, bool]] = []
    t.on_change = lambda key, held: told.append((key, held))
    ns = b"meta-llama_Llama-3.1-8B_0123456789ab_r0/"
    keys = [ns + hashlib.sha256(bytes([i])).digest() + (i % 2).to_bytes(4, "big") for i in range(12)]
    t.put(b"llama@1@0@deadbeef01@bfloat16kv_bytes", b"x" * 100)  # LMCache: no block hash, never told
    for key in keys[:8]:
        t.put(key, b"v" * 10_000)
    assert told == [(k, True) for k in keys[:8]]
    t.put(keys[7], b"v" * 10_000)  # already written: held again
    assert told[8:] == [(keys[7], True)]
    told.clear()
    t.put(keys[8], b"v" * 10_000)  # over the high watermark: the oldest go first
    evicted = [k for k, held in told if not held]
    assert evicted == keys[: len(evicted)] and evicted and told[-1] == (keys[8], True)
    assert sorted(t.block_keys()) == sorted(keys[len(evicted) : 9])
    told.clear()
    assert t.delete(keys[8]) and not t.delete(keys[8])
    t.path(keys[7]).write_bytes(t.path(keys[7]).read_bytes()[:-1] + b"!")  # damaged trailer
    assert t.get(keys[7]) is None
    assert told == [(keys[8], False), (keys[7], False)]
