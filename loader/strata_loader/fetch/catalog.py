"""What a fetch source holds: the list of files with sizes, checksums the source already has, and a reader for
each. Sources: local/shared filesystem paths, `pvc://` mounts, S3 prefixes, and `hf://` repositories: on the
Hugging Face Hub (or the mirror HF_ENDPOINT names), or, with HF_HUB_OFFLINE set, in a local Hugging Face cache.

Every relative path listed here obeys `paths.safe_relative_path`, and directory sources never leave their own
tree through a symlink: a source that breaks either rule is refused as a whole, whatever the globs say, because
copying it could write outside DEST or leak files the source does not own, and skipping the offending entry
would land an incomplete model that looks complete.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..contract import (
    DEFAULT_PVC_MOUNT_ROOT,
    ENV_HF_HOME,
    ENV_HF_HUB_CACHE,
    ENV_PVC_MOUNT_ROOT,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    FetchRequest,
    pvc_source,
)
from ..core.manifest import GIT_BLOB
from ..core.sources import LocalReader, RangeReader, SourceFile
from ..paths import UnsafePathError, is_within, safe_relative_path

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")


class SourceError(RuntimeError):
    """The source cannot be listed: it does not exist, is empty after filtering, or is not reachable."""


def list_source(req: FetchRequest) -> tuple[list[SourceFile], str | None]:
    """Files of the request's source after include/exclude, sorted by path, and the resolved revision."""
    kind = req.source_kind
    if kind == "s3":
        files, revision = _list_s3(req.source, req.concurrency), req.revision
    elif kind == "hf":
        files, revision = _list_hf(req.source, req.revision, req.concurrency)
    elif kind == "pvc":
        claim, sub = pvc_source(req.source) or ("", "")
        mount = Path(os.environ.get(ENV_PVC_MOUNT_ROOT, DEFAULT_PVC_MOUNT_ROOT)) / claim
        root = mount / sub
        if not is_within(os.path.realpath(root), os.path.realpath(mount)):
            raise SourceError(
                f"{req.source}: {root} resolves to {os.path.realpath(root)}, outside the claim's mount {mount};"
                " a pvc:// source is read only from its own claim"
            )
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


def _list_dir(
    root: Path, checksum_of: Callable[[Path], dict[str, str]] | None = None, fence: Path | None = None
) -> list[SourceFile]:
    """Every regular file under `root`, read through its resolved path. `fence` (default: `root`) is the tree
    symlinks may point into: the Hugging Face cache's snapshot links point into the repository's blobs."""
    if not root.is_dir():
        raise SourceError(f"source directory {root} does not exist or is not a directory")
    out = []
    for rel, real in _walk(root, os.path.realpath(fence or root)):
        st = os.stat(real)
        sums = checksum_of(Path(real)) if checksum_of else {}
        version = f"sha256:{sums['sha256']}" if "sha256" in sums else f"mtime:{st.st_mtime_ns}"
        out.append(SourceFile(rel, st.st_size, _opener(Path(real)), sums, version))
    return out


def _walk(root: Path, fence: str) -> Iterator[tuple[str, str]]:
    """(relative path, resolved path) of each regular file under `root`, without ever leaving `fence`.

    Symlinks that resolve inside `fence` are followed (to files and to directories: the copy gets what they
    point to, as plain files). One that resolves outside, dangles, or leads back into a directory being walked
    (a loop) refuses the source, and so does a name that breaks the path rule or an entry that is neither a
    file nor a directory (a FIFO would hang the copy).
    """
    top = os.path.realpath(root)
    if not is_within(top, fence):
        raise SourceError(f"source directory {root} resolves to {top}, outside {fence}")
    stack: list[tuple[str, str, frozenset[str]]] = [(top, "", frozenset({top}))]
    while stack:
        real_dir, rel_dir, ancestors = stack.pop()
        with os.scandir(real_dir) as entries:
            for e in entries:
                rel = rel_dir + e.name
                shown = os.path.join(root, rel)
                try:
                    safe_relative_path(rel)
                except UnsafePathError as err:
                    raise SourceError(f"refusing {shown}: its relative path {err}; rename it") from None
                real = os.path.realpath(e.path) if e.is_symlink() else e.path
                if not is_within(real, fence):
                    raise SourceError(
                        f"refusing {shown}: a symlink to {real}, outside the source {fence}; strata-loader never"
                        " follows links out of the source: copy the target into the source or fetch it directly"
                    )
                if os.path.isdir(real):
                    if real in ancestors:
                        raise SourceError(f"refusing {shown}: a symlink loop back to {real}; remove the link")
                    stack.append((real, rel + "/", ancestors | {real}))
                elif os.path.isfile(real):
                    yield rel, real
                elif not os.path.lexists(real):
                    raise SourceError(f"refusing {shown}: a dangling symlink to {real}; fix or remove the link")
                else:
                    raise SourceError(f"refusing {shown}: not a regular file or directory; remove it")


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
    if commit is None:
        try:  # a branch or tag names a file under refs/: it must not climb out of the repository
            ref = repo / "refs" / safe_relative_path(rev)
        except UnsafePathError as e:
            raise SourceError(f"hf://{repo_id}: revision {e}; use a branch, tag or commit hash") from None
        if ref.is_file():
            commit = ref.read_text().strip()
            if not _HEX40.match(commit):
                raise SourceError(f"{ref} holds {commit[:80]!r}, not a commit hash; repair the Hugging Face cache")
    if commit is None or not (repo / "snapshots" / commit).is_dir():
        raise SourceError(
            f"hf://{repo_id} at revision {rev!r} is not in the Hugging Face cache {repo.parent} (HF_HUB_OFFLINE is"
            " set, so the Hub is not asked); download it there first (hf download), mount a populated cache, or unset"
            " HF_HUB_OFFLINE"
        )
    return repo / "snapshots" / commit, commit


def _blob_checksum(p: Path) -> dict[str, str]:
    """Blobs in the cache are named by what vouches for them: LFS files by their SHA-256, the others by their
    git blob id."""
    name = os.path.basename(os.path.realpath(p))
    if _HEX64.match(name):
        return {"sha256": name}
    return {GIT_BLOB: name} if _HEX40.match(name) else {}


def _list_hf(uri: str, revision: str | None, concurrency: int) -> tuple[list[SourceFile], str]:
    """The Hub unless HF_HUB_OFFLINE is set (then the local cache only): one rule, and either way the revision
    comes back as the commit it named, the files' SHA-256 as the source's checksums."""
    from . import hub

    repo_id = uri[len("hf://") :].strip("/")
    if not hub.offline():
        try:
            commit, listed = hub.list_commit(repo_id, revision)
        except hub.HubError as e:
            raise SourceError(str(e)) from None
        out = []
        for f in listed:
            if f.sha256 and _HEX64.match(f.sha256):
                sums = {"sha256": f.sha256}
            else:  # outside LFS: the git blob id still vouches for the bytes
                sums = {GIT_BLOB: f.blob_id} if _HEX40.match(f.blob_id) else {}
            version = f"sha256:{f.sha256}" if "sha256" in sums else f"git:{f.blob_id}"
            out.append(SourceFile(f.path, f.size, hub.opener(repo_id, commit, f, concurrency), sums, version))
        return out, commit
    snapshot, commit = hf_snapshot(repo_id, revision)
    repo = snapshot.parent.parent  # snapshots link into ../../blobs: the whole repository is the source tree
    return _list_dir(snapshot, _blob_checksum, fence=repo), commit


def _list_s3(uri: str, concurrency: int) -> list[SourceFile]:
    from ..core import s3

    bucket, prefix = s3.split_uri(uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    out = []
    for o in s3.list_objects(bucket, prefix):
        rel = o.key[len(prefix) :]
        if not rel or rel.endswith("/"):
            continue  # a "folder" marker: nothing to write
        try:
            safe_relative_path(rel)
        except UnsafePathError as e:
            raise SourceError(
                f"refusing object {o.key!r} in s3://{bucket}: its path below the prefix {e}, so it could land"
                " outside DEST; rename the object or fetch a prefix that does not hold it"
            ) from None
        sums = {"md5": o.etag} if _MD5.match(o.etag) else {}  # multipart ETags are not an MD5
        opener = _s3_opener(bucket, o.key, o.size, concurrency)
        out.append(SourceFile(rel, o.size, opener, sums, f"etag:{o.etag}"))
    if not out:
        raise SourceError(f"no objects under {uri}; check the bucket, prefix and AWS_ENDPOINT_URL")
    return out


def _s3_opener(bucket: str, key: str, size: int, concurrency: int) -> Callable[[], RangeReader]:
    from ..core.s3 import S3Reader

    return lambda: S3Reader(bucket, key, size, max_connections=max(10, concurrency))
