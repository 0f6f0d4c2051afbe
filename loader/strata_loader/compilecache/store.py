"""The compile cache store: one directory per compile key, holding generations of captured caches.

    <store>/<key digest>/CURRENT                 the name of the generation readers use (replaced by rename)
    <store>/<key digest>/gen-<ns>-<hex>/manifest.json
    <store>/<key digest>/gen-<ns>-<hex>/files/vllm/...      ($VLLM_CACHE_ROOT/torch_compile_cache)
    <store>/<key digest>/gen-<ns>-<hex>/files/inductor/...  ($TORCHINDUCTOR_CACHE_DIR)
    <store>/<key digest>/.tmp-gen-<ns>-<hex>/               a capture in progress

A capture writes a whole generation under a temp name, manifest last, renames it into place and only then points
CURRENT at it: a reader sees the old generation or the new one, never half of one. The next capture or `prune`
removes generations CURRENT no longer names once they are `grace_s` old; a reader whose generation goes while it
copies starts once more with the new one. Reads and writes never follow a link (`tree`); every restored byte is
checked against the manifest's SHA-256 before it is used.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..paths import DestDir, UnsafePathError
from .follow import COMPLETION_FILES
from .key import CompileKey
from .manifest import ROOTS, CachedFile, CacheManifest, ManifestError, parse_manifest
from .tree import UnsafeTreeError, copy_file, open_file, remove_tree, walk

CURRENT = "CURRENT"
MANIFEST = "manifest.json"
FILES = "files"
TMP_PREFIX = ".tmp-"
GENERATION = re.compile(r"^gen-[0-9]+-[0-9a-f]{8}$")
DIGEST = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_GRACE_S = 600.0
"""How long a replaced generation (or an abandoned temp one) stays: longer than any restore takes."""


class CaptureError(RuntimeError):
    """A capture that was refused or failed; the store holds what it held before."""


class StoreFullError(CaptureError):
    """The capture would take the store over its byte limit."""


class CacheMiss(Exception):
    """No usable cache for this key; `reason` says why (the engine compiles as if there were no store)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class StoredCache:
    digest: str
    generation: str
    manifest: CacheManifest


@dataclass(frozen=True)
class Captured:
    digest: str
    generation: str
    files: int
    bytes: int
    unchanged: bool
    """The store already held exactly these files for this key: nothing was written."""


@dataclass(frozen=True)
class Restored:
    digest: str
    generation: str
    files: int
    bytes: int


class CompileStore:
    def __init__(self, root: Path, max_bytes: int | None = None, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.grace_s = grace_s

    # -- reading

    def current(self, digest: str) -> StoredCache:
        """The generation CURRENT names for `digest`, with its validated manifest; `CacheMiss` saying why not."""
        if not DIGEST.match(digest):
            raise CacheMiss(f"{digest!r} is not a key digest")
        try:
            store_dir = DestDir(self.root)
        except FileNotFoundError:
            raise CacheMiss(f"no cache for key {digest[:12]}") from None
        with store_dir as store:
            try:
                fd = open_file(store, f"{digest}/{CURRENT}")
            except FileNotFoundError:
                raise CacheMiss(f"no cache for key {digest[:12]}") from None
            try:
                generation = os.read(fd, 256).decode(errors="replace").strip()
            finally:
                os.close(fd)
            if not GENERATION.match(generation):
                raise CacheMiss(f"{self.root / digest / CURRENT} names {generation!r}, not a generation")
            where = self.root / digest / generation / MANIFEST
            try:
                fd = open_file(store, f"{digest}/{generation}/{MANIFEST}")
            except FileNotFoundError:
                raise CacheMiss(f"{where} is missing") from None
            try:
                data = _read_all(fd, 64 << 20)
            finally:
                os.close(fd)
        try:
            manifest = parse_manifest(data, str(where))
        except ManifestError as e:
            raise CacheMiss(str(e)) from None
        if manifest.compile_key.digest != digest:
            raise CacheMiss(f"{where} records another key (digest {manifest.compile_key.digest[:12]})")
        return StoredCache(digest, generation, manifest)

    def caches(self) -> list[StoredCache]:
        """Every key with a usable current generation, by digest."""
        found = []
        for name in sorted(_listdir(self.root)):
            if DIGEST.match(name):
                try:
                    found.append(self.current(name))
                except (CacheMiss, UnsafeTreeError):
                    continue
        return found

    def used_bytes(self) -> int:
        """Bytes of every complete generation on disk, replaced ones not yet removed included."""
        total = 0
        for digest in _listdir(self.root):
            if not DIGEST.match(digest):
                continue
            for generation in _listdir(self.root / digest):
                if GENERATION.match(generation):
                    total += self._generation_bytes(digest, generation)
        return total

    def _generation_bytes(self, digest: str, generation: str) -> int:
        try:
            with DestDir(self.root) as store:
                fd = open_file(store, f"{digest}/{generation}/{MANIFEST}")
                try:
                    return parse_manifest(_read_all(fd, 64 << 20), "").bytes
                finally:
                    os.close(fd)
        except (OSError, ManifestError, UnsafeTreeError, CacheMiss):
            pass
        try:
            return sum(f.size for f in walk(self.root / digest / generation))  # what it takes on disk anyway
        except UnsafeTreeError:
            return 0

    def miss_reason(self, key: CompileKey) -> str:
        """Why this store has nothing for `key`: the stored key closest to it and the parts that differ."""
        stored = self.caches()
        if not stored:
            return f"the store {self.root} holds no compile cache yet"
        nearest = min(stored, key=lambda s: len(key.differing_parts(s.manifest.compile_key)))
        return f"no cache for this engine's key {key.digest[:12]}; the nearest stored one {nearest.digest[:12]}: " + (
            key.mismatch(nearest.manifest.compile_key) or "is the same key"
        )

    # -- restoring

    def restore(self, key: CompileKey, targets: Mapping[str, Path]) -> Restored:
        """Copy the current cache for `key` into `targets` (root name -> directory), all or nothing: every file is
        written under a temp name and checked against the manifest, and only when all match are they renamed into
        place. `CacheMiss` with the reason otherwise; nothing is left behind then."""
        for attempt in (1, 2):
            try:
                stored = self.current(key.digest)
            except CacheMiss as e:
                if e.reason.startswith("no cache for key"):
                    raise CacheMiss(self.miss_reason(key)) from None
                raise
            missing = sorted({f.path.split("/")[0] for f in stored.manifest.files} - set(targets))
            if missing:
                raise CacheMiss(f"the cache has files for {missing} and this engine gave no directory for them")
            try:
                return self._restore(stored, targets)
            except FileNotFoundError:  # the generation was replaced and removed while being read
                if attempt == 2:
                    raise CacheMiss(f"generation {stored.generation} disappeared twice while being read") from None
        raise AssertionError("unreachable")

    def _restore(self, stored: StoredCache, targets: Mapping[str, Path]) -> Restored:
        tag = secrets.token_hex(4)
        written: list[tuple[DestDir, str, str]] = []
        dests = {name: DestDir(_made(path)) for name, path in targets.items()}
        try:
            with DestDir(self.root / stored.digest / stored.generation / FILES) as src:
                for f in stored.manifest.files:
                    root, _, rel = f.path.partition("/")
                    temp = f"{rel}.strata-tmp-{tag}"
                    written.append((dests[root], temp, rel))
                    size, sha = copy_file(src, dests[root], f.path, temp, f.size)
                    if size != f.size or sha != f.sha256:
                        raise CacheMiss(
                            f"{self.root / stored.digest / stored.generation / FILES / f.path}: {size} bytes with"
                            f" sha256 {sha[:16]}..., the manifest says {f.size} bytes with {f.sha256[:16]}...;"
                            " the cache is damaged and was not used"
                        )
            # vLLM's index of compiled graphs last: an engine never finds it without the files it names
            for dest, temp, rel in sorted(written, key=lambda w: any(p.match(w[2]) for p in COMPLETION_FILES)):
                dest.replace(temp, rel)
            written.clear()
            return Restored(stored.digest, stored.generation, len(stored.manifest.files), stored.manifest.bytes)
        except (UnsafeTreeError, UnsafePathError) as e:
            raise CacheMiss(f"{e}; the cache was not used") from None
        finally:
            for dest, temp, _ in written:
                with contextlib.suppress(OSError, ValueError):  # where it could not be made, nothing is there
                    dest.unlink(temp)
            for dest in dests.values():
                dest.close()

    # -- capturing

    def capture(self, key: CompileKey, sources: Mapping[str, Path]) -> Captured:
        """Copy the trees `sources` (root name -> directory) into a new generation for `key` and make it current.
        Refused, with nothing written, when a tree holds a link or an odd entry, when there is nothing to capture,
        or when it would take the store over `max_bytes`."""
        unknown = sorted(set(sources) - set(ROOTS))
        if unknown:
            raise CaptureError(f"unknown cache roots {unknown} (known: {ROOTS})")
        try:
            trees = {name: walk(path) for name, path in sources.items()}
        except UnsafeTreeError as e:
            raise CaptureError(f"{e}; not captured") from None
        total = sum(f.size for files in trees.values() for f in files)
        if not any(trees.values()):
            where = ", ".join(str(p) for p in sources.values())
            raise CaptureError(f"nothing to capture: no compiled files under {where}")
        self.prune()
        self._check_room(key.digest, total)
        digest = key.digest
        with DestDir(_made(self.root)) as store:
            store.dir_fd(digest, create=True)
            generation = f"gen-{time.time_ns()}-{secrets.token_hex(4)}"
            temp = f"{digest}/{TMP_PREFIX}{generation}"
            try:
                manifest = self._write_generation(store, temp, key, sources, trees)
                try:
                    previous: StoredCache | None = self.current(digest)
                except CacheMiss:
                    previous = None
                if previous is not None and previous.manifest.same_files(manifest):
                    remove_tree(self.root / temp)
                    return Captured(digest, previous.generation, len(manifest.files), manifest.bytes, True)
                store.replace(temp, f"{digest}/{generation}")
                store.fsync_dir(digest)
                pointer = f"{digest}/{CURRENT}.strata-tmp-{secrets.token_hex(4)}"
                fd = store.open(pointer, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    os.write(fd, f"{generation}\n".encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
                store.replace(pointer, f"{digest}/{CURRENT}")
                store.fsync_dir(digest)
            except BaseException:
                remove_tree(self.root / temp)
                raise
        return Captured(digest, generation, len(manifest.files), manifest.bytes, False)

    def _check_room(self, digest: str, adding: int) -> None:
        if self.max_bytes is None:
            return
        used = self.used_bytes()
        if used + adding > self.max_bytes:
            raise StoreFullError(
                f"capturing {adding} bytes would take the compile cache store {self.root} to {used + adding} bytes,"
                f" over its limit of {self.max_bytes} ({used} in use); not captured, nothing in the store changed:"
                " raise the limit or remove caches no engine uses"
            )

    def _write_generation(
        self, store: DestDir, temp: str, key: CompileKey, sources: Mapping[str, Path], trees: dict[str, list]
    ) -> CacheManifest:
        files: list[CachedFile] = []
        for name, tree in trees.items():
            if not tree:  # nothing there, maybe not even the directory
                continue
            with DestDir(sources[name]) as src:
                for f in tree:
                    size, sha = copy_file(src, store, f.path, f"{temp}/{FILES}/{name}/{f.path}", f.size)
                    if size != f.size:
                        raise CaptureError(
                            f"{sources[name] / f.path} changed while being captured ({f.size} bytes, then {size});"
                            " capture again once the engine's compile has finished"
                        )
                    files.append(CachedFile(path=f"{name}/{f.path}", size=size, sha256=sha))
        manifest = CacheManifest(
            key=dict(key.parts),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            bytes=sum(f.size for f in files),
            files=files,
        )
        fd = store.open(f"{temp}/{MANIFEST}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, manifest.to_bytes())
            os.fsync(fd)
        finally:
            os.close(fd)
        store.fsync_dir(temp)
        return manifest

    # -- cleaning up

    def prune(self, grace_s: float | None = None) -> list[Path]:
        """Remove generations no CURRENT names and abandoned temp generations, once older than `grace_s`
        (default: the store's); returns what was removed."""
        grace = self.grace_s if grace_s is None else grace_s
        removed = []
        now = time.time()
        for digest in _listdir(self.root):
            if not DIGEST.match(digest):
                continue
            try:
                keep = self.current(digest).generation
            except (CacheMiss, UnsafeTreeError):
                keep = None
            for name in _listdir(self.root / digest):
                if name == keep or not (GENERATION.match(name) or name.startswith(TMP_PREFIX)):
                    continue
                path = self.root / digest / name
                try:
                    age = now - os.stat(path, follow_symlinks=False).st_mtime
                except FileNotFoundError:
                    continue
                if age >= grace:
                    remove_tree(path)
                    removed.append(path)
        return removed


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _read_all(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        block = os.read(fd, 1 << 20)
        if not block:
            return b"".join(chunks)
        chunks.append(block)
        size += len(block)
    raise CacheMiss(f"manifest over {limit} bytes")
