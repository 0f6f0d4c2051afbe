"""The lock that keeps a node copy from being evicted while it is read: a shared `flock` on the copy's directory.

Readers (the tensor API, through `hold_copies`) and eviction (`fetch.eviction`, which asks for the same lock
exclusively and without waiting) are two products; the lock is their one agreement, so it lives here, below both.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..contract import MANIFEST_NAME
from ..paths import OPEN_DIR


@contextlib.contextmanager
def hold_copy(path: str | os.PathLike[str]) -> Iterator[None]:
    """Keep a node copy from being evicted while it is read: a shared lock on its directory (many readers may
    hold it; an eviction asks for it exclusively and skips the copy when it cannot have it at once)."""
    fd = os.open(path, OPEN_DIR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


COPY_DEPTH = 3
"""How far above a file its copy's manifest may be: the copy itself, one subdirectory (original/, a model's
subfolder) or the sharded parts' directory below it."""


def hold_copies(files: Iterable[str | os.PathLike[str]]) -> contextlib.ExitStack:
    """Shared locks (`hold_copy`) on every Strata copy the files belong to, held until `.close()`; files outside a
    copy are read as they are. Taking a lock never fails a read: a copy that cannot be opened is not held."""
    stack = contextlib.ExitStack()
    held: set[Path] = set()
    try:
        for f in files:
            copy = _copy_of(Path(f))
            if copy is not None and copy not in held:
                held.add(copy)
                with contextlib.suppress(OSError):
                    stack.enter_context(hold_copy(copy))
    except BaseException:
        stack.close()
        raise
    return stack


def _copy_of(path: Path) -> Path | None:
    for parent in list(path.parents)[:COPY_DEPTH]:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.stat(parent / MANIFEST_NAME, follow_symlinks=False).st_mode):
                return parent
    return None
