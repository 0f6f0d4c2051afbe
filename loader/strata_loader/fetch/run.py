"""`strata-loader fetch`: copy a model into DEST in parallel, resumably, verified, and mark it complete last.

Each file is written under a `.strata-partial` name; a small progress file beside it records how far the bytes
are known to be contiguous, so a restarted Job continues there. A finished file is fsynced, verified, and
renamed into place; the manifest comes after every file, so nothing half-done ever looks done.

Every file in DEST is reached through `paths.DestDir`: relative paths are checked again (defence in depth: the
catalog already refused unsafe ones) and no symlink inside DEST is ever followed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from ..capacity import CapacityReport, CapacityRequest
from ..contract import MANIFEST_NAME, PARTIAL_SUFFIX, FetchRequest, FetchResult, VerifyMode, manifest_digest
from ..core.concurrency import finish
from ..core.manifest import (
    VERIFIABLE,
    Manifest,
    ManifestFile,
    damage,
    hash_file,
    manifest_checksums,
    read_manifest,
    remove_manifest,
    same_manifest,
    write_manifest,
)
from ..core.sources import RangeReader, SourceFile
from ..paths import DestDir
from .catalog import list_source
from .eviction import measure, node_budget
from .progress import Progress

PROGRESS_SUFFIX = PARTIAL_SUFFIX + ".progress"
CHECKPOINT_BLOCKS = 4
"""The resume point is recorded every few blocks: little lost work, few small writes."""


class FetchError(RuntimeError):
    """A fetch that cannot complete; the message says what failed and what to do."""


def fetch(req: FetchRequest, progress_mode: str | None = None, capacity: CapacityRequest | None = None) -> FetchResult:
    """`capacity`: the node path's budget (NodeLocal copies under a NodeCachePolicy); see `eviction`."""
    t0 = time.monotonic()
    files, revision = list_source(req)
    dest = Path(req.dest)
    dest.mkdir(parents=True, exist_ok=True)
    room = _Room(capacity)
    with room:
        run = _Run(req, files, revision, t0, progress_mode, room)
        if req.peers:
            result = _fetch_with_peers(run)
        else:
            with DestDir(dest) as tree:
                result = _fetch_into(tree, run)
    return result.model_copy(update={"capacity": room.report(dest)}) if capacity else result


class _Room:
    """Where a fetch makes sure its bytes fit: a plain free-space check, or the node budget (which may evict
    other copies and holds a reservation until the fetch ends)."""

    def __init__(self, capacity: CapacityRequest | None) -> None:
        self.capacity = capacity
        self._stack = contextlib.ExitStack()
        self._report: CapacityReport | None = None

    def __enter__(self) -> _Room:
        self._stack.__enter__()
        return self

    def __exit__(self, *exc: object) -> bool | None:
        return self._stack.__exit__(*exc)  # type: ignore[arg-type]

    def make(self, dest: Path, needed: int) -> None:
        if self.capacity is None:
            _check_space(dest, needed)
            return
        self._report = self._stack.enter_context(node_budget(self.capacity, dest, needed))

    def report(self, dest: Path) -> CapacityReport | None:
        """After the fetch: its report, or (a copy that was complete already) the usage measured now."""
        if self._report is None and self.capacity is not None:
            return measure(self.capacity)
        return self._report


@dataclass(frozen=True)
class _Run:
    """One fetch as `fetch` gathered it: the request, the source's files and revision, when it began, how its
    progress shows, and where its bytes must fit."""

    req: FetchRequest
    files: list[SourceFile]
    revision: str | None
    t0: float
    progress_mode: str | None
    room: _Room


def _fetch_with_peers(run: _Run) -> FetchResult:
    """Files the peers hold come from them; bytes from a peer are always hashed against the checksums the
    origin and the peers' manifests agree on, whatever `verify` says (see `peer.source`)."""
    req, revision = run.req, run.revision
    from ..peer.server import read_token
    from ..peer.source import PeerSet, with_peers

    assert req.peer_token_file is not None and req.peer_manifest_sha256 is not None  # the validator insists
    token = read_token(req.peer_token_file)
    peers = PeerSet.discover(req.peers, token, req.source, revision, req.peer_manifest_sha256)
    if not peers.peers:
        print("strata-loader fetch: no peer holds this copy; reading the source", file=sys.stderr, flush=True)
    try:
        with DestDir(Path(req.dest)) as tree:
            checked = replace(
                run, req=req.model_copy(update={"verify": VerifyMode.CHECKSUMS}), files=with_peers(run.files, peers)
            )
            result = _fetch_into(tree, checked, proven=peers.manifest)
    finally:
        peers.close()
    return result.model_copy(update={"bytes_from_peers": peers.bytes_from_peers})


def _fetch_into(tree: DestDir, run: _Run, proven: bytes | None = None) -> FetchResult:
    """`proven`: the manifest the peers proved they hold; written as it is when this copy's says the same, so
    every node's copy has the first copy's manifest byte for byte, and can serve as a peer in turn."""
    req, files, revision, t0 = run.req, run.files, run.revision, run.t0
    dest = tree.root
    wanted = [(f.relpath, f.size) for f in files]
    old = read_manifest(dest)
    damaged: dict[str, str] = {}
    if old is not None and old.same_copy(req.source, revision, wanted, [f.version for f in files]):
        damaged = _damaged(tree, old, checksums=req.verify is VerifyMode.CHECKSUMS)
        if not damaged:
            return _result(req, revision, old, dest, t0, resumed=old.bytes)
        for path, what in damaged.items():
            print(f"strata-loader fetch: {dest / path}: {what}; fetching it again", file=sys.stderr, flush=True)
    remove_manifest(dest)
    known = (
        {f.path: f.version for f in old.files if f.path not in damaged}
        if old is not None and old.source == req.source
        else {}
    )

    states = [_FileState(f, tree, req.verify, req.block_size, known.get(f.relpath)) for f in files]
    remaining = sum(s.remaining for s in states)
    run.room.make(dest, remaining)
    progress = Progress(sum(f.size for f in files), len(files), run.progress_mode)
    progress.add(sum(f.size for f in files) - remaining)
    try:
        _copy_all(states, tree, req, progress)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise FetchError(
                f"no space left on the volume of {dest} ({e.strerror}) after {progress.done_bytes} of"
                f" {progress.total_bytes} bytes; enlarge the volume and re-run (the copy resumes)"
            ) from None
        raise
    finally:
        progress.close()
    if req.shard:
        from ..tensor.shard import shard_directory

        tree.dir_fd(req.shard.output_subdir, create=True)  # refuses a link planted where the parts go
        shard_directory(dest, dest / req.shard.output_subdir, req.shard.tensor_parallel_size, req.shard.max_part_bytes)
    for d in {s.src.relpath.rpartition("/")[0] for s in states}:
        tree.fsync_dir(d)
    manifest = Manifest(
        source=req.source,
        revision=revision,
        bytes=sum(f.size for f in files),
        files=[
            ManifestFile(path=s.src.relpath, size=s.src.size, version=s.src.version, checksums=s.checksums)
            for s in states
        ],
    )
    write_manifest(dest, same_manifest(manifest, proven))
    for s in states:  # the manifest now vouches for every file: the per-file markers are done
        tree.unlink(s.marker)
    return _result(req, revision, manifest, dest, t0, resumed=sum(s.resumed for s in states))


def _damaged(tree: DestDir, m: Manifest, checksums: bool) -> dict[str, str]:
    """The files of a complete copy that DEST no longer holds as the manifest recorded them: the manifest is
    trusted only after every file is confirmed present with its size (and, with checksums, its content)."""
    return {f.path: what for f in m.files if (what := damage(tree, f, checksums)) is not None}


def _result(req: FetchRequest, revision: str | None, m: Manifest, dest: Path, t0: float, resumed: int) -> FetchResult:
    path = dest / MANIFEST_NAME
    return FetchResult(
        source=req.source,
        revision=revision,
        bytes=m.bytes,
        files=len(m.files),
        seconds=round(time.monotonic() - t0, 3),
        bytes_resumed=resumed,
        manifest_path=str(path),
        manifest_sha256=manifest_digest(path.read_bytes()),
        checksums=manifest_checksums(m),
    )


def _check_space(dest: Path, needed: int) -> None:
    st = os.statvfs(dest)
    free = st.f_bavail * st.f_frsize
    if needed > free:
        raise FetchError(f"{dest} has {free} bytes free but the copy needs {needed} more; enlarge the volume")


class _FileState:
    """One destination file: what is already there, the contiguous watermark, and completion."""

    def __init__(
        self, src: SourceFile, tree: DestDir, verify: VerifyMode, block_size: int, manifest_version: str | None
    ) -> None:
        self.src, self.tree, self.verify = src, tree, verify
        self.checkpoint_every = CHECKPOINT_BLOCKS * block_size
        self.final = src.relpath  # relative to DEST, like the two names beside it
        self.partial = self.final + PARTIAL_SUFFIX
        self.marker = self.final + PROGRESS_SUFFIX
        self.checksums = dict(src.checksums)
        self.lock = threading.Lock()
        self.ready: dict[int, int] = {}  # finished chunks past the watermark: offset -> length
        self.finished = 0
        self.start = 0
        self.complete = False
        marker = _read_marker(tree, self.marker)
        same_source = marker.get("version") == src.version
        partial_size = tree.regular_size(self.partial)
        if tree.regular_size(self.final) == src.size and (
            manifest_version == src.version or (same_source and marker.get("complete"))
        ):
            self.complete = True  # renamed into place by an earlier run from the same source version
            self.start = src.size
        elif partial_size is not None and same_source:
            self.start = min(int(str(marker.get("contiguous_bytes", 0))), partial_size, src.size)
        self.resumed = self.start
        self.watermark = self.start
        self.checkpointed = self.start

    @property
    def remaining(self) -> int:
        return self.src.size - self.start


def _read_marker(tree: DestDir, marker: str) -> dict[str, object]:
    if tree.regular_size(marker) is None:
        return {}
    try:
        with open(tree.open(marker, os.O_RDONLY), "rb") as f:
            data = json.loads(f.read())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_marker(s: _FileState, **fields: object) -> None:
    tmp = s.marker + ".tmp"
    with open(s.tree.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
        f.write(json.dumps({"version": s.src.version, **fields}))
    s.tree.replace(tmp, s.marker)


def _copy_all(states: list[_FileState], tree: DestDir, req: FetchRequest, progress: Progress) -> None:
    nbuf = max(1, min(req.memory_limit // req.block_size, 4 * req.concurrency))
    buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    for _ in range(nbuf):
        buffers.put(bytearray(req.block_size))
    slots = threading.Semaphore(nbuf)  # submission waits for a buffer: memory stays bounded
    with ThreadPoolExecutor(req.concurrency, thread_name_prefix="strata-fetch") as ex:
        futures: list[Future[None]] = []
        for s in states:
            if s.complete:
                if s.verify is VerifyMode.CHECKSUMS:
                    futures.append(ex.submit(_verify_file, s, s.final))
                progress.file_done()
                continue
            flags = os.O_WRONLY | os.O_CREAT | (0 if s.start else os.O_TRUNC)
            fd = tree.open(s.partial, flags)
            bs = req.block_size
            chunks = [(o, min(bs, s.src.size - o)) for o in range(s.start, s.src.size, bs)]
            if not chunks:
                futures.append(ex.submit(_complete, s, fd, progress))
                continue
            reader = s.src.open()
            for off, n in chunks:
                while not slots.acquire(timeout=0.5):
                    _raise_first_error(futures)
                futures.append(ex.submit(_copy_chunk, s, reader, fd, off, n, buffers, slots, progress, len(chunks)))
        finish(futures)


def _raise_first_error(futures: list[Future[None]]) -> None:
    for f in futures:
        if f.done() and f.exception() is not None:
            finish(futures)


def _copy_chunk(
    s: _FileState,
    reader: RangeReader,
    fd: int,
    off: int,
    n: int,
    buffers: queue.SimpleQueue[bytearray],
    slots: threading.Semaphore,
    progress: Progress,
    nchunks: int,
) -> None:
    buf = buffers.get()
    try:
        mv = memoryview(buf)[:n]
        reader.read_into(off, mv)
        done = 0
        while done < n:
            done += os.pwrite(fd, mv[done:], off + done)
    finally:
        buffers.put(buf)
        slots.release()
    progress.add(n)
    with s.lock:
        s.finished += 1
        s.ready[off] = n
        last = s.finished == nchunks
        _advance(s)
    if last:
        reader.close()
        _complete(s, fd, progress)


def _advance(s: _FileState) -> None:
    """Move the contiguous watermark and, every so often, record it for a later resume."""
    while s.watermark in s.ready:
        s.watermark += s.ready.pop(s.watermark)
    if s.watermark - s.checkpointed >= s.checkpoint_every:
        _write_marker(s, contiguous_bytes=s.watermark)
        s.checkpointed = s.watermark


def _complete(s: _FileState, fd: int, progress: Progress) -> None:
    try:
        os.fsync(fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size != s.src.size:
        raise FetchError(f"{s.src.relpath}: copied {size} bytes but the source has {s.src.size}")
    if s.verify is VerifyMode.CHECKSUMS:
        _verify_file(s, s.partial)
    _write_marker(s, complete=True)  # before the rename: a whole file is always vouched for
    s.tree.replace(s.partial, s.final)
    progress.file_done()


def _verify_file(s: _FileState, path: str) -> None:
    """Hash what landed on disk; compare with what the source vouches for (HF LFS SHA-256 or git blob id, S3
    MD5 ETag) and, from peers, the first copy's SHA-256."""
    algos = ["sha256", *sorted(a for a in s.src.checksums if a in VERIFIABLE and a != "sha256")]
    with open(s.tree.open(path, os.O_RDONLY), "rb", buffering=0) as f:
        digests = hash_file(f, algos)
    for algo, got in digests.items():
        want = s.src.checksums.get(algo)
        if want and got != want:
            s.tree.unlink(path)
            raise FetchError(
                f"{s.src.relpath}: {algo} {got} does not match the source's {want}; the copy was removed,"
                " re-run to fetch it again"
            )
        s.checksums[algo] = got
