"""Byte-range readers over local files and S3 objects: one `read_into(offset, buffer)` call each; and `SourceFile`,
one file of a fetch source with the reader that opens it (the catalog lists them, the peer fan-out wraps them).

Reads run in worker threads; `os.preadv` and socket reads release the GIL, so threads give real parallelism.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .format import Header, SafetensorsError, parse_header, parse_header_size

HEADER_PROBE = 1 * 2**20
"""First read of a remote header: covers almost every real header in one request."""


class RangeReader(Protocol):
    name: str
    size: int

    def read_into(self, offset: int, buf: memoryview) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SourceFile:
    """One file to copy. `checksums` maps algorithm ('sha256', 'md5') to the hex digest the source
    vouches for; `version` changes whenever the content may have (ETag, blob hash, mtime), so stale bytes
    are never reused."""

    relpath: str
    size: int
    open: Callable[[], RangeReader] = field(compare=False, repr=False)
    checksums: dict[str, str] = field(default_factory=dict)
    version: str = ""


class LocalReader:
    """A local or shared-filesystem file read with positional reads (no shared file offset, thread-safe)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        try:
            self._fd = os.open(self.name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.name}: no such file") from None
        self.size = os.fstat(self._fd).st_size

    def read_into(self, offset: int, buf: memoryview) -> None:
        want = len(buf)
        done = 0
        while done < want:
            n = os.preadv(self._fd, [buf[done:]], offset + done)
            if n == 0:
                raise SafetensorsError(
                    f"{self.name}: file ended at byte {offset + done}, expected {offset + want} (truncated?)"
                )
            done += n

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LocalReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_header(reader: RangeReader) -> Header:
    """Read and validate a file's header: at most two reads, never more bytes than the file holds."""
    probe = bytearray(min(HEADER_PROBE, reader.size))
    if reader.size < 8:
        raise SafetensorsError(f"{reader.name}: file is {reader.size} bytes, too small for a header")
    reader.read_into(0, memoryview(probe))
    try:
        n = parse_header_size(bytes(probe[:8]), reader.size)
        if 8 + n <= len(probe):
            raw = bytes(probe[8 : 8 + n])
        else:
            rest = bytearray(8 + n - len(probe))
            reader.read_into(len(probe), memoryview(rest))
            raw = bytes(probe[8:]) + bytes(rest)
        return parse_header(raw, reader.size)
    except SafetensorsError as e:
        raise SafetensorsError(f"{reader.name}: {e}") from None


def open_reader(location: str | os.PathLike[str]) -> RangeReader:
    """A reader for a local path or an `s3://bucket/key` URI (S3 settings from the AWS environment)."""
    loc = os.fspath(location)
    if loc.startswith("s3://"):
        from .s3 import S3Reader

        return S3Reader.from_uri(loc)
    return LocalReader(loc)
