"""The completion marker: a manifest written last, atomically, listing every file of a finished copy.

Readers (pods, the operator, a re-run of fetch) trust DEST only when the manifest is there and names the same
source and revision; a fetch that starts over removes it first, so a half-updated copy never looks whole.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .contract import MANIFEST_NAME, manifest_digest

MANIFEST_VERSION = 1


class ManifestFile(BaseModel):
    path: str
    size: int
    version: str = ""
    checksums: dict[str, str] = {}


class Manifest(BaseModel):
    version: int = MANIFEST_VERSION
    source: str
    revision: str | None = None
    created: str = ""
    bytes: int = 0
    files: list[ManifestFile]

    def same_copy(self, source: str, revision: str | None, files: list[tuple[str, int]],
                  versions: list[str]) -> bool:
        mine = sorted((f.path, f.size, f.version) for f in self.files)
        theirs = sorted((p, n, v) for (p, n), v in zip(files, versions, strict=True))
        return self.source == source and self.revision == revision and mine == theirs


def read_manifest(dest: Path) -> Manifest | None:
    """The manifest in `dest`, or None when absent or unreadable (an unreadable one counts as incomplete)."""
    try:
        return Manifest.model_validate_json((dest / MANIFEST_NAME).read_bytes())
    except (FileNotFoundError, ValidationError, ValueError):
        return None


def remove_manifest(dest: Path) -> None:
    try:
        os.unlink(dest / MANIFEST_NAME)
    except FileNotFoundError:
        return
    fsync_dir(dest)


def write_manifest(dest: Path, manifest: Manifest) -> tuple[Path, str]:
    """Write via temp file + fsync + rename + directory fsync; returns the path and the manifest's digest."""
    manifest.created = manifest.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data = json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True).encode()
    path = dest / MANIFEST_NAME
    tmp = dest / (MANIFEST_NAME + ".tmp")
    with open(tmp, "wb") as f:
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


def manifest_checksums(manifest: Manifest) -> dict[str, Any]:
    """relative path -> 'algo:hex' with the strongest checksum known for each file."""
    out = {}
    for f in manifest.files:
        for algo in ("sha256", "md5"):
            if algo in f.checksums:
                out[f.path] = f"{algo}:{f.checksums[algo]}"
                break
    return out
