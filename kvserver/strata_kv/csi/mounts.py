"""Bind mounts through the mount(2) and umount2(2) system calls (no `mount` binary needed in the image), and
whether a path is a mount point, read from /proc/self/mountinfo."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
LOCKED_DOWN = MS_NOSUID | MS_NODEV | MS_NOEXEC
"""A socket directory needs none of set-uid files, device nodes or executables: a pod that may write there (the
server) can plant none of them for the tier's other pods."""
UMOUNT_NOFOLLOW = 8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, flags: int) -> None:
    _check(_libc.mount(source.encode(), target.encode(), None, flags, None), f"mount {source} on {target}")


def bind_mount(source: str, target: str, *, read_only: bool) -> None:
    """Bind `source` onto `target` with nosuid, nodev, noexec (and read-only when asked); those take a second
    call, since a new bind mount ignores every flag but MS_BIND. Not recursive: nothing mounted below `source`
    is carried into the pod."""
    _mount(source, target, MS_BIND)
    try:
        _mount(source, target, MS_BIND | MS_REMOUNT | LOCKED_DOWN | (MS_RDONLY if read_only else 0))
    except OSError:
        unmount(target)
        raise


def unmount(target: str) -> None:
    _check(_libc.umount2(target.encode(), UMOUNT_NOFOLLOW), f"unmount {target}")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class MountPoint:
    path: str
    read_only: bool
    options: frozenset[str] = frozenset()
    """The mount's per-mount options (`ro`/`rw`, `nosuid`, `nodev`, `noexec`, ...)."""


def mount_point(path: str, mountinfo: str = "/proc/self/mountinfo") -> MountPoint | None:
    """The topmost mount at exactly `path`, or None when nothing is mounted there."""
    found = None
    with open(mountinfo) as lines:
        for line in lines:
            fields = line.split(" ")
            if _unescape(fields[4]) == path:
                options = frozenset(fields[5].split(","))
                found = MountPoint(path, "ro" in options, options)
    return found
