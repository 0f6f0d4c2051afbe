"""What a fetch source holds: the list of files with sizes, checksums the source already has, and a reader for
each. Sources: local/shared filesystem paths, `pvc://` mounts, S3 prefixes, and the Hugging Face cache
layout."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .contract import (
    DEFAULT_PVC_MOUNT_ROOT,
    ENV_HF_HOME,
    ENV_HF_HUB_CACHE,
    ENV_PVC_MOUNT_ROOT,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    FetchRequest,
)
from .sources import LocalReader, RangeReader

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")


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


class SourceError(RuntimeError):
    """The source cannot be listed: it does not exist, is empty after filtering, or is not reachable."""


def list_source(req: FetchRequest) -> tuple[list[SourceFile], str | None]:
    """Files of the request's source after include/exclude, sorted by path, and the resolved revision."""
    kind = req.source_kind
    if kind == "s3":
        files, revision = _list_s3(req.source, req.concurrency), req.revision
    elif kind == "hf":
        files, revision = _list_hf(req.source, req.revision)
    elif kind == "pvc":
        claim, _, sub = req.source[len("pvc://") :].partition("/")
        root = Path(os.environ.get(ENV_PVC_MOUNT_ROOT, DEFAULT_PVC_MOUNT_ROOT)) / claim / sub
        files, revision = _list_dir(root), req.revision
    else:
        files, revision = _list_dir(Path(req.source)), req.revision
    picked = [f for f in files if selected(f.relpath, req.include, req.exclude)]
    if not picked:
        raise SourceError(
            f"no files to fetch under {req.source} (found {len(files)}; include={req.include or ['*']},"
            f" exclude={req.exclude}); check the URI and the globs"
        )
    return sorted(picked, key=lambda f: f.relpath), revision


def selected(relpath: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Globs match the relative path or its base name; our own bookkeeping files never travel."""
    name = relpath.rsplit("/", 1)[-1]
    if name == MANIFEST_NAME or PARTIAL_SUFFIX in name:
        return False

    def hit(globs: Sequence[str]) -> bool:
        return any(fnmatch.fnmatchcase(relpath, g) or fnmatch.fnmatchcase(name, g) for g in globs)

    return (not include or hit(include)) and not hit(exclude)


def _list_dir(root: Path, checksum_of: Callable[[Path], dict[str, str]] | None = None) -> list[SourceFile]:
    if not root.is_dir():
        raise SourceError(f"source directory {root} does not exist or is not a directory")
    out = []
    for dirpath, _dirs, names in os.walk(root, followlinks=True):
        for n in names:
            p = Path(dirpath) / n
            rel = p.relative_to(root).as_posix()
            st = p.stat()
            sums = checksum_of(p) if checksum_of else {}
            version = f"sha256:{sums['sha256']}" if "sha256" in sums else f"mtime:{st.st_mtime_ns}"
            out.append(SourceFile(rel, st.st_size, _opener(p), sums, version))
    return out


def _opener(p: Path) -> Callable[[], RangeReader]:
    return lambda: LocalReader(p)


def hf_cache_root() -> Path:
    if os.environ.get(ENV_HF_HUB_CACHE):
        return Path(os.environ[ENV_HF_HUB_CACHE])
    home = os.environ.get(ENV_HF_HOME) or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def hf_snapshot(repo_id: str, revision: str | None = None, cache: Path | None = None) -> tuple[Path, str]:
    """The snapshot directory of `repo_id` at `revision` (branch, tag or commit) in a Hugging Face cache."""
    repo = (cache or hf_cache_root()) / ("models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    commit = rev if _HEX40.match(rev) else None
    ref = repo / "refs" / rev
    if commit is None and ref.is_file():
        commit = ref.read_text().strip()
    if commit is None or not (repo / "snapshots" / commit).is_dir():
        raise SourceError(
            f"hf://{repo_id} at revision {rev!r} is not in the Hugging Face cache {repo.parent};"
            " download it there first (huggingface-cli download) or mount a populated cache"
        )
    return repo / "snapshots" / commit, commit


def _blob_checksum(p: Path) -> dict[str, str]:
    """LFS blobs in the cache are named by their SHA-256: a checksum the source vouches for."""
    name = os.path.basename(os.path.realpath(p))
    return {"sha256": name} if _HEX64.match(name) else {}


def _list_hf(uri: str, revision: str | None) -> tuple[list[SourceFile], str]:
    snapshot, commit = hf_snapshot(uri[len("hf://") :].strip("/"), revision)
    return _list_dir(snapshot, _blob_checksum), commit


def _list_s3(uri: str, concurrency: int) -> list[SourceFile]:
    from . import s3

    bucket, prefix = s3.split_uri(uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    out = []
    for o in s3.list_objects(bucket, prefix):
        rel = o.key[len(prefix) :]
        if not rel or rel.endswith("/"):
            continue
        sums = {"md5": o.etag} if _MD5.match(o.etag) else {}  # multipart ETags are not an MD5
        opener = _s3_opener(bucket, o.key, o.size, concurrency)
        out.append(SourceFile(rel, o.size, opener, sums, f"etag:{o.etag}"))
    if not out:
        raise SourceError(f"no objects under {uri}; check the bucket, prefix and AWS_ENDPOINT_URL")
    return out


def _s3_opener(bucket: str, key: str, size: int, concurrency: int) -> Callable[[], RangeReader]:
    from .s3 import S3Reader

    return lambda: S3Reader(bucket, key, size, max_connections=max(10, concurrency))
