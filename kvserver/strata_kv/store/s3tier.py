"""S3 tier through boto3: the same block files as the filesystem tier, one object per chunk.

Credentials come only from boto3's usual chain (AWS_* environment, web identity, shared files).
Blocking calls: run them in worker threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..config import L2S3Config, NamespaceConfig
from .blockfile import CorruptBlock, ForeignBlock, KeyMismatch, decode_block, encode_trailer, locate

log = logging.getLogger(__name__)


class S3Tier:
    name = "s3"
    read_failure: type[Exception] = Exception  # boto3 raises errors of its own
    rescan_interval = 0.0  # the bucket holds no index of ours to rebuild

    def __init__(self, cfg: L2S3Config, namespace: NamespaceConfig, rank: int = 0) -> None:
        import boto3
        from botocore.config import Config

        self.cfg = cfg
        self.namespace_dir = namespace.directory_name
        self.rank = rank
        self._client: Any = boto3.client(
            "s3",
            endpoint_url=cfg.endpoint_url,
            region_name=cfg.region,
            config=Config(
                max_pool_connections=cfg.max_pool_connections,
                retries={"max_attempts": 3},
                s3={"addressing_style": cfg.addressing_style},
            ),
        )
        self.corrupt_removed = 0
        self.write_errors = 0
        self.on_change: Callable[[bytes, bool], None] | None = None

    def holds(self, key: bytes) -> bool:
        """True without asking the bucket: Strata never evicts it, so a key L1 lets go (after write-behind) is
        taken to be there. A bucket lifecycle rule deleting objects is not seen (no BlockRemoved for those)."""
        return True

    def object_key(self, key: bytes) -> str:
        rel = locate(key, self.rank).relpath(self.namespace_dir)
        prefix = self.cfg.prefix.strip("/")
        return f"{prefix}/{rel}" if prefix else rel

    def prepare(self) -> None:
        """Fail fast with a readable error when the bucket is unreachable (used by readiness)."""
        self._client.head_bucket(Bucket=self.cfg.bucket)

    def put(self, key: bytes, value: bytes) -> None:
        body = bytes(value) + encode_trailer(key, value)
        try:
            self._client.put_object(Bucket=self.cfg.bucket, Key=self.object_key(key), Body=body)
        except Exception:
            self.write_errors += 1
            raise
        if self.on_change is not None:
            self.on_change(key, True)

    def get(self, key: bytes) -> bytes | None:
        from botocore.exceptions import ClientError

        name = self.object_key(key)
        try:
            resp = self._client.get_object(Bucket=self.cfg.bucket, Key=name)
            blob = resp["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        try:
            _key, value = decode_block(blob, expected_key=key)
        except (KeyMismatch, ForeignBlock):
            return None
        except CorruptBlock as e:
            log.warning("removing corrupt S3 block s3://%s/%s: %s", self.cfg.bucket, name, e)
            self.corrupt_removed += 1
            self.delete(key)
            return None
        return value

    def contains(self, key: bytes, pin_seconds: float = 0.0) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.cfg.bucket, Key=self.object_key(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise

    def delete(self, key: bytes) -> bool:
        if not self.contains(key):
            return False
        self._client.delete_object(Bucket=self.cfg.bucket, Key=self.object_key(key))
        if self.on_change is not None:
            self.on_change(key, False)
        return True

    def rescan(self) -> None:
        pass

    def block_keys(self) -> None:
        """The bucket keeps no index of ours to list."""
        return None

    def stats(self) -> dict[str, int]:
        return {"corrupt_removed": self.corrupt_removed, "write_errors": self.write_errors}
