"""Walking and copying a cache tree without ever following a link.

A compile cache is plain files in plain directories. The engine writes it, and a store on a shared volume is
writable by whoever can mount it, so a link planted in either must not send a capture or a restore elsewhere:
every directory is opened with O_NOFOLLOW relative to its parent's descriptor (`strata_loader.paths`), every entry
is lstat'ed, and a link, device, socket or FIFO refuses the whole operation with its path. Names are never cleaned.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..paths import OPEN_DIR, DestDir, open_subdir, safe_relative_path

COPY_BLOCK = 1 << 20


class UnsafeTreeError(RuntimeError):
    """The tree holds something a compile cache never does (a link, a device), or a path that escapes it."""


def is_scratch(name: str) -> bool:
    """Files a writer has not finished: torch's `write_atomic` temp files (`.<pid>.<tid>.tmp`), lock files, and
    this module's own temp files. Never captured; their final names appear by rename when complete."""
    return name.endswith((".tmp", ".lock")) or ".strata-tmp-" in name


@dataclass(frozen=True)
class TreeFile:
    path: str
    """Relative to the tree's root, '/'-separated, clean (`safe_relative_path`)."""
    size: int
    mtime_ns: int


def walk(root: Path) -> list[TreeFile]:
    """Every regular file under `root` (scratch files left out), sorted by path; a missing root is empty.
    `UnsafeTreeError` names the first link or odd entry. `root` itself may be a link: its path is the caller's."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        return sorted(_walk(fd, root, ""), key=lambda f: f.path)
    finally:
        os.close(fd)


def _walk(fd: int, root: Path, prefix: str) -> Iterator[TreeFile]:
    for name in os.listdir(fd):
        rel = f"{prefix}{name}"
        try:
            safe_relative_path(rel)
        except ValueError as e:
            raise UnsafeTreeError(f"{root / rel}: {e}") from None
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:  # removed since the listing (a writer's temp file)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeTreeError(f"{root / rel} is a symlink; a compile cache holds only files and directories")
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = open_subdir(fd, name)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeTreeError(f"{root / rel} was replaced by a link or a file while being read") from None
                raise
            if sub is None:
                continue
            try:
                yield from _walk(sub, root, rel + "/")
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            if not is_scratch(name):
                yield TreeFile(rel, st.st_size, st.st_mtime_ns)
        else:
            raise UnsafeTreeError(f"{root / rel} is not a regular file or a directory (mode {oct(st.st_mode)})")


def open_file(tree: DestDir, path: str) -> int:
    """A descriptor on the regular file `path` under `tree`, reached without following any link."""
    try:
        fd = tree.open(path, os.O_RDONLY)
    except ValueError as e:  # UnsafePathError: a link on the way, or a path that is not clean
        raise UnsafeTreeError(str(e)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeTreeError(f"{tree.root / path} is not a regular file")
    return fd


def copy_file(src: DestDir, dst: DestDir, src_path: str, dst_path: str, limit: int) -> tuple[int, str]:
    """Copy `src_path` to a fresh `dst_path` (refused if anything is there); returns (bytes, sha256 of them).
    Reads at most `limit` + 1 bytes, so a file that grew is noticed, not copied without end."""
    fd_in = open_file(src, src_path)
    try:
        fd_out = dst.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        digest = hashlib.sha256()
        done = 0
        try:
            while done <= limit:
                block = os.read(fd_in, min(COPY_BLOCK, limit + 1 - done))
                if not block:
                    break
                digest.update(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(fd_out, view) :]
                done += len(block)
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
    return done, digest.hexdigest()


def remove_tree(path: Path) -> None:
    """Remove the directory `path` and everything in it, never following a link inside it (a link is unlinked,
    not entered). Missing is fine."""
    try:
        fd = os.open(path, OPEN_DIR)
    except FileNotFoundError:
        return
    try:
        _empty(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def _empty(fd: int) -> None:
    for name in os.listdir(fd):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            sub = open_subdir(fd, name)
            if sub is not None:
                try:
                    _empty(sub)
                finally:
                    os.close(sub)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(name, dir_fd=fd)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
