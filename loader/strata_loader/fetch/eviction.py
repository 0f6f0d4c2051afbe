"""Making room on a node path before a copy: measure, evict least recently used copies only as needed, reserve.

`node_budget` runs around one fetch when the operator sent a `CapacityRequest`:

1. Under an exclusive `flock` on `<root>/.strata-capacity.lock` (one decision at a time per node path, across
   Jobs of every cache), it measures the filesystem with `os.statvfs` and adds the bytes other running fetches
   have reserved but not written yet.
2. If the copy fits under the high watermark (and its namespace's budget, when the policy gives one), nothing is
   evicted. Otherwise candidates go in the operator's order (least recently used first) until usage plus the copy
   is at or under the low watermark and within the budget; once the filesystem is fine, only the namespace's own
   candidates are evicted (others would not bring its budget down). When the candidates run out, the copy still
   proceeds if it fits under the high watermark and the budget, and fails with `InsufficientStorage` (numbers in
   the message) if it does not.
3. The copy's bytes are reserved in `<root>/.strata-reservations/<namespace>.<name>`, a file this process holds
   an exclusive lock on until the fetch ends: a reservation whose lock nobody holds belongs to a Job that died,
   and is dropped.

Evicting one copy is safe against what the operator could not see when it planned:
- only `<root>/<namespace>/<name>` is touched, each component opened with O_NOFOLLOW | O_DIRECTORY, so a symlink
  anywhere is refused and nothing outside the root is reached; the copy must hold a regular manifest file (a
  Strata copy, complete; a copy still being written has none and is never evicted);
- a reader that holds a shared `flock` on the copy's directory (`core.copy_lock.hold_copy`, which strata_loader's
  readers take) keeps it: the eviction asks for an exclusive lock without waiting, and skips the copy when it is held;
- with the lock held, the directory is renamed atomically into `<root>/.strata-evicting/` before its files are
  removed, so a pod that starts afterwards finds no directory (its hostPath volume has type Directory and does not
  start) instead of a half-deleted model. Leftovers of an eviction that was interrupted are removed next time.

The residual risk (docs/nodecachepolicy.md): a pod that was scheduled onto the node
after the operator planned, mounted the copy, and reads it without holding the lock (not through strata_loader)
loses the files it had not opened yet. The operator keeps that window short (the plan is made when the Job is created,
and it never offers a copy a pod on that node consumes), and the evicted copy's node label turns to `Evicted`
so no new pod is placed there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..capacity import ENV_NODE_CAPACITY, REASON_INSUFFICIENT_STORAGE, CapacityReport, CapacityRequest, EvictedCopy
from ..contract import MANIFEST_NAME
from ..paths import OPEN_DIR, open_subdir
from .eviction_messages import no_room, over_budget

LOCK_NAME = ".strata-capacity.lock"
RESERVATIONS = ".strata-reservations"
EVICTING = ".strata-evicting"


class InsufficientStorage(RuntimeError):
    """The copy does not fit under the high watermark even after evicting every candidate it could."""

    reason = REASON_INSUFFICIENT_STORAGE

    def __init__(self, message: str, report: CapacityReport) -> None:
        super().__init__(message)
        self.capacity = report


@dataclass(frozen=True)
class Usage:
    """One `os.statvfs`, in df's terms."""

    size: int
    used: int
    free: int

    @classmethod
    def measure(cls, path: Path | int) -> Usage:
        st = os.statvfs(path) if isinstance(path, Path) else os.fstatvfs(path)
        return cls(st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize)

    @property
    def capacity(self) -> int:
        """What df's Use% divides by: used plus what an unprivileged writer may still use."""
        return self.used + self.free

    def limit(self, percent: int) -> int:
        return self.capacity * percent // 100


@contextlib.contextmanager
def node_budget(req: CapacityRequest, dest: Path, needed: int) -> Iterator[CapacityReport]:
    """Make room for `needed` more bytes in `dest` (a copy under `req.root`) and hold a reservation for them.

    Yields the report; on exit it is updated with the filesystem's usage after the copy. An exception raised
    inside (the fetch failing) carries the report as `.capacity`, so what was evicted is reported either way."""
    root = Path(req.root)
    own = _own_key(root, dest)
    root_fd = os.open(root, OPEN_DIR)
    reservation: int | None = None
    report = CapacityReport(policy=req.policy, needed_bytes=needed)
    try:
        with _locked(root_fd, LOCK_NAME):
            _clear_evicting(root_fd)
            reservations = _reserved_by_others(root_fd, own)
            reserved = sum(reservations.values())
            usage = _fill(report, Usage.measure(root_fd), req)
            team = _Namespace.measure(root_fd, own, reservations, req.namespace_budget_bytes)
            report.namespace_used_bytes, report.namespace_budget_bytes = team.report()
            kept: list[str] = []
            if not (_fits(usage, reserved, needed, report.high_bytes) and team.fits(needed)):
                for key in req.candidates:
                    disk_done = _fits(usage, reserved, needed, report.low_bytes)
                    if key == own or (disk_done and not team.owns(key)):
                        continue  # only the namespace's own copies bring its budget down
                    if disk_done and team.fits(needed):
                        break
                    freed, why = evict(root_fd, key)
                    if why is not None:
                        kept.append(f"{key} ({why})")
                        continue
                    report.evicted.append(EvictedCopy(copy_key=key, bytes=freed))
                    team.freed(key, freed)
                    usage = _fill(report, Usage.measure(root_fd), req)
            if not team.fits(needed):
                raise InsufficientStorage(over_budget(req, report, team.name, team.used, team.budget, kept), report)
            if not _fits(usage, reserved, needed, report.high_bytes):
                raise InsufficientStorage(no_room(req, report, usage, reserved, kept), report)
            reservation = _reserve(root_fd, own, needed)
        yield report
    except BaseException as e:
        if not hasattr(e, "capacity"):
            e.capacity = report  # type: ignore[attr-defined]
        raise
    finally:
        if reservation is not None:
            _release(root_fd, own, reservation)
        _fill(report, Usage.measure(root_fd), req)
        os.close(root_fd)


def measure(req: CapacityRequest) -> CapacityReport:
    """The node path's usage now, nothing evicted (a copy that was already complete)."""
    report = CapacityReport(policy=req.policy)
    _fill(report, Usage.measure(Path(req.root)), req)
    return report


def _fits(usage: Usage, reserved: int, needed: int, limit: int) -> bool:
    return usage.used + reserved + needed <= limit and reserved + needed <= usage.free


def _fill(report: CapacityReport, usage: Usage, req: CapacityRequest) -> Usage:
    report.size_bytes, report.used_bytes, report.free_bytes = usage.size, usage.used, usage.free
    # minFree caps both: eviction aims as far below the tighter high limit as the low watermark is below it
    high = min(usage.limit(req.high_watermark), usage.capacity - req.min_free_bytes)
    report.high_bytes, report.low_bytes = high, min(usage.limit(req.low_watermark), high)
    return usage


@dataclass
class _Namespace:
    """The Job's namespace against its budget: its copies' allocated bytes under the root (its own copy's
    partial files included, as statvfs counts them) plus what its other running fetches reserved."""

    name: str
    used: int
    budget: int | None

    @classmethod
    def measure(cls, root_fd: int, own: str, reservations: dict[str, int], budget: int | None) -> _Namespace:
        name = own.partition("/")[0]
        if budget is None:
            return cls(name, 0, None)
        ns_fd = _subdir(root_fd, name)
        used = 0
        if ns_fd is not None:
            try:
                used = _allocated(ns_fd)
            finally:
                os.close(ns_fd)
        used += sum(b for key, b in reservations.items() if key.partition("/")[0] == name)
        return cls(name, used, budget)

    def owns(self, key: str) -> bool:
        return key.partition("/")[0] == self.name

    def fits(self, needed: int) -> bool:
        return self.budget is None or self.used + needed <= self.budget

    def freed(self, key: str, freed: int) -> None:
        if self.owns(key):
            self.used = max(0, self.used - freed)

    def report(self) -> tuple[int | None, int | None]:
        return (None, None) if self.budget is None else (self.used, self.budget)


def _own_key(root: Path, dest: Path) -> str:
    parts = dest.parts[len(root.parts) :] if dest.parts[: len(root.parts)] == root.parts else ()
    if len(parts) != 2:
        raise ValueError(
            f"DEST {dest} is not <root>/<namespace>/<name> under the node budget's root {root}: a node budget "
            f"({ENV_NODE_CAPACITY}) only applies to NodeLocal copies; unset it or fetch into the root"
        )
    return "/".join(parts)


@contextlib.contextmanager
def _locked(root_fd: int, name: str) -> Iterator[None]:
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=root_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _subdir(parent: int, name: str, *, create: bool = False) -> int | None:
    """A directory entry opened without following links; None when missing (or not a plain directory)."""
    try:
        return open_subdir(parent, name, create=create)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return None
        raise


def evict(root_fd: int, key: str) -> tuple[int, str | None]:
    """Remove the copy `<namespace>/<name>` under the root: (bytes freed, None), or (0, why it was kept)."""
    namespace, _, name = key.partition("/")
    ns_fd = _subdir(root_fd, namespace)
    if ns_fd is None:
        return 0, "not on this node"
    try:
        copy_fd = _subdir(ns_fd, name)
        if copy_fd is None:
            return 0, "not on this node (or not a plain directory)"
        try:
            try:
                st = os.stat(MANIFEST_NAME, dir_fd=copy_fd, follow_symlinks=False)
            except FileNotFoundError:
                return 0, "not a complete Strata copy (no manifest)"
            if not stat.S_ISREG(st.st_mode):
                return 0, "not a Strata copy (its manifest is not a regular file)"
            try:
                fcntl.flock(copy_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0, "in use on this node: a reader holds its lock"
            trash_fd = _subdir(root_fd, EVICTING, create=True)
            if trash_fd is None:
                return 0, f"{EVICTING} is not a plain directory"
            try:
                grave = f"{namespace}.{name}.{os.getpid()}"
                os.rename(name, grave, src_dir_fd=ns_fd, dst_dir_fd=trash_fd)
                freed = _allocated(copy_fd)
                shutil.rmtree(grave, dir_fd=trash_fd)
            finally:
                os.close(trash_fd)
            return freed, None
        finally:
            os.close(copy_fd)  # releases the lock
    finally:
        os.close(ns_fd)


def _allocated(dir_fd: int) -> int:
    """Bytes the files below a directory occupy on disk (allocated blocks, as du counts), links not followed."""
    total = 0
    for _, _, files, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(f, dir_fd=fd, follow_symlinks=False).st_blocks * 512
    return total


def _clear_evicting(root_fd: int) -> None:
    """Whatever an interrupted eviction left in the graveyard: nobody can be using it (it was renamed there
    only under the copy's exclusive lock)."""
    trash_fd = _subdir(root_fd, EVICTING)
    if trash_fd is None:
        return
    try:
        for entry in os.listdir(trash_fd):
            shutil.rmtree(entry, dir_fd=trash_fd, ignore_errors=True)
    finally:
        os.close(trash_fd)


def _reservation_name(key: str) -> str:
    return key.replace("/", ".")


def _reserve(root_fd: int, own: str, needed: int) -> int:
    """A reservation file holding `needed`, exclusively locked by this process until `_release`."""
    res_fd = _subdir(root_fd, RESERVATIONS, create=True)
    if res_fd is None:
        raise OSError(errno.ENOTDIR, f"{RESERVATIONS} under the node root is not a plain directory")
    try:
        fd = os.open(
            _reservation_name(own), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=res_fd
        )
    finally:
        os.close(res_fd)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(needed).encode(), 0)
    return fd


def _release(root_fd: int, own: str, fd: int) -> None:
    res_fd = _subdir(root_fd, RESERVATIONS)
    if res_fd is not None:
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_reservation_name(own), dir_fd=res_fd)
        finally:
            os.close(res_fd)
    os.close(fd)


def _reserved_by_others(root_fd: int, own: str) -> dict[str, int]:
    """Bytes other running fetches reserved, by `<namespace>/<name>`; a reservation nobody holds a lock on is
    dropped (its Job died).

    Counted in full even though those fetches have written part of it already: conservative, never optimistic."""
    res_fd = _subdir(root_fd, RESERVATIONS)
    if res_fd is None:
        return {}
    total: dict[str, int] = {}
    try:
        for entry in os.listdir(res_fd):
            if entry == _reservation_name(own):
                continue
            try:
                fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=res_fd)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # held: that fetch is running
                    with contextlib.suppress(ValueError):
                        # a namespace is a DNS label (no dot), so the first dot ends it
                        total[entry.replace(".", "/", 1)] = int(os.pread(fd, 32, 0) or b"0")
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=res_fd)
            finally:
                os.close(fd)
    finally:
        os.close(res_fd)
    return total
