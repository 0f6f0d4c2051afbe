"""Paths the plugin touches as root, resolved without ever following a symbolic link.

A textual check (`normpath`, a prefix) says nothing about where a path leads: a directory under the kubelet's
pods directory that is a link sends mount(2) anywhere on the node. So every path below a trusted root (the
kubelet's pods directory, the plugin's state directory) is opened with openat2(2) and `RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS` (Linux 5.6+; on an older kernel, one `O_PATH | O_NOFOLLOW` open per component), and the
plugin then mounts and unmounts through the descriptor's `/proc/self/fd/N`, which names the very directory it
opened: nothing can be swapped in between the check and the mount.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat

SYS_OPENAT2 = 437  # the same number on every architecture (added after the syscall tables were unified)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_DIRECTORY = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC  # a final link is RESOLVE_NO_SYMLINKS' (ELOOP)
_COMPONENT = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC  # a link opens as itself, which fstat then tells

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class LinkInPathError(OSError):
    """A component of a path below a trusted root is a symbolic link (or would leave the root)."""


_have_openat2: bool | None = None


def _openat2(dir_fd: int, relative: str) -> int:
    how = _OpenHow(flags=_DIRECTORY, mode=0, resolve=_RESOLVE)
    fd = _libc.syscall(SYS_OPENAT2, dir_fd, os.fsencode(relative), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), relative)
    return int(fd)


def _walk(dir_fd: int, relative: str) -> int:
    """openat2's guarantees by hand: one component at a time, none a link, none `..`."""
    fd = os.dup(dir_fd)
    try:
        for part in relative.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise OSError(errno.EXDEV, "'..' would leave the root", relative)
            following = os.open(part, _COMPONENT, dir_fd=fd)
            os.close(fd)
            fd = following
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), relative)
            if not stat.S_ISDIR(mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), relative)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(dir_fd: int, relative: str) -> int:
    """An `O_PATH` descriptor of the directory `relative` below `dir_fd`; LinkInPathError when any component is
    a link (or escapes), FileNotFoundError/NotADirectoryError as open(2) says. The caller closes it."""
    global _have_openat2
    try:
        if _have_openat2 is not False:
            try:
                return _openat2(dir_fd, relative)
            except OSError as error:
                if error.errno != errno.ENOSYS:
                    raise
                _have_openat2 = False
        return _walk(dir_fd, relative)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EXDEV):
            raise LinkInPathError(
                error.errno, f"{relative} has a symbolic link (or a way out) in it, which the plugin never follows"
            ) from None
        raise


def open_root(path: str) -> int:
    """An `O_PATH` descriptor of a trusted root the plugin was configured with (links in it are the admin's)."""
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def fd_path(fd: int) -> str:
    """What mount(2) and umount2(2) resolve to exactly the directory `fd` holds, wherever it is now."""
    return f"/proc/self/fd/{fd}"


def same_directory(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def read_only(fd: int) -> bool:
    """Whether the mount the directory `fd` lies on is read-only (the mount's flag, not the file system's)."""
    return bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)
