"""A model directory as image layers: which files go in which layer, and each layer's tar bytes, made the same way
every time so the same files give the same digests wherever and whenever they are packed.

Every file larger than the threshold gets a layer of its own, so a new revision that changes `config.json` pushes
(and a node pulls) one small layer, not the weights again. The small files share the last layer: containerd keys
each unpacked layer by the chain of layers under it, so a change to the last one leaves every weight layer's
unpacked copy on a node in place.

A layer's tar is never written to disk: its headers come from the file list alone (owner root, mode 0644/0755,
the fixed `mtime`, PAX headers only where ustar has no room), so its size is known before a byte is read, and its
bytes are streamed from the files, to a hash when packing and to the registry when pushing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..paths import path_problem, safe_relative_path
from . import vocabulary

BLOCK = 512
READ_SIZE = 8 * 2**20
DEFAULT_LAYER_THRESHOLD = 2**20
"""Files above 1 MiB get a layer of their own: weights and large tokenizer files; the rest (configs, small
tokenizer files, READMEs) share one."""
MAX_LAYERS = 120
"""Overlay mounts stack at most ~128 layers (the kernel's limit, with room kept for the runtime's own)."""
DEFAULT_EXCLUDES = (".git/*", ".cache/huggingface/*")
"""Version control and `hf download --local-dir`'s bookkeeping are not part of the model."""


class PackError(ValueError):
    """The directory cannot be packed as asked; the message says why and what to change."""


@dataclass(frozen=True)
class ModelFile:
    path: str
    """Relative to the model's root, '/'-separated (a clean path: see strata_loader.paths)."""
    source: Path
    size: int


def model_files(root: Path, *, excludes: Sequence[str] = DEFAULT_EXCLUDES, skip: Sequence[str] = ()) -> list[ModelFile]:
    """The regular files under `root` (symlinks followed, as a Hugging Face snapshot needs), sorted by path.

    `excludes` are globs on the relative path; `skip` are exact relative paths left out (Strata's own markers).
    Anything that is neither a directory nor a regular file is refused: an image would not hold it faithfully.
    """
    if not root.is_dir():
        raise PackError(f"{root}: not a directory")
    found: list[ModelFile] = []
    visited: set[tuple[int, int]] = set()
    for directory, dirnames, filenames in os.walk(root, followlinks=True):
        here = os.stat(directory)
        if (here.st_dev, here.st_ino) in visited:
            raise PackError(f"{directory}: reached twice through symlinks (a loop?); pack a tree without one")
        visited.add((here.st_dev, here.st_ino))
        dirnames.sort()
        for name in sorted(filenames):
            source = Path(directory) / name
            relative = source.relative_to(root).as_posix()
            if relative in skip or any(fnmatch.fnmatchcase(relative, glob) for glob in excludes):
                continue
            try:
                info = source.stat()
            except OSError as e:
                raise PackError(f"{source}: {e.strerror} (a dangling symlink?)") from None
            if not stat.S_ISREG(info.st_mode):
                raise PackError(f"{source}: not a regular file; an image holds files and directories only")
            found.append(ModelFile(path=safe_relative_path(relative), source=source, size=info.st_size))
    if not found:
        raise PackError(f"{root}: no files to pack")
    return sorted(found, key=lambda f: f.path)


@dataclass(frozen=True)
class Layer:
    """One layer's recipe: its files, where they go in the image, and the tar headers that make its bytes."""

    files: tuple[ModelFile, ...]
    prefix: str
    mtime: int

    @property
    def own_file(self) -> ModelFile | None:
        """The file this layer was made for, when it holds one large file (ModelPack annotates such layers)."""
        return self.files[0] if len(self.files) == 1 else None

    def _entries(self) -> Iterator[tuple[bytes, ModelFile | None]]:
        """(header bytes, file or None for a directory) in the order the tar holds them."""
        directories: set[str] = set()
        for f in self.files:
            parent = PurePosixPath(self.prefix, f.path).parent
            directories.update(str(p) for p in (parent, *parent.parents) if str(p) != ".")
        for directory in sorted(directories):
            yield _header(directory + "/", 0, tarfile.DIRTYPE, 0o755, self.mtime), None
        for f in self.files:
            yield _header(str(PurePosixPath(self.prefix, f.path)), f.size, tarfile.REGTYPE, 0o644, self.mtime), f

    @property
    def size(self) -> int:
        """The tar's length in bytes, from the headers and file sizes alone."""
        total = 2 * BLOCK  # the end-of-archive marker
        for header, f in self._entries():
            total += len(header) + (_padded(f.size) if f else 0)
        return total

    def chunks(self) -> Iterator[bytes]:
        """The tar's bytes. A file whose size changed since it was listed is an error: the digest would lie."""
        for header, f in self._entries():
            yield header
            if f is None:
                continue
            remaining = f.size
            with open(f.source, "rb") as stream:
                while remaining:
                    chunk = stream.read(min(READ_SIZE, remaining))
                    if not chunk:
                        raise PackError(f"{f.source}: shrank while being packed (expected {f.size} bytes)")
                    remaining -= len(chunk)
                    yield chunk
                if stream.read(1):
                    raise PackError(f"{f.source}: grew while being packed (expected {f.size} bytes)")
            if pad := _padded(f.size) - f.size:
                yield bytes(pad)
        yield bytes(2 * BLOCK)

    def digest(self) -> str:
        """sha256 of the tar's bytes (one full read of the layer's files)."""
        h = hashlib.sha256()
        for chunk in self.chunks():
            h.update(chunk)
        return f"sha256:{h.hexdigest()}"

    def annotations(self) -> dict[str, str]:
        f = self.own_file
        if f is None:
            return {}
        metadata = {"name": f.path, "mode": 0o644, "uid": 0, "gid": 0, "size": f.size, "typeflag": 48}
        metadata["mtime"] = _rfc3339(self.mtime)
        return {
            vocabulary.MODEL_FILEPATH: f.path,
            vocabulary.MODEL_FILE_METADATA: json.dumps(metadata, sort_keys=True, separators=(",", ":")),
        }


def plan_layers(
    files: Sequence[ModelFile], *, prefix: str, threshold: int = DEFAULT_LAYER_THRESHOLD, mtime: int = 0
) -> list[Layer]:
    """A layer per file larger than `threshold` (in path order), then one layer for all the others."""
    if prefix and (problem := path_problem(prefix)):
        raise PackError(f"prefix {prefix!r} {problem}: name a directory inside the image, e.g. models")
    large = [f for f in files if f.size > threshold]
    small = tuple(f for f in files if f.size <= threshold)
    if len(large) + bool(small) > MAX_LAYERS:
        raise PackError(
            f"{len(large)} files are larger than the layer threshold ({threshold} bytes): an image may have at most"
            f" {MAX_LAYERS} layers here; raise --layer-threshold so fewer files get a layer of their own"
        )
    layers = [Layer(files=(f,), prefix=prefix, mtime=mtime) for f in large]
    if small:
        layers.append(Layer(files=small, prefix=prefix, mtime=mtime))
    return layers


def _header(name: str, size: int, kind: bytes, mode: int, mtime: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode, info.mtime = size, kind, mode, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _rfc3339(epoch: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
