"""Where a chunk lives in vLLM's offloading FS layout, and the checksummed block-file format.

Layout (vLLM `tiering/fs/file_mapper.py`, shared with llm-d):
`<root>/<model>_<digest12>_r<rank>/<hash[:3]>/<hash[3:5]>_g<group>/<hash_hex>.bin`.

File format: the value first, then the key, then a 24-byte trailer (magic, version, key length,
value length, CRC32 over key + value). vLLM reads a block from offset 0 (`load_block` reads
`block_size` bytes), so it reads our value unchanged; the trailer lets us rebuild what the file
holds and reject a damaged one (a corrupt file is a miss, never served). Files without the trailer
are vLLM's own raw blocks: served (whole file, no checksum to verify) only to a key in vLLM's form, whose path is
the block hash vLLM itself named the file by; never removed by a read.

Why the trailer stays: vLLM reads exactly `block_size` bytes from offset 0 and ignores the rest of a longer file,
so value + key + trailer is a file vLLM reads as its own block, while Strata still verifies what it wrote. A
trailer-less file can only be told apart by the missing magic, which is why raw files are served only where vLLM
wrote them (a key in vLLM's form), never for LMCache or arbitrary keys.
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from dataclasses import dataclass

MAGIC = b"STKV"
VERSION = 2
TRAILER = struct.Struct(">4sBBHIQI")  # magic, version, flags, reserved, key_len, value_len, crc32
TRAILER_SIZE = TRAILER.size

# LMCache 0.5.6 `CacheEngineKey.to_string()`: `model@world_size@worker_id@chunk_hash@dtype[@suffix]`; its redis
# connector stores `<key>kv_bytes` and `<key>metadata`, which land in the dtype/suffix part. Only the canonical
# spelling (decimal sizes without leading zeros, lower-case hex hash) is read as such: anything else is just bytes.
_LMCACHE_KEY = re.compile(
    rb"^(?P<model>[^@]+)@(?P<world>0|[1-9][0-9]{0,8})@(?P<worker>0|[1-9][0-9]{0,8})"
    rb"@(?P<hash>-?[0-9a-f]{1,64})@(?P<rest>.+)$",
    re.DOTALL,
)
_VLLM_HASH_SIZES = (8, 16, 32)
DEFAULT_MAX_RANKS = 64
DEFAULT_MAX_KV_GROUPS = 16
MAX_MODEL_NAME_LEN = 200
"""Longest model part of a vLLM namespace directory a key may name (with `_<digest12>_r<rank>` it stays far
below the 255-byte file name limit)."""

# `<model with "/" as "_">_<digest12>_r<rank>/` + vLLM's offload key: what `strata_kv.vllm.tier.namespace_prefix`
# puts in front of every key. The model part becomes a directory name, so only a safe spelling is taken as one:
# letters, digits, `_ . + -`, not starting with a dot, at most MAX_MODEL_NAME_LEN characters; the rank without
# leading zeros. Anything else is just bytes (stored under a hash of the key).
_VLLM_DIR = rb"[A-Za-z0-9_+\-][A-Za-z0-9_.+\-]{0,%d}_[0-9a-f]{12}" % (MAX_MODEL_NAME_LEN - 1)
_VLLM_TIER_KEY = re.compile(rb"^(?P<dir>" + _VLLM_DIR + rb")_r(?P<rank>0|[1-9][0-9]{0,4})/(?P<rest>.+)$", re.DOTALL)
VLLM_RANK_DIR = re.compile("^(?P<dir>" + _VLLM_DIR.decode() + ")_r(?P<rank>0|[1-9][0-9]{0,4})$")
"""A top-level directory of the L2 root that holds vLLM-layout blocks of one namespace and rank."""


@dataclass(frozen=True)
class BlockLocation:
    """Where one key's block file lives, relative to the namespace directory's parent.

    `namespace` is set for a vLLM-tier key, which names its own namespace directory (the one vLLM's `fs` tier
    uses for that model and layout); every other key lives in the server's configured one. `vllm` marks a key in
    vLLM's form (with or without that prefix): its file may be vLLM's own raw block."""

    rank: int
    group: int
    hash_hex: str
    namespace: str | None = None
    vllm: bool = False

    def relpath(self, namespace_dir: str) -> str:
        h = self.hash_hex
        return f"{self.top(namespace_dir)}/{h[:3]}/{h[3:5]}_g{self.group}/{h}.bin"

    def top(self, namespace_dir: str) -> str:
        """The rank directory under the root: `<namespace>_r<rank>`."""
        return f"{self.namespace or namespace_dir}_r{self.rank}"


def split_vllm_tier_key(key: bytes) -> tuple[str, int, bytes] | None:
    """(namespace directory `<model>_<digest12>`, rank, what follows the `/`) of a key with a vLLM-tier prefix whose
    namespace is safe as a directory name; None for any other key. The one reading of that prefix: the L2 layout
    and KV events (`strata_kv.store.kvevents`) both take it from here."""
    m = _VLLM_TIER_KEY.match(key)
    if m is None:
        return None
    return m.group("dir").decode(), int(m.group("rank")), m.group("rest")


_VLLM_BLOCK_FILE = re.compile(
    r"^(?P<top>[^/]+)/(?P<h3>[0-9a-f]{3})/(?P<h5>[0-9a-f]{2})_g(?P<group>0|[1-9][0-9]{0,4})/"
    r"(?P<hash>(?:[0-9a-f]{16}){1,2}|[0-9a-f]{64})\.bin$"
)


def vllm_tier_key_of(relpath: str) -> bytes | None:
    """The vLLM-tier key whose block file is at `relpath` (the inverse of `locate` for vLLM's layout), or None for a
    file of any other key (LMCache's, raw). Without I/O: KV events name what an eviction removed by its path."""
    m = _VLLM_BLOCK_FILE.match(relpath)
    if m is None or VLLM_RANK_DIR.match(m.group("top")) is None:
        return None
    h = m.group("hash")
    if m.group("h3") != h[:3] or m.group("h5") != h[3:5]:
        return None
    return f"{m.group('top')}/".encode() + bytes.fromhex(h) + int(m.group("group")).to_bytes(4, "big")


def _offload_key(rest: bytes, max_kv_groups: int) -> tuple[str, int] | None:
    """(hash hex, group) of a vLLM offload key: 8/16/32 hash bytes + 4-byte big-endian group < max_kv_groups."""
    if len(rest) - 4 not in _VLLM_HASH_SIZES:
        return None
    group = int.from_bytes(rest[-4:], "big")
    if group >= max_kv_groups:
        return None
    return rest[:-4].hex(), group


def _raw_location(key: bytes, default_rank: int) -> BlockLocation:
    """A key in no canonical form: named by the sha256 of its exact bytes. The `_k` tail keeps these names
    apart from vLLM's (pure hex) and LMCache's (`<hash>s<digest>`), so no other kind of key can land here."""
    return BlockLocation(default_rank, 0, hashlib.sha256(key).hexdigest() + "_k")


def locate(
    key: bytes,
    default_rank: int = 0,
    max_ranks: int = DEFAULT_MAX_RANKS,
    max_kv_groups: int = DEFAULT_MAX_KV_GROUPS,
) -> BlockLocation:
    """Map a client key to its block location. Two keys that differ in any byte never share a file, with one
    exception that names one block twice: a bare vLLM offload key and the vLLM-tier key naming the server's own
    namespace and rank. Each file records its key, so a file either wrote is a miss (never served) for the other.

    - LMCache keys (`model@world_size@worker_id@chunk_hash@dtype[@suffix]`, canonical spelling only, with
      `worker_id < world_size <= max_ranks`): rank directory = worker_id, group 0, file name = the chunk hash
      plus `s` and 32 hex of the sha256 of the whole key (so model, dtype, tenant suffix and the connector's
      `kv_bytes`/`metadata` tails each get their own file).
    - vLLM-tier keys (`<model>_<digest12>_r<rank>/` + offload key, see `_VLLM_TIER_KEY`, rank < max_ranks):
      exactly the path vLLM's own `fs` tier gives that block, under the namespace directory the key names (not
      the server's), so a vLLM `fs` tier on the same root reads and writes the same files.
    - vLLM offload keys (8/16/32 hash bytes + 4-byte big-endian KV group < max_kv_groups): exactly vLLM's
      FileMapper path in the server's namespace, the hash in hex.
    - Anything else (including non-canonical spellings of the above): sha256 of the key bytes.

    Directory names thus come from bounded sets (ranks < max_ranks, groups < max_kv_groups, hex prefixes),
    so keys cannot spray directories; the namespace directories vLLM-tier keys name are bounded by the tier
    (`l2.fs.max_namespaces`).
    """
    if (tier_key := split_vllm_tier_key(key)) is not None:
        namespace, rank, rest = tier_key
        offload = _offload_key(rest, max_kv_groups)
        if offload is not None and rank < max_ranks:
            return BlockLocation(rank, offload[1], offload[0], namespace=namespace, vllm=True)
        return _raw_location(key, default_rank)
    m = _LMCACHE_KEY.match(key)
    if m is not None:
        world, worker = int(m.group("world")), int(m.group("worker"))
        if not (worker < world <= max_ranks):
            return _raw_location(key, default_rank)
        hash_hex = m.group("hash").decode().replace("-", "n")
        if len(hash_hex) < 5:
            hash_hex = hash_hex.rjust(5, "0")
        return BlockLocation(worker, 0, f"{hash_hex}s{hashlib.sha256(key).hexdigest()[:32]}")
    if not key.isascii() and (offload := _offload_key(key, max_kv_groups)) is not None:
        return BlockLocation(default_rank, offload[1], offload[0], vllm=True)
    return _raw_location(key, default_rank)


def encode_trailer(key: bytes, value: bytes | memoryview) -> bytes:
    """What follows the value in a block file: the key and the trailer."""
    crc = zlib.crc32(value, zlib.crc32(key))
    return key + TRAILER.pack(MAGIC, VERSION, 0, 0, len(key), len(value), crc)


class CorruptBlock(ValueError):
    """A block file whose trailer, length or checksum does not match: remove it, treat as a miss."""


class ForeignBlock(ValueError):
    """A block file without our trailer, e.g. written by vLLM into the shared directory: served (whole) only to
    a key in vLLM's form, never removed by a read (it carries no checksum: not ours to judge)."""


class KeyMismatch(LookupError):
    """A valid block file for another key sits at this key's path: a miss, but keep the file."""


@dataclass(frozen=True)
class BlockTrailer:
    key_len: int
    value_len: int
    crc: int

    @property
    def file_size(self) -> int:
        return self.value_len + self.key_len + TRAILER_SIZE


def decode_trailer(tail: bytes, file_size: int) -> BlockTrailer:
    """Parse the last TRAILER_SIZE bytes of a file of `file_size` bytes."""
    if file_size < TRAILER_SIZE or len(tail) < TRAILER_SIZE:
        raise CorruptBlock(f"block file is {file_size} bytes, shorter than its {TRAILER_SIZE}-byte trailer")
    magic, version, _flags, _res, key_len, value_len, crc = TRAILER.unpack_from(tail, len(tail) - TRAILER_SIZE)
    if magic != MAGIC:
        raise ForeignBlock(f"no Strata trailer (magic {magic!r}): a block another writer (vLLM) owns")
    if version != VERSION:
        raise CorruptBlock(f"block file version {version} unknown (this server reads {VERSION})")
    trailer = BlockTrailer(key_len, value_len, crc)
    if trailer.file_size != file_size:
        raise CorruptBlock(f"block file is {file_size} bytes, its trailer says {trailer.file_size}")
    return trailer


def decode_block(blob: bytes, expected_key: bytes | None = None) -> tuple[bytes, bytes]:
    """Return (key, value) from a whole block file, verifying length and checksum."""
    trailer = decode_trailer(blob[-TRAILER_SIZE:], len(blob))
    view = memoryview(blob)
    key = bytes(view[trailer.value_len : trailer.value_len + trailer.key_len])
    if expected_key is not None and key != expected_key:
        raise KeyMismatch("block file holds a different key (hash collision or misplaced file)")
    value = view[: trailer.value_len]
    if zlib.crc32(value, zlib.crc32(key)) != trailer.crc:
        raise CorruptBlock("block checksum mismatch")
    return key, bytes(value)
