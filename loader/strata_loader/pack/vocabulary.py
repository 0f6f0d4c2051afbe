"""The names an image of a model is written in: OCI's media types and annotation keys, and CNCF ModelPack's
annotation keys where they fit an image (ModelPack's own media types make an *artifact*, which containerd cannot
mount as an image volume yet; see docs/modelcache.md, "Models as OCI images")."""

from __future__ import annotations

MEDIA_TYPE_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_TYPE_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_TYPE_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_TYPE_LAYER = "application/vnd.oci.image.layer.v1.tar"
"""Uncompressed: weights hardly compress, the digest is also the diff ID, and tar bytes are reproducible where a
compressor's output may change between versions."""

# OCI pre-defined annotation keys (image-spec annotations.md).
CREATED = "org.opencontainers.image.created"
TITLE = "org.opencontainers.image.title"
SOURCE = "org.opencontainers.image.source"
REVISION = "org.opencontainers.image.revision"
VERSION = "org.opencontainers.image.version"
REF_NAME = "org.opencontainers.image.ref.name"

# CNCF ModelPack layer annotation keys (model-spec docs/annotations.md), on the layers that hold one file.
MODEL_FILEPATH = "org.cncf.model.filepath"
"""The file's path relative to the model's root (not to the image's: the image puts the model under a prefix)."""
MODEL_FILE_METADATA = "org.cncf.model.file.metadata+json"
"""JSON of the file's tar metadata: name, mode, uid, gid, size, mtime, typeflag."""
