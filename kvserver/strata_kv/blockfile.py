"""Where a chunk lives in vLLM's offloading FS layout, and the checksummed block-file format.

Layout (vLLM `tiering/fs/file_mapper.py`, shared with llm-d):
`<root>/<model>_<digest12>_r<rank>/<hash[:3]>/<hash[3:5]>_g<group>/<hash_hex>.bin`.

File format: the value first, then the key, then a 24-byte trailer (magic, version, key length,
value length, CRC32 over key + value). vLLM reads a block from offset 0 (`load_block` reads
`block_size` bytes), so it reads our value unchanged; the trailer lets us rebuild what the file
holds and reject a damaged one (a corrupt file is a miss, never served). Files without the trailer
are vLLM's own: never served (no checksum), never removed by a read.
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

_LMCACHE_KEY = re.compile(
    rb"^(?P<model>[^@]+)@(?P<rank>[0-9a-fA-F]{1,8})@(?P<group>[0-9a-fA-F]{1,8})"
    rb"@(?P<hash>-?[0-9a-fA-F]+)(?:@(?P<salt>.+))?$",
    re.DOTALL,
)
_VLLM_HASH_SIZES = (8, 16, 32)


@dataclass(frozen=True)
class BlockLocation:
    """Where one key's block file lives, relative to the namespace directory's parent."""

    rank: int
    group: int
    hash_hex: str

    def relpath(self, namespace_dir: str) -> str:
        h = self.hash_hex
        return f"{namespace_dir}_r{self.rank}/{h[:3]}/{h[3:5]}_g{self.group}/{h}.bin"


def locate(key: bytes, default_rank: int = 0) -> BlockLocation:
    """Map a client key to its block location.

    LMCache keys (`model@rank@group@hash[@salt]`) keep their rank, group and hash; model and tenant
    salt are folded into the file name so neither models nor tenants ever share a file. vLLM offload
    keys (hash bytes + 4-byte big-endian group) keep their hash. Anything else: sha256 of the key.
    """
    m = _LMCACHE_KEY.match(key)
    if m is not None:
        hash_hex = m.group("hash").decode().lower().replace("-", "n")
        if len(hash_hex) < 5:
            hash_hex = hash_hex.rjust(5, "0")
        scope = m.group("model") + b"\0" + (m.group("salt") or b"")
        hash_hex = f"{hash_hex}s{hashlib.sha256(scope).hexdigest()[:16]}"
        return BlockLocation(int(m.group("rank"), 16), int(m.group("group"), 16), hash_hex)
    if len(key) - 4 in _VLLM_HASH_SIZES and not key.isascii():
        return BlockLocation(default_rank, int.from_bytes(key[-4:], "big"), key[:-4].hex())
    return BlockLocation(default_rank, 0, hashlib.sha256(key).hexdigest())


def encode_trailer(key: bytes, value: bytes | memoryview) -> bytes:
    """What follows the value in a block file: the key and the trailer."""
    crc = zlib.crc32(value, zlib.crc32(key))
    return key + TRAILER.pack(MAGIC, VERSION, 0, 0, len(key), len(value), crc)


class CorruptBlock(ValueError):
    """A block file whose trailer, length or checksum does not match: remove it, treat as a miss."""


class ForeignBlock(ValueError):
    """A block file without our trailer, e.g. written by vLLM into the shared directory: never served
    (it carries no checksum), never removed by a read (it is not ours to judge)."""


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
