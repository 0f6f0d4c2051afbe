"""Where a chunk lives in vLLM's offloading FS layout, and the checksummed block-file format.

Layout (vLLM `tiering/fs/file_mapper.py`, shared with llm-d):
`<root>/<model>_<digest12>_r<rank>/<hash[:3]>/<hash[3:5]>_g<group>/<hash_hex>.bin`.

File format: a 24-byte header + the key, then the value. The value sits at the end of the file, so
readers that take a block from `file_size - bytes` (llm-d) read it unchanged; the header carries the
key (for rebuilding the index) and a CRC32 over key + value (a corrupt file is a miss, never served).
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from dataclasses import dataclass

MAGIC = b"STKV"
VERSION = 1
HEADER = struct.Struct(">4sBBHIQI")  # magic, version, flags, reserved, key_len, value_len, crc32
HEADER_SIZE = HEADER.size

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


def encode_header(key: bytes, value: bytes | memoryview) -> bytes:
    crc = zlib.crc32(value, zlib.crc32(key))
    return HEADER.pack(MAGIC, VERSION, 0, 0, len(key), len(value), crc) + key


class CorruptBlock(ValueError):
    """A block file whose header, length or checksum does not match: remove it, treat as a miss."""


class ForeignBlock(ValueError):
    """A block file without our header, e.g. written by vLLM into the shared directory: never served
    (it carries no checksum), never removed by a read (it is not ours to judge)."""


class KeyMismatch(LookupError):
    """A valid block file for another key sits at this key's path: a miss, but keep the file."""


@dataclass(frozen=True)
class BlockHeader:
    key: bytes
    value_len: int
    crc: int
    data_offset: int


def decode_header(blob: bytes) -> BlockHeader:
    """Parse the header at the start of `blob` (which must hold at least the header and key)."""
    if len(blob) < HEADER_SIZE:
        raise CorruptBlock(f"block file is {len(blob)} bytes, shorter than its {HEADER_SIZE}-byte header")
    magic, version, _flags, _res, key_len, value_len, crc = HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise ForeignBlock(f"no Strata header (magic {magic!r}): a block another writer (vLLM) owns")
    if version != VERSION:
        raise CorruptBlock(f"block file version {version} unknown (this server reads {VERSION})")
    if len(blob) < HEADER_SIZE + key_len:
        raise CorruptBlock(f"block header announces a {key_len}-byte key but the file is truncated")
    key = bytes(blob[HEADER_SIZE : HEADER_SIZE + key_len])
    return BlockHeader(key, value_len, crc, HEADER_SIZE + key_len)


def decode_block(blob: bytes, expected_key: bytes | None = None) -> tuple[bytes, bytes]:
    """Return (key, value) from a whole block file, verifying length and checksum."""
    header = decode_header(blob)
    if expected_key is not None and header.key != expected_key:
        raise KeyMismatch("block file holds a different key (hash collision or misplaced file)")
    end = header.data_offset + header.value_len
    if len(blob) != end:
        raise CorruptBlock(f"block file is {len(blob)} bytes, header says {end}")
    view = memoryview(blob)[header.data_offset :]
    if zlib.crc32(view, zlib.crc32(header.key)) != header.crc:
        raise CorruptBlock("block checksum mismatch")
    return header.key, bytes(view)
