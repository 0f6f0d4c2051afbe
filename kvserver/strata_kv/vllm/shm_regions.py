"""vLLM's primary-tier files in /dev/shm, and who removes the ones an engine killed while starting left behind.

A region is in use while a process maps it or holds it open, or holds a lock on it: Strata's CPU offloading worker
locks its region (`hold_region`) from the moment it maps it. Processes whose mappings cannot be read are not counted:
/dev/shm is sticky, so a sweep removes only files of its own user, whose processes it can read (root on a bare host
is the exception; the lock still protects Strata's own engines there).

Stdlib only: `strata_kv.vllm.cpu_offload` calls it at every engine start, and it is tested without vLLM.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
REGION_NAME = re.compile(r"^vllm_offload_.+\.mmap$")


def region_path(engine_id: str, shm_dir: Path = SHM_DIR) -> Path:
    """Where vLLM's SharedOffloadRegion keeps an engine's primary tier."""
    return shm_dir / f"vllm_offload_{engine_id}.mmap"


def hold_region(path: Path | str) -> int:
    """A shared lock on a region, held through the returned descriptor (close it to let go): marks it in use."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def region_is_locked(path: Path) -> bool:
    """Whether some process holds `hold_region`'s lock (or the file is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True  # gone already: nothing to remove
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _mapped_paths() -> set[str]:
    """Every file a process this one can inspect maps or holds open, as /proc shows them."""
    seen: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(FileNotFoundError, PermissionError):  # ended while we looked / not ours to read
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    parts = line.split(None, 5)
                    if len(parts) == 6:
                        seen.add(parts[5].strip().removesuffix(" (deleted)"))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    seen.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return seen


def remove_orphaned_regions(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Remove primary-tier files that no process maps, holds open or locks (an engine killed while starting)."""
    candidates = [p for p in shm_dir.iterdir() if REGION_NAME.match(p.name)] if shm_dir.is_dir() else []
    if not candidates:
        return []
    in_use = _mapped_paths()
    removed = []
    for path in candidates:
        if str(path) in in_use or region_is_locked(path):
            continue
        with contextlib.suppress(FileNotFoundError, PermissionError):
            size = path.stat().st_size
            path.unlink()
            removed.append(path)
            log.warning("Strata CPU offload: removed %s (%d bytes), left by an engine that is gone", path, size)
    return removed
