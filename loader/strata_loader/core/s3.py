"""S3 access: one pooled, thread-safe boto3 client; ranged GETs read straight into caller buffers.

Endpoint and credentials come from the usual AWS variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...),
which is
what the operator injects from Secret refs. Dropped or throttled connections are retried with backoff, then
reported with what failed.
"""

from __future__ import annotations

import functools
import http.client
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.exceptions
import urllib3.exceptions
from botocore.config import Config

from . import settings

_TRANSIENT = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ResponseStreamingError,
    urllib3.exceptions.HTTPError,  # raised by the raw body stream we read into buffers
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
)
_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
}


class S3Error(RuntimeError):
    """An S3 failure after retries, with the bucket/key and what to check."""


def split_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} has no bucket")
    return bucket, key


def client(max_connections: int = 64) -> Any:
    """A client sized for `max_connections` concurrent requests (boto3 clients are thread-safe), for the
    endpoint and credentials the environment names now."""
    env = tuple(os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"))
    return _client(max_connections, env)


@functools.lru_cache(maxsize=16)
def _client(max_connections: int, env: tuple[str | None, ...]) -> Any:
    cfg = Config(
        max_pool_connections=max_connections,
        retries={"total_max_attempts": 1},  # retries are ours (also cover body reads), one backoff policy
        connect_timeout=10,
        read_timeout=60,
        tcp_keepalive=True,
        s3={"addressing_style": "path"},
    )
    return boto3.session.Session().client("s3", config=cfg)


def with_retries(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call `fn`, retrying dropped connections and throttling with jittered exponential backoff."""
    retries = settings.current().s3_retries  # attempts, with jittered backoff (0.1 s doubling, 8 s cap)
    for attempt in range(retries):
        try:
            return fn(*args, **kwargs)
        except botocore.exceptions.ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"{what}: no such object") from None
            if code in ("NoSuchBucket",):
                raise FileNotFoundError(f"{what}: no such bucket") from None
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise S3Error(f"{what}: access denied ({code}); check AWS_ACCESS_KEY_ID/SECRET") from None
            if code not in _THROTTLE_CODES:
                raise S3Error(f"{what}: {code or e}") from None
            if attempt == retries - 1:
                raise S3Error(
                    f"{what}: {code} after {retries} attempts; the server is throttling or failing:"
                    " lower the concurrency or retry later"
                ) from None
        except botocore.exceptions.NoCredentialsError:
            raise S3Error(
                f"{what}: no AWS credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the ModelCache"
                " secretRef) or give the pod a role"
            ) from None
        except _TRANSIENT as e:
            if attempt == retries - 1:
                raise S3Error(
                    f"{what}: {type(e).__name__} after {retries} attempts ({e}); check AWS_ENDPOINT_URL and the network"
                ) from None
        time.sleep(min(8.0, 0.1 * 2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str


def list_objects(bucket: str, prefix: str) -> list[ObjectInfo]:
    """Every object under `prefix`, following pagination."""
    c = client()
    out: list[ObjectInfo] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kwargs["ContinuationToken"] = token
        page = with_retries(f"s3://{bucket}/{prefix}", c.list_objects_v2, **kwargs)
        for o in page.get("Contents", []):
            out.append(ObjectInfo(o["Key"], int(o["Size"]), str(o.get("ETag", "")).strip('"')))
        if not page.get("IsTruncated"):
            return out
        token = page["NextContinuationToken"]


class S3Reader:
    """Ranged GETs on one object; the response body is read into the caller's buffer without a bytes copy."""

    def __init__(self, bucket: str, key: str, size: int, max_connections: int = 64) -> None:
        self.bucket, self.key, self.size = bucket, key, size
        self.name = f"s3://{bucket}/{key}"
        self._client = client(max_connections)

    @classmethod
    def from_uri(cls, uri: str, max_connections: int = 64) -> S3Reader:
        bucket, key = split_uri(uri)
        head = with_retries(uri, client(max_connections).head_object, Bucket=bucket, Key=key)
        return cls(bucket, key, int(head["ContentLength"]), max_connections)

    def read_into(self, offset: int, buf: memoryview) -> None:
        if not len(buf):
            return
        if offset + len(buf) > self.size:
            raise ValueError(f"{self.name}: range {offset}+{len(buf)} is past the end ({self.size} bytes)")
        with_retries(self.name, self._get_range, offset, buf)

    def _get_range(self, offset: int, buf: memoryview) -> None:
        end = offset + len(buf) - 1
        resp = self._client.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={offset}-{end}")
        body = resp["Body"]
        raw = getattr(body, "_raw_stream", None)
        done = 0
        try:
            while done < len(buf):
                if raw is not None and hasattr(raw, "readinto"):
                    n = raw.readinto(buf[done:])
                else:
                    chunk = body.read(len(buf) - done)
                    n = len(chunk)
                    buf[done : done + n] = chunk
                if not n:
                    raise botocore.exceptions.IncompleteReadError(actual_bytes=done, expected_bytes=len(buf))
                done += n
        finally:
            body.close()

    def close(self) -> None:
        pass
