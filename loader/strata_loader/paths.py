"""The one rule for relative paths: what an S3 key, a directory entry, a glob or a manifest entry may look like
before it is joined onto DEST; and `DestDir`, which applies it on disk.

A fetch turns names chosen by whoever filled the source into files under DEST. A name with `..`, a leading
`/` or `//`, a `.` segment, a backslash or a NUL either escapes DEST or means something else on another
filesystem, so it is refused, never "cleaned": a cleaned name could silently alias another file. A clean name
can still escape through a symlink planted inside DEST (by an earlier pod, a user, a shared volume), so the
writer reaches every file one directory at a time with O_NOFOLLOW, openat-style, and refuses links.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from pathlib import Path


class UnsafePathError(ValueError):
    """A relative path that could land outside the directory it is joined to."""


def path_problem(path: str) -> str | None:
    """Why `path` is not a clean relative POSIX path, or None when it is one.

    Clean means: one or more non-empty segments joined by single `/`, none of them `.` or `..`, and no NUL or
    backslash anywhere. Such a path is its own `normpath` and, joined onto any directory, stays under it as
    long as nothing inside that directory is a symlink (the writer checks that separately).
    """
    if not path:
        return "is empty"
    if "\x00" in path:
        return "contains a NUL byte"
    if "\\" in path:
        return "contains a backslash"
    if path.startswith("/"):
        return "is absolute"
    segments = path.split("/")
    if "" in segments:
        return "has an empty segment ('//' or a trailing '/')"
    if ".." in segments:
        return "has a '..' segment"
    if "." in segments:
        return "has a '.' segment"
    return None


def safe_relative_path(path: str) -> str:
    """`path` unchanged when it is clean (see `path_problem`); otherwise `UnsafePathError` naming it."""
    problem = path_problem(path)
    if problem is not None:
        raise UnsafePathError(f"{path!r} {problem}")
    return path


def is_within(path: str, root: str) -> bool:
    """Whether the absolute, already-resolved `path` is `root` or below it (component-wise, not by prefix:
    `/data2` is not within `/data`)."""
    return os.path.commonpath([path, root]) == root


OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""A directory entry opened as a directory and never through a link."""


def open_subdir(parent: int, name: str, *, create: bool = False) -> int | None:
    """`name` in the directory `parent`, opened with `OPEN_DIR`, made first when it is missing and `create`.

    None: missing and not made, or removed again twice while being made. A link or a non-directory there raises
    `OSError` (ELOOP, ENOTDIR): what that means (refuse the fetch, skip the copy) is the caller's to say."""
    for _ in range(2):
        try:
            return os.open(name, OPEN_DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            with contextlib.suppress(FileExistsError):  # made meanwhile, or a dangling link the next open refuses
                os.mkdir(name, 0o755, dir_fd=parent)
    return None


class DestDir:
    """DEST, opened once; files below it are reached through directory descriptors opened one component at a
    time without following symlinks (`openat` with O_NOFOLLOW), so no link inside DEST, planted before the run
    or swapped in during it, can send a read or a write outside. A link where a directory or a file we open
    should be is refused with its name; a rename onto a name replaces a link there, never follows it. DEST
    itself may be a symlink: its path is the caller's choice.

    Thread-safe; directory descriptors are cached per relative directory (a model has only a few)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {"": os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)}

    def __enter__(self) -> DestDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def dir_fd(self, reldir: str, create: bool = False) -> int | None:
        """Descriptor of DEST/`reldir` ('' is DEST), creating missing directories when `create`; None when it
        is missing and not created. Raises `UnsafePathError` when a component is a symlink or not a dir."""
        if reldir:
            safe_relative_path(reldir)
        with self._lock:
            fd: int | None = self._fds[""]
            done = ""
            for name in reldir.split("/") if reldir else []:
                done = f"{done}/{name}" if done else name
                if done in self._fds:
                    fd = self._fds[done]
                    continue
                assert fd is not None
                fd = self._open_child(fd, name, done, create)
                if fd is None:
                    return None
                self._fds[done] = fd
            return fd

    def _open_child(self, parent: int, name: str, rel: str, create: bool) -> int | None:
        try:
            fd = open_subdir(parent, name, create=create)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._refusal(rel, parent, name, "a directory") from None
            raise
        if fd is None and create:
            raise FileNotFoundError(errno.ENOENT, "directory removed while being created", str(self.root / rel))
        return fd

    def _refusal(self, rel: str, parent: int, name: str, wanted: str) -> UnsafePathError:
        try:
            is_link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        except OSError:
            is_link = False
        what = "a symlink" if is_link else f"not {wanted}"
        return UnsafePathError(
            f"{self.root / rel} is {what}; strata-loader never writes through links or odd entries inside DEST:"
            " remove it and re-run"
        )

    def _locate(self, relpath: str, create: bool = False) -> tuple[int | None, str]:
        parent, _, name = safe_relative_path(relpath).rpartition("/")
        return self.dir_fd(parent, create), name

    def open(self, relpath: str, flags: int, mode: int = 0o644) -> int:
        """`os.open` of DEST/`relpath` without following a link at any level; creates missing parent
        directories when `flags` has O_CREAT."""
        parent, name = self._locate(relpath, create=bool(flags & os.O_CREAT))
        if parent is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(self.root / relpath))
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise self._refusal(relpath, parent, name, "a file") from None
            if e.filename is None:
                e.filename = str(self.root / relpath)
            raise

    def lstat(self, relpath: str) -> os.stat_result | None:
        """What is at DEST/`relpath` itself (a link is not followed), or None when nothing is."""
        parent, name = self._locate(relpath)
        if parent is None:
            return None
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def regular_size(self, relpath: str) -> int | None:
        """The size of DEST/`relpath` when it is a regular file (not a link), else None."""
        st = self.lstat(relpath)
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None

    def replace(self, src: str, dst: str) -> None:
        """Atomic rename within DEST; a link at `dst` is replaced, never followed."""
        sp, sn = self._locate(src)
        dp, dn = self._locate(dst, create=True)
        if sp is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(self.root / src))
        os.replace(sn, dn, src_dir_fd=sp, dst_dir_fd=dp)

    def unlink(self, relpath: str) -> None:
        """Remove DEST/`relpath` if it is there (a link is removed itself)."""
        parent, name = self._locate(relpath)
        if parent is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent)

    def fsync_dir(self, reldir: str) -> None:
        fd = self.dir_fd(reldir)
        if fd is not None:
            os.fsync(fd)
