"""The image around the layers: a config and a manifest per platform, and an index over them, as canonical JSON
(sorted keys, no spaces), so equal inputs give equal digests.

A model's bytes are the same on every CPU, but a runtime pulls only a manifest whose platform matches its node
(containerd reads it from the config when no index names it), so one manifest per platform shares every layer
and the index lets amd64 and arm64 nodes mount the same reference.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import vocabulary
from .layers import Layer, PackError

DEFAULT_PLATFORMS = ("linux/amd64", "linux/arm64")


@dataclass(frozen=True)
class Blob:
    """A blob held in memory (configs, manifests, the index): small JSON documents."""

    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return f"sha256:{hashlib.sha256(self.data).hexdigest()}"

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data), **extra}


@dataclass(frozen=True)
class PackedLayer:
    layer: Layer
    digest: str
    size: int

    def descriptor(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mediaType": vocabulary.MEDIA_TYPE_LAYER, "digest": self.digest, "size": self.size}
        if annotations := self.layer.annotations():
            d["annotations"] = annotations
        return d


@dataclass(frozen=True)
class PackedImage:
    """Everything a push sends: the layers (streamed from the files), then configs and manifests, then the index."""

    layers: list[PackedLayer]
    configs: list[Blob]
    manifests: list[Blob]
    index: Blob
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """What a reference pins (`repo@sha256:...`): the index's digest."""
        return self.index.digest

    @property
    def layer_bytes(self) -> int:
        return sum(p.size for p in self.layers)


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def parse_platform(text: str) -> dict[str, str]:
    """`os/arch[/variant]` as an OCI platform object."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise PackError(f"platform {text!r}: expected os/arch or os/arch/variant, e.g. linux/amd64")
    platform = {"os": parts[0], "architecture": parts[1]}
    if len(parts) == 3:
        platform["variant"] = parts[2]
    return platform


def hash_layers(layers: Sequence[Layer], concurrency: int = 4) -> list[PackedLayer]:
    """Each layer's digest (a full read of its files; threads overlap the reads, hashlib releases the GIL)."""
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        digests = list(pool.map(Layer.digest, layers))
    return [PackedLayer(layer=layer, digest=d, size=layer.size) for layer, d in zip(layers, digests, strict=True)]


def build_image(
    layers: Sequence[PackedLayer],
    *,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    annotations: Mapping[str, str] | None = None,
    created: str | None = None,
) -> PackedImage:
    """Config, manifest and index documents for hashed layers. `created` (RFC 3339) is left out unless given: a
    build time would make every pack a new digest."""
    if not platforms:
        raise PackError("at least one platform is needed")
    notes = dict(annotations or {})
    if created:
        notes[vocabulary.CREATED] = created
    diff_ids = [p.digest for p in layers]  # uncompressed: a layer's digest is its diff ID
    configs, manifests, entries = [], [], []
    for text in dict.fromkeys(platforms):
        platform = parse_platform(text)
        config: dict[str, Any] = {**platform, "config": {}, "rootfs": {"type": "layers", "diff_ids": diff_ids}}
        if created:
            config["created"] = created
        config_blob = Blob(vocabulary.MEDIA_TYPE_CONFIG, canonical_json(config))
        manifest: dict[str, Any] = {
            "schemaVersion": 2,
            "mediaType": vocabulary.MEDIA_TYPE_MANIFEST,
            "config": config_blob.descriptor(),
            "layers": [p.descriptor() for p in layers],
        }
        if notes:
            manifest["annotations"] = notes
        manifest_blob = Blob(vocabulary.MEDIA_TYPE_MANIFEST, canonical_json(manifest))
        configs.append(config_blob)
        manifests.append(manifest_blob)
        entries.append(manifest_blob.descriptor(platform=platform))
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": vocabulary.MEDIA_TYPE_INDEX, "manifests": entries}
    if notes:
        index["annotations"] = notes
    return PackedImage(
        layers=list(layers),
        configs=configs,
        manifests=manifests,
        index=Blob(vocabulary.MEDIA_TYPE_INDEX, canonical_json(index)),
        annotations=notes,
    )
