"""Bind mounts through the mount(2) and umount2(2) system calls (no `mount` binary needed in the image), and
whether a path is a mount point, read from /proc/self/mountinfo."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
UMOUNT_NOFOLLOW = 8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, flags: int) -> None:
    _check(_libc.mount(source.encode(), target.encode(), None, flags, None), f"mount {source} on {target}")


def bind_mount(source: str, target: str, *, read_only: bool) -> None:
    """Bind `source` onto `target`; read-only takes a second call (a bind mount ignores MS_RDONLY at first).
    Not recursive: nothing mounted below `source` is carried into the pod."""
    _mount(source, target, MS_BIND)
    if read_only:
        try:
            _mount(source, target, MS_BIND | MS_REMOUNT | MS_RDONLY)
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


def mount_point(path: str, mountinfo: str = "/proc/self/mountinfo") -> MountPoint | None:
    """The topmost mount at exactly `path`, or None when nothing is mounted there."""
    found = None
    with open(mountinfo) as lines:
        for line in lines:
            fields = line.split(" ")
            if _unescape(fields[4]) == path:
                found = MountPoint(path, "ro" in fields[5].split(","))
    return found
