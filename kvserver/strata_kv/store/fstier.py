"""L2 on a (shared) filesystem: vLLM's offloading layout, atomic writes, checksums, capacity watermarks.

Blocking I/O: callers run these methods in worker threads. Many writers on many nodes are safe
because every write goes to a unique temp file and is renamed into place (rename is atomic on POSIX
filesystems and NFS), and a reader verifies the checksum of what it opened. The in-memory index
only serves capacity accounting; lookups always go to the file, so chunks other servers wrote are
seen at once.

Sharing the root with vLLM's own `fs` tier (`vllm/v1/kv_offload/tiering/fs`): a vLLM-tier key names the namespace
directory vLLM uses for its model and layout (`blockfile.locate`), so the server reads and writes exactly the
files that tier does. What each side reads of the other's:
- vLLM reads `block_size` bytes from offset 0 and ignores the rest, so our value + key + trailer is its block.
- We serve vLLM's raw file (no trailer, no checksum) whole, to a key in vLLM's form only. vLLM writes a temp file
  and renames it, so a visible `.bin` is complete; a file that changes size while we read it is a miss.
- Neither overwrites the other: vLLM skips a block file that exists, and so do we for keys in vLLM's form (the
  block of one hash is the same bytes whoever computed it).
- config.json is vLLM's: it writes `<namespace>/config.json` when its tier starts, if absent, and never reads it.
  The server writes one only for its configured namespace; for a namespace it learns from a key it cannot rebuild
  vLLM's fields, and a missing one costs vLLM nothing.
- Capacity: the watermarks cover every namespace directory under the root, vLLM's files included (found by the
  scan at start, the periodic rescan, and an on-demand rescan when the index runs dry over the high watermark).
  A file we evict after vLLM's lookup and before its load is a failed load for vLLM, which recomputes those
  blocks (`kv_load_failure_policy: recompute`, what the operator renders); the request does not fail.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from ..config import L2FsConfig, NamespaceConfig
from .blockfile import (
    TRAILER_SIZE,
    VLLM_RANK_DIR,
    BlockLocation,
    CorruptBlock,
    ForeignBlock,
    KeyMismatch,
    decode_trailer,
    encode_trailer,
    locate,
    vllm_tier_key_of,
)

log = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"
STALE_TMP_SECONDS = 600.0


class L2WriteError(OSError):
    """Writing a block failed (disk full, permissions...): the chunk stays a miss in L2."""


class FsTier:
    name = "fs"
    read_failure: type[Exception] = OSError
    """One namespace's block files under `root_dir`, with an LRU-ordered index for eviction."""

    def __init__(self, cfg: L2FsConfig, namespace: NamespaceConfig, max_value_size: int = 0) -> None:
        """`max_value_size`: the largest vLLM block file served (the server's `limits.max_value_size`; 0: any)."""
        self.cfg = cfg
        self.max_value_size = max_value_size
        self.root = Path(cfg.root_dir)
        self.namespace = namespace
        self.namespace_dir = namespace.directory_name
        self._index: OrderedDict[str, int] = OrderedDict()  # relpath -> file size, oldest first
        self._pins: dict[str, float] = {}  # relpath -> monotonic time until which eviction skips it
        self._lock = threading.Lock()
        self._tmp_tag = f"{socket.gethostname()}-{os.getpid()}"
        self.used = 0
        self.corrupt_removed = 0
        self.foreign_skipped = 0
        self.foreign_served = 0
        self.namespaces_refused = 0
        self._namespaces: set[str] = set()  # rank directories of vLLM namespaces under the root
        self._last_scan = float("-inf")
        self.evictions = 0
        self.write_errors = 0
        self.on_change: Callable[[bytes, bool], None] | None = None

    # -- paths ------------------------------------------------------------------------------------
    def location(self, key: bytes) -> BlockLocation:
        return locate(key, self.cfg.rank, self.cfg.max_ranks, self.cfg.max_kv_groups)

    def relpath(self, key: bytes) -> str:
        return self.location(key).relpath(self.namespace_dir)

    def _is_block_dir(self, name: str) -> bool:
        """A top-level directory of block files: our namespace's rank directories, or any vLLM namespace's."""
        return name.startswith(f"{self.namespace_dir}_r") or VLLM_RANK_DIR.match(name) is not None

    def path(self, key: bytes) -> Path:
        return self.root / self.relpath(key)

    # -- start-up ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the namespace's directories and its config.json (where vLLM keeps it: in `<base>/`, the
        blocks in `<base>_r<rank>/`), then rebuild the index from disk."""
        base = self.root / self.namespace_dir
        base.mkdir(parents=True, exist_ok=True)
        (self.root / f"{self.namespace_dir}_r{self.cfg.rank}").mkdir(parents=True, exist_ok=True)
        cfg_path = base / "config.json"
        if not cfg_path.exists():
            config = self.namespace.run_config()
            self._atomic_write_bytes(cfg_path, json.dumps(config, indent=2, sort_keys=True).encode())
        self.rebuild_index(startup=True)

    def rebuild_index(self, startup: bool = False) -> None:
        """Scan every block file of this namespace (all ranks) and of every vLLM namespace under the root (a vLLM
        `fs` tier's own files included), oldest first; drop stale temp files.

        At start-up our own temp files are leftovers of a killed process; later they are writes in flight
        (vLLM's, `<h>.bin_<n>.tmp`, are removed only once stale).
        """
        entries: list[tuple[float, str, int]] = []
        now = time.time()
        self._last_scan = time.monotonic()
        namespaces: set[str] = set()
        for top in self.root.iterdir() if self.root.exists() else ():
            if not self._is_block_dir(top.name) or not top.is_dir():
                continue
            if VLLM_RANK_DIR.match(top.name):
                namespaces.add(top.name)
            for dirpath, _dirs, files in os.walk(top):
                for name in files:
                    full = os.path.join(dirpath, name)
                    try:
                        st = os.stat(full)
                    except FileNotFoundError:
                        continue
                    if name.endswith(TMP_SUFFIX):
                        if (startup and self._orphaned(name)) or now - st.st_mtime > STALE_TMP_SECONDS:
                            self._unlink(full)
                        continue
                    if name.endswith(".bin"):
                        rel = os.path.relpath(full, self.root)
                        entries.append((max(st.st_atime, st.st_mtime), rel, st.st_size))
        entries.sort()
        with self._lock:
            self._index = OrderedDict((rel, size) for _t, rel, size in entries)
            self.used = sum(size for _t, _rel, size in entries)
            self._namespaces |= namespaces
        log.info("L2 fs index rebuilt: %d block files, %d bytes under %s", len(entries), self.used, self.root)

    def _orphaned(self, tmp_name: str) -> bool:
        """A temp file from this host whose writer process is gone (killed mid-write)."""
        try:
            tag = tmp_name[tmp_name.index(".bin.") + 5 : -len(TMP_SUFFIX)]  # .<hash>.bin.<tag>.tmp
            host, pid_text, _rand = tag.rsplit("-", 2)
            pid = int(pid_text)
        except (IndexError, ValueError):
            return False
        if host != socket.gethostname():
            return False  # another node may be writing it right now
        if pid == os.getpid():
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    # -- reads ------------------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        """The value, or None on a miss. A corrupt file is removed and reported as a miss; vLLM's own block file
        (no trailer) is the value for a key in vLLM's form, and a miss for any other."""
        loc = self.location(key)
        rel = loc.relpath(self.namespace_dir)
        full = self.root / rel
        try:
            with open(full, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - TRAILER_SIZE))
                try:
                    trailer = decode_trailer(f.read(TRAILER_SIZE), size)  # lengths checked before allocating
                except ForeignBlock:
                    if not loc.vllm or (self.max_value_size and size > self.max_value_size):
                        raise
                    f.seek(0)
                    value = f.read(size)
                    if len(value) != size or f.read(1):  # renamed over or cut while we read: not one block
                        return None
                    self.foreign_served += 1
                    self._touch(rel, size)
                    return value
                if trailer.key_len != len(key):
                    raise KeyMismatch("block file holds a key of another length")
                f.seek(0)
                value = f.read(trailer.value_len)
                stored_key = f.read(trailer.key_len)
                if len(value) != trailer.value_len or len(stored_key) != trailer.key_len:
                    raise CorruptBlock(f"block file shrank while being read ({full})")
            if stored_key != key:
                raise KeyMismatch("block file holds a different key")
            if zlib.crc32(value, zlib.crc32(key)) != trailer.crc:
                raise CorruptBlock(f"block checksum mismatch ({full})")
        except (FileNotFoundError, NotADirectoryError, KeyMismatch):
            return None
        except ForeignBlock:  # vLLM's own block, asked for by a key not in vLLM's form: not ours to serve or remove
            self.foreign_skipped += 1
            return None
        except CorruptBlock as e:
            log.warning("removing corrupt L2 block %s: %s", full, e)
            self.corrupt_removed += 1
            self._remove(rel)
            return None
        self._touch(rel, size)
        return value

    def contains(self, key: bytes, pin_seconds: float = 0.0) -> bool:
        """Present on disk. Counts as a use, and `pin_seconds` keeps the watermark off it for that long
        (LMCache GETs right after EXISTS and hangs on a miss)."""
        rel = self.relpath(key)
        try:
            size = os.stat(self.root / rel).st_size
        except (FileNotFoundError, NotADirectoryError):
            return False
        self._touch(rel, size)
        if pin_seconds > 0:
            with self._lock:
                self._pins[rel] = time.monotonic() + pin_seconds
                if len(self._pins) > 100_000:  # drop expired pins now and then
                    now = time.monotonic()
                    self._pins = {r: t for r, t in self._pins.items() if t > now}
        return True

    # -- writes -----------------------------------------------------------------------------------
    def put(self, key: bytes, value: bytes) -> None:
        """Write atomically; on a full disk, evict to the low watermark and retry once.

        A key in vLLM's form whose block file exists is not written again (vLLM's `fs` tier does the same: one
        hash, one block), and one that would need a vLLM namespace directory past `max_namespaces` is refused."""
        loc = self.location(key)
        rel = loc.relpath(self.namespace_dir)
        if loc.namespace is not None and not self._namespace_allowed(loc.top(self.namespace_dir)):
            return
        if loc.vllm:
            try:
                size = os.stat(self.root / rel).st_size
            except (FileNotFoundError, NotADirectoryError):
                pass
            else:
                self._touch(rel, size, stored=True)  # what vLLM's tier or an earlier SET wrote: held, announce it
                return
        trailer = encode_trailer(key, value)
        self.make_room(len(value) + len(trailer))
        try:
            self._write(rel, value, trailer)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                self.write_errors += 1
                raise L2WriteError(e.errno, f"L2 write of {rel} failed: {e.strerror}") from e
            self.evict_to(self._capacity() * self.cfg.low_watermark)
            try:
                self._write(rel, value, trailer)
            except OSError as e2:
                self.write_errors += 1
                raise L2WriteError(
                    e2.errno,
                    f"L2 filesystem {self.root} is full ({e2.strerror}); raise its size or lower l2.fs"
                    ".capacity / high_watermark",
                ) from e2
        with self._lock:
            old = self._index.pop(rel, 0)
            self._index[rel] = len(value) + len(trailer)
            self.used += len(value) + len(trailer) - old
            self._tell(rel, True)

    def _namespace_allowed(self, top: str) -> bool:
        """A vLLM namespace's rank directory may be used: known, already on disk, or still within the limit."""
        with self._lock:
            if top in self._namespaces:
                return True
        if (self.root / top).is_dir() or len(self._namespaces) < self.cfg.max_namespaces:
            with self._lock:
                self._namespaces.add(top)
            return True
        self.namespaces_refused += 1
        if self.namespaces_refused == 1 or self.namespaces_refused % 1000 == 0:
            log.warning(
                "L2 fs: not storing chunks of vLLM namespace %s: %d namespace directories already under %s "
                "(l2.fs.max_namespaces); %d writes refused so far",
                top,
                len(self._namespaces),
                self.root,
                self.namespaces_refused,
            )
        return False

    def _write(self, rel: str, value: bytes, trailer: bytes) -> None:
        final = self.root / rel
        tmp = final.parent / f".{final.name}.{self._tmp_tag}-{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
        for attempt in range(3):
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileNotFoundError:  # a DEL or eviction removed the emptied directory just now: make it again
                if attempt == 2:
                    raise
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(value)
                f.write(trailer)
                if self.cfg.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.rename(tmp, final)
        except BaseException:
            self._unlink(str(tmp))
            raise

    def _atomic_write_bytes(self, path: Path, data: bytes) -> None:
        tmp = path.parent / f".{path.name}.{self._tmp_tag}-{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
        tmp.write_bytes(data)
        os.rename(tmp, path)

    def delete(self, key: bytes) -> bool:
        return self._remove(self.relpath(key))

    def holds(self, key: bytes) -> bool:
        """In the index (written here, or seen since the last scan): what capacity eviction may remove."""
        rel = self.relpath(key)
        with self._lock:
            return rel in self._index

    @property
    def rescan_interval(self) -> float:
        return self.cfg.rescan_interval_seconds

    def rescan(self) -> None:
        self.rebuild_index()
        self.make_room(0)

    # -- capacity ---------------------------------------------------------------------------------
    def _capacity(self) -> int:
        """The effective capacity. A configured one is capped by what the filesystem can really hold for us:
        our blocks plus its free space (a capacity larger than the disk would otherwise never evict, and a
        full disk would fail every write)."""
        st = os.statvfs(self.root)
        if self.cfg.capacity:
            return min(int(self.cfg.capacity), self.used + st.f_bavail * st.f_frsize)
        return st.f_blocks * st.f_frsize

    def _fill(self) -> int:
        """Bytes counted against capacity: our index, or the filesystem's own usage when unbounded."""
        if self.cfg.capacity:
            return self.used
        st = os.statvfs(self.root)
        return (st.f_blocks - st.f_bavail) * st.f_frsize

    def make_room(self, incoming: int) -> None:
        capacity = self._capacity()
        if self._fill() + incoming > capacity * self.cfg.high_watermark:
            self.evict_to(capacity * self.cfg.low_watermark - incoming)

    def evict_to(self, target: float) -> int:
        """Remove least recently used block files until usage is at or below `target` bytes."""
        removed = 0
        skipped = 0
        rescanned = False
        while self._fill() > target:
            with self._lock:
                dry = not self._index or skipped >= len(self._index)
            if dry:
                # Over target with nothing indexed left: files we have not seen (a vLLM `fs` tier's) fill the disk.
                if rescanned or time.monotonic() - self._last_scan < self.cfg.min_rescan_seconds:
                    break
                self.rebuild_index()
                rescanned, skipped = True, 0
                continue
            with self._lock:
                if not self._index:
                    continue
                rel, size = self._index.popitem(last=False)
                if self._pins.get(rel, 0.0) > time.monotonic():  # EXISTS said yes moments ago: keep it
                    self._index[rel] = size
                    skipped += 1
                    continue
                self._pins.pop(rel, None)
                self.used -= size
                self._tell(rel, False)
            self._unlink_block(rel)
            removed += 1
            self.evictions += 1
        return removed

    def stats(self) -> dict[str, int]:
        return {
            "used_bytes": self._fill(),
            "capacity_bytes": self._capacity(),
            "files": len(self._index),
            "evictions": self.evictions,
            "corrupt_removed": self.corrupt_removed,
            "foreign_skipped": self.foreign_skipped,
            "foreign_served": self.foreign_served,
            "namespaces": len(self._namespaces),
            "namespaces_refused": self.namespaces_refused,
            "write_errors": self.write_errors,
        }

    def forget_namespace(self, namespace: str) -> None:
        """A dropped namespace's rank directories no longer count against `max_namespaces`."""
        with self._lock:
            self._namespaces = {top for top in self._namespaces if not top.startswith(f"{namespace}_r")}

    # -- helpers ----------------------------------------------------------------------------------
    def _touch(self, rel: str, size: int, stored: bool = False) -> None:
        """A use of `rel`; `stored`: a SET found it already written (told to `on_change` like a write)."""
        with self._lock:
            if rel in self._index:
                self._index.move_to_end(rel)
            else:  # written by another server: account for it from now on
                self._index[rel] = size
                self.used += size
            if stored:
                self._tell(rel, True)

    def _tell(self, rel: str, held: bool) -> None:
        """Tell `on_change` that the index gained (a write) or lost (eviction, DEL, a corrupt file) a vLLM-layout
        block. Called under `_lock`, so the listener sees the changes of one file in the index's order."""
        if self.on_change is not None and (key := vllm_tier_key_of(rel)) is not None:
            self.on_change(key, held)

    def block_keys(self) -> list[bytes]:
        """The vLLM-tier keys of the block files in the index (what KV events report this tier holds)."""
        with self._lock:
            rels = list(self._index)
        return [key for rel in rels if (key := vllm_tier_key_of(rel)) is not None]

    def _remove(self, rel: str) -> bool:
        with self._lock:
            size = self._index.pop(rel, None)
            if size is not None:
                self.used -= size
                self._tell(rel, False)
        return self._unlink_block(rel)

    def _unlink_block(self, rel: str) -> bool:
        """Remove a block file, then its directories that it left empty (`<h[3:5]>_g<group>/`, `<h[:3]>/`).

        Rank directories stay (at most `max_ranks` of them). A writer racing with the rmdir re-creates it."""
        removed = self._unlink(str(self.root / rel))
        parts = rel.split("/")
        if len(parts) == 4:  # <ns>_r<rank>/<h[:3]>/<h[3:5]>_g<group>/<h>.bin
            for depth in (3, 2):
                try:
                    os.rmdir(self.root.joinpath(*parts[:depth]))
                except OSError:  # not empty (or gone): stop climbing
                    break
        return removed

    @staticmethod
    def _unlink(path: str) -> bool:
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False
