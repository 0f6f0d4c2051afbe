"""Pushing a packed image with the OCI distribution API (the client is `strata_loader.registry`, shared with the
operator's tag resolution): the blobs the registry lacks, the manifests, then the index under the tag.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..registry import ImageReference, ReferenceError, RegistryClient, RegistryError
from .image import Blob, PackedImage, PackedLayer
from .layers import PackError

__all__ = ["PushResult", "Reference", "RegistryClient", "RegistryError", "push_image"]


@dataclass(frozen=True)
class Reference:
    """`registry/repository:tag`, as `oci://` URIs and image references write it (the registry host explicit)."""

    registry: str
    repository: str
    tag: str

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}:{self.tag}"

    @classmethod
    def parse(cls, text: str) -> Reference:
        try:
            parsed = ImageReference.parse(text)
        except ReferenceError as error:
            raise PackError(str(error)) from None
        if parsed.digest is not None:
            raise PackError(f"reference {text!r}: push to a tag; the digest is the packed image's own")
        return cls(registry=parsed.registry, repository=parsed.repository, tag=str(parsed.tag))


@dataclass
class PushResult:
    reference: str
    """`registry/repository:tag@sha256:...`: what a pod should mount, pinned to what was pushed."""
    digest: str
    uploaded: list[str] = field(default_factory=list)
    uploaded_bytes: int = 0
    present: list[str] = field(default_factory=list)
    """Blobs the registry already had (same digest): not sent again."""


def push_image(image: PackedImage, reference: Reference, client: RegistryClient) -> PushResult:
    """Send what the registry lacks: layers (streamed from the files), configs, manifests; the index last, under
    the tag, so the tag never names an image whose parts are not all there."""
    result = PushResult(reference=f"{reference}@{image.digest}", digest=image.digest)
    repository = reference.repository
    blobs: list[PackedLayer | Blob] = [*image.layers, *image.configs]
    for blob in blobs:
        digest = blob.digest
        if digest in result.uploaded or digest in result.present:
            continue
        if client.has_blob(repository, digest):
            result.present.append(digest)
            continue
        if isinstance(blob, PackedLayer):
            client.upload_blob(repository, digest, blob.size, blob.layer.chunks())
            result.uploaded_bytes += blob.size
        else:
            client.upload_blob(repository, digest, len(blob.data), [blob.data])
            result.uploaded_bytes += len(blob.data)
        result.uploaded.append(digest)
    for manifest in image.manifests:
        client.put_manifest(repository, manifest.digest, manifest.media_type, manifest.data)
    client.put_manifest(repository, reference.tag, image.index.media_type, image.index.data)
    return result
