"""`strata-loader pack`: a model directory as an OCI image that containerd mounts as a Kubernetes image volume,
and its push to a registry.

The image holds the model's files under one directory (`prefix`), each large file in a layer of its own, the
small ones together in the last layer; digests are reproducible (fixed owners, modes and times; canonical JSON),
so packing the same files again gives the same reference and a push sends only the blobs a registry lacks.
Layers are plain OCI image layers, not ModelPack artifact layers: containerd mounts only images today.
"""

from __future__ import annotations

from pathlib import Path

from ..contract import MANIFEST_NAME, PARTIAL_SUFFIX
from . import vocabulary
from .image import DEFAULT_PLATFORMS, PackedImage, build_image, hash_layers
from .layers import DEFAULT_LAYER_THRESHOLD, ModelFile, PackError, model_files, plan_layers
from .push import PushResult, Reference, RegistryClient, RegistryError, push_image

DEFAULT_PREFIX = "models"
"""Where the files sit in the image: `<mountPath>/models/config.json` in a pod that mounts it whole."""

__all__ = [
    "DEFAULT_PREFIX",
    "PackError",
    "PackedImage",
    "PushResult",
    "Reference",
    "RegistryClient",
    "RegistryError",
    "pack",
    "push_image",
]


def pack(
    source: Path,
    *,
    prefix: str = DEFAULT_PREFIX,
    threshold: int = DEFAULT_LAYER_THRESHOLD,
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS,
    annotations: dict[str, str] | None = None,
    created: str | None = None,
    concurrency: int = 4,
) -> PackedImage:
    """Plan and hash the image of `source` (reads every file once; writes nothing).

    A directory `strata-loader fetch` completed is packed as its manifest lists it (sizes checked; the source
    URI and revision become the image's `source` and `revision` annotations); any other directory as it is.
    """
    notes: dict[str, str] = {}
    files = _verified_copy(source, notes) if (source / MANIFEST_NAME).exists() else model_files(source)
    partial = [f.path for f in files if f.path.endswith(PARTIAL_SUFFIX)]
    if partial:
        raise PackError(f"{source}: {partial[0]} is a partial download; finish the fetch before packing")
    layers = plan_layers(files, prefix=prefix, threshold=threshold)
    return build_image(
        hash_layers(layers, concurrency),
        platforms=platforms,
        annotations={**notes, **(annotations or {})},
        created=created,
    )


def _verified_copy(source: Path, notes: dict[str, str]) -> list[ModelFile]:
    from ..core.manifest import load_manifest

    manifest = load_manifest(source)
    found = {f.path: f for f in model_files(source, skip=(MANIFEST_NAME,))}
    files = []
    for entry in manifest.files:
        f = found.get(entry.path)
        if f is None or f.size != entry.size:
            what = "is missing" if f is None else f"has {f.size} bytes, the manifest says {entry.size}"
            raise PackError(f"{source / entry.path} {what}; re-run fetch to repair the copy before packing")
        files.append(f)
    notes[vocabulary.SOURCE] = manifest.source
    if manifest.revision:
        notes[vocabulary.REVISION] = manifest.revision
    return sorted(files, key=lambda f: f.path)
