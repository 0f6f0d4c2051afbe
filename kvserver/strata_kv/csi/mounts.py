"""Bind mounts and small tmpfs mounts through the mount(2) and umount2(2) system calls (no `mount` binary needed
in the image), and the mount table, read from /proc/self/mountinfo.

Every mount and unmount names its directories by descriptor (`/proc/self/fd/N`, see fspath.py), opened without
following links: the kernel mounts exactly there, never where a link points."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

from .fspath import fd_path, open_beneath, same_directory

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
LOCKED_DOWN = MS_NOSUID | MS_NODEV | MS_NOEXEC
"""A socket directory needs none of set-uid files, device nodes or executables: a pod that may write there (the
server) can plant none of them for the tier's other pods."""
MNT_DETACH = 2
"""An unmount through a descriptor must detach: the descriptor itself holds the mount (EBUSY otherwise); the
mount leaves the table at once and is freed when the descriptor closes."""

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, flags: int, fstype: str | None = None, data: str | None = None) -> None:
    _check(
        _libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags, data and data.encode()),
        f"mount {source} on {target}",
    )


def mount_tmpfs(target: int, *, size: int, inodes: int, mode: int, gid: int) -> None:
    """A tmpfs of at most `size` bytes and `inodes` inodes (its root directory included) on the directory
    `target` (a descriptor), its root owned by root:`gid` with `mode`, locked down like the bind mounts."""
    _mount(
        "strata-kv",
        fd_path(target),
        LOCKED_DOWN,
        "tmpfs",
        f"size={size},nr_inodes={inodes},mode={mode:o},uid=0,gid={gid}",
    )


def bind_mount(source: int, parent: int, name: str, *, read_only: bool) -> None:
    """Bind the directory `source` onto `name` in `parent` (descriptors) with nosuid, nodev, noexec (and
    read-only when asked); those take a second call, since a new bind mount ignores every flag but MS_BIND, on
    the new mount's root, opened again (the first descriptor names the directory below it). Not recursive:
    nothing mounted below `source` is carried into the pod."""
    target = open_beneath(parent, name)
    try:
        _mount(fd_path(source), fd_path(target), MS_BIND)
    finally:
        os.close(target)
    mounted = open_beneath(parent, name)
    try:
        if not same_directory(mounted, source):
            raise OSError(f"{name}: the bind mount is not where it was made; refusing to go on")
        _mount(fd_path(source), fd_path(mounted), MS_BIND | MS_REMOUNT | LOCKED_DOWN | (MS_RDONLY if read_only else 0))
    except OSError:
        unmount(mounted)
        raise
    finally:
        os.close(mounted)


def unmount(target: int) -> None:
    """Detach the mount whose root the descriptor `target` holds."""
    _check(_libc.umount2(fd_path(target).encode(), MNT_DETACH), f"unmount {fd_path(target)}")


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
    device: str = ""
    """`major:minor` of the mounted file system: every bind mount of one tmpfs shares it."""


def mount_table(mountinfo: str = "/proc/self/mountinfo") -> list[MountPoint]:
    """Every mount this process sees, in the order they were stacked."""
    table = []
    with open(mountinfo) as lines:
        for line in lines:
            fields = line.split(" ")
            options = frozenset(fields[5].split(","))
            table.append(MountPoint(_unescape(fields[4]), "ro" in options, options, fields[2]))
    return table


def mount_point(path: str, mountinfo: str = "/proc/self/mountinfo") -> MountPoint | None:
    """The topmost mount at exactly `path`, or None when nothing is mounted there."""
    found = None
    for mount in mount_table(mountinfo):
        if mount.path == path:
            found = mount
    return found
