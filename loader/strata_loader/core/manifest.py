"""The completion marker: a manifest written last, atomically, listing every file of a finished copy.

Readers (pods, the operator, a re-run of fetch) trust DEST only when the manifest is there and names the same
source and revision; a fetch that starts over removes it first, so a half-updated copy never looks whole.
The manifest vouches for what DEST held when it was written; `damage` checks that DEST still holds it (files
can be deleted, truncated or flipped later), which is what `verify` and a re-run of `fetch` rely on.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, field_validator

from ..contract import MANIFEST_NAME, manifest_digest
from ..paths import DestDir, UnsafePathError, safe_relative_path
from .messages import validation_error

CHECKSUM_PREFERENCE = ("sha256", "md5")
"""Strongest first: one of them is enough to tell whether a file's content changed."""
GIT_BLOB = "git-blob-sha1"
"""A git blob id, SHA-1 of "blob <size>\\0" and the content: what the Hub vouches for files outside LFS."""
VERIFIABLE = (*CHECKSUM_PREFERENCE, GIT_BLOB)
"""The checksums a fetch can compare a file against."""

MANIFEST_VERSION = 1


class ManifestFile(BaseModel):
    path: str
    size: int
    version: str = ""
    checksums: dict[str, str] = {}

    @field_validator("path")
    @classmethod
    def _clean(cls, v: str) -> str:
        """Readers join these paths onto DEST: a manifest naming anything but a clean relative path is not
        written, and one read back with such a path is not trusted."""
        try:
            return safe_relative_path(v)
        except UnsafePathError as e:
            raise ValueError(f"path {e}") from None


class Manifest(BaseModel):
    version: int = MANIFEST_VERSION
    source: str
    revision: str | None = None
    created: str = ""
    bytes: int = 0
    files: list[ManifestFile]

    def same_copy(self, source: str, revision: str | None, files: list[tuple[str, int]], versions: list[str]) -> bool:
        mine = sorted((f.path, f.size, f.version) for f in self.files)
        theirs = sorted((p, n, v) for (p, n), v in zip(files, versions, strict=True))
        return self.source == source and self.revision == revision and mine == theirs


class ManifestError(RuntimeError):
    """DEST has no manifest, or one that cannot be trusted: either way the copy counts as incomplete."""


def load_manifest(dest: Path) -> Manifest:
    """The manifest in `dest`; `ManifestError` saying why when it is absent or invalid."""
    path = dest / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{dest}: no {MANIFEST_NAME}; the copy is incomplete, run fetch") from None
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as e:
        why = validation_error(e.errors()[0], "manifest")
    except ValueError as e:
        why = str(e)
    raise ManifestError(f"{path} is not a valid manifest ({why}); the copy is incomplete, re-run fetch")


def read_manifest(dest: Path) -> Manifest | None:
    """The manifest in `dest`, or None when absent or invalid (an invalid one counts as incomplete)."""
    try:
        return load_manifest(dest)
    except ManifestError:
        return None


def remove_manifest(dest: Path) -> None:
    try:
        os.unlink(dest / MANIFEST_NAME)
    except FileNotFoundError:
        return
    fsync_dir(dest)


def same_manifest(manifest: Manifest, proven: bytes | None) -> Manifest | bytes:
    """`proven` (a manifest's bytes) when it records exactly what `manifest` does (its creation time aside),
    else `manifest`."""
    if proven is None:
        return manifest
    try:
        other = Manifest.model_validate_json(proven)
    except ValueError:
        return manifest
    same = other.model_copy(update={"created": ""}) == manifest.model_copy(update={"created": ""})
    return proven if same else manifest


def write_manifest(dest: Path, manifest: Manifest | bytes) -> tuple[Path, str]:
    """Write via temp file + fsync + rename + directory fsync; returns the path and the manifest's digest.
    Bytes are written as they are (a manifest another copy proved it holds)."""
    if isinstance(manifest, Manifest):
        manifest.created = manifest.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        data = json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True).encode()
    else:
        data = manifest
    path = dest / MANIFEST_NAME
    tmp = dest / (MANIFEST_NAME + ".tmp")
    tmp.unlink(missing_ok=True)  # a fresh file, never one a link planted under this name points to
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(dest)
    return path, manifest_digest(data)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def strongest_checksum(checksums: dict[str, str]) -> tuple[str, str] | None:
    """(algorithm, hex digest) of the strongest checksum recorded, or None when there is none."""
    for algo in CHECKSUM_PREFERENCE:
        if algo in checksums:
            return algo, checksums[algo]
    return None


def manifest_checksums(manifest: Manifest) -> dict[str, Any]:
    """relative path -> 'algo:hex' with the strongest checksum known for each file."""
    out = {}
    for f in manifest.files:
        best = strongest_checksum(f.checksums)
        if best:
            out[f.path] = f"{best[0]}:{best[1]}"
    return out


def hash_file(f: io.RawIOBase, algos: Iterable[str]) -> dict[str, str]:
    """Hex digests of everything `f` holds from its current position, every algorithm in one pass."""
    hashers = {a: _hasher(a, f) for a in algos}
    buf = bytearray(8 * 2**20)
    mv = memoryview(buf)
    while n := f.readinto(buf):
        for h in hashers.values():
            h.update(mv[:n])
    return {a: h.hexdigest() for a, h in hashers.items()}


def _hasher(algo: str, f: io.RawIOBase) -> Any:
    if algo != GIT_BLOB:
        return hashlib.new(algo)
    h = hashlib.sha1(usedforsecurity=False)  # git's object id, compared with the Hub's, not a security choice
    h.update(b"blob %d\0" % (os.fstat(f.fileno()).st_size - f.tell()))
    return h


def damage(tree: DestDir, entry: ManifestFile, checksums: bool = True) -> str | None:
    """What differs between DEST's copy of `entry` and what the manifest recorded, or None when nothing does.

    Presence, file type and size always (cheap: one `lstat`); with `checksums`, also the strongest checksum
    the manifest recorded, which reads the whole file. A file without a recorded checksum is checked by size.
    """
    st = tree.lstat(entry.path)
    if st is None:
        return "missing"
    if not stat.S_ISREG(st.st_mode):
        return "a symlink, not the fetched file" if stat.S_ISLNK(st.st_mode) else "not a regular file"
    if st.st_size != entry.size:
        return f"{st.st_size} bytes, the manifest says {entry.size}"
    best = strongest_checksum(entry.checksums) if checksums else None
    if best:
        algo, want = best
        with open(tree.open(entry.path, os.O_RDONLY), "rb", buffering=0) as f:
            got = hash_file(f, [algo])[algo]
        if got != want:
            return f"content differs: {algo} {got}, the manifest says {want}"
    return None
