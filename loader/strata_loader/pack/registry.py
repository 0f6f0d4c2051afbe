"""Pushing a packed image with the OCI distribution API, spoken directly over `http.client`.

Why not a client library: the maintained Python OCI client (oras-py) uploads a blob from a file on disk, read
into memory whole; a layer here is a tar made on the fly from the model's files, tens of GB for large models. The
protocol a push needs is small: HEAD a blob (present: skip it), POST an upload and PUT the bytes with their
digest (one monolithic PUT, the body streamed with a known length), PUT the manifests, then the index under the
tag. Auth is the registry's challenge: Basic, or a Bearer token fetched from the realm it names for this
repository's pull and push scope.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import ssl
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .image import Blob, PackedImage, PackedLayer
from .layers import PackError

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(RuntimeError):
    """The registry refused a request or could not be reached; the message names the request and the answer."""


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
        rest = text.removeprefix("oci://")
        host, slash, path = rest.partition("/")
        if not slash or not ("." in host or ":" in host or host == "localhost"):
            raise PackError(f"reference {text!r}: name the registry, e.g. registry.example.com/models/name:tag")
        if "@" in path:
            raise PackError(f"reference {text!r}: push to a tag; the digest is the packed image's own")
        repository, colon, tag = path.rpartition(":") if ":" in path else (path, "", "")
        if not colon:
            raise PackError(f"reference {text!r}: name a tag, e.g. {rest}:v1")
        if not _REPOSITORY.match(repository):
            raise PackError(f"reference {text!r}: repository {repository!r} must be lowercase [a-z0-9._-] components")
        if not _TAG.match(tag):
            raise PackError(f"reference {text!r}: tag {tag!r} must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")
        return cls(registry=host, repository=repository, tag=tag)


@dataclass
class PushResult:
    reference: str
    """`registry/repository:tag@sha256:...`: what a pod should mount, pinned to what was pushed."""
    digest: str
    uploaded: list[str] = field(default_factory=list)
    uploaded_bytes: int = 0
    present: list[str] = field(default_factory=list)
    """Blobs the registry already had (same digest): not sent again."""


@dataclass(frozen=True)
class _Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


class RegistryClient:
    """One registry, one kept-alive connection, the credentials to answer its challenge with."""

    def __init__(
        self,
        registry: str,
        *,
        plain_http: bool = False,
        ca_file: Path | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.registry = registry
        self.scheme = "http" if plain_http else "https"
        self.context = None if plain_http else ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        self.credentials = (username, password) if username is not None else None
        self.timeout = timeout
        self.authorization: str | None = None
        self._connection: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the distribution API ------------------------------------------------------------------------------------
    def has_blob(self, repository: str, digest: str) -> bool:
        response = self._call("HEAD", f"/v2/{repository}/blobs/{digest}", repository)
        if response.status == 404:
            return False
        self._expect(response, (200,), "HEAD", f"blob {digest}")
        return True

    def upload_blob(self, repository: str, digest: str, size: int, chunks: Iterable[bytes]) -> None:
        started = self._call("POST", f"/v2/{repository}/blobs/uploads/", repository, headers={"Content-Length": "0"})
        self._expect(started, (202,), "POST", "a blob upload")
        location = started.headers.get("Location")
        if not location:
            raise RegistryError(f"{self.registry}: started an upload but named no Location for it")
        url = urllib.parse.urljoin(f"{self.scheme}://{self.registry}/", location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        response = self._send("PUT", url, headers, chunks)
        self._expect(response, (201,), "PUT", f"blob {digest}")

    def put_manifest(self, repository: str, reference: str, blob: Blob) -> None:
        headers = {"Content-Type": blob.media_type, "Content-Length": str(len(blob.data))}
        response = self._call("PUT", f"/v2/{repository}/manifests/{reference}", repository, headers, blob.data)
        self._expect(response, (201,), "PUT", f"manifest {reference}")

    # -- requests, auth ------------------------------------------------------------------------------------------
    def _call(
        self, method: str, path: str, repository: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> _Response:
        """A request whose body is in memory: on a challenge, authorize for `repository` and send it again."""
        url = f"{self.scheme}://{self.registry}{path}"
        response = self._send(method, url, dict(headers or {}), [body] if body else [])
        if response.status == 401:
            self._authorize(response, repository)
            response = self._send(method, url, dict(headers or {}), [body] if body else [])
        return response

    def _send(self, method: str, url: str, headers: dict[str, str], chunks: Iterable[bytes]) -> _Response:
        parts = urllib.parse.urlsplit(url)
        if parts.netloc != self.registry or parts.scheme != self.scheme:
            raise RegistryError(f"{self.registry} sent the request to {parts.scheme}://{parts.netloc}; not followed")
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        if self.authorization:
            headers["Authorization"] = self.authorization
        for attempt in (1, 2):  # a kept-alive connection the registry closed meanwhile: open a new one, once
            connection = self._connect()
            try:
                connection.putrequest(method, target, skip_accept_encoding=True)
                for name, value in headers.items():
                    connection.putheader(name, value)
                connection.endheaders()
                for chunk in chunks:
                    connection.send(chunk)
                raw = connection.getresponse()
                body = raw.read()
                return _Response(status=raw.status, headers=raw.headers, body=body)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if attempt == 2 or not isinstance(chunks, list):
                    raise RegistryError(f"{method} {url}: the connection broke ({e})") from None
            except OSError as e:
                self.close()
                raise RegistryError(f"{method} {url}: {e}") from None
        raise AssertionError("unreachable")

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            if self.context is None:
                self._connection = http.client.HTTPConnection(self.registry, timeout=self.timeout)
            else:
                self._connection = http.client.HTTPSConnection(
                    self.registry, timeout=self.timeout, context=self.context
                )
        return self._connection

    def _authorize(self, challenge: _Response, repository: str) -> None:
        header = challenge.headers.get("WWW-Authenticate", "")
        scheme = header.split(" ", 1)[0].lower()
        if self.credentials is None and scheme != "bearer":
            raise RegistryError(f"{self.registry} requires credentials: pass --username and the password")
        if scheme == "basic":
            user, password = self.credentials or ("", "")
            self.authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        elif scheme == "bearer":
            self.authorization = "Bearer " + self._token(dict(_CHALLENGE_PARAM.findall(header)), repository)
        else:
            raise RegistryError(f"{self.registry} asks for {header!r}, which is neither Basic nor Bearer auth")

    def _token(self, params: dict[str, str], repository: str) -> str:
        realm = params.get("realm")
        if not realm:
            raise RegistryError(f"{self.registry}: a Bearer challenge without a realm")
        query = {"scope": f"repository:{repository}:pull,push"}
        if "service" in params:
            query["service"] = params["service"]
        parts = urllib.parse.urlsplit(realm)
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = http.client.HTTPSConnection(parts.netloc, timeout=self.timeout, context=self.context)
        else:
            connection = http.client.HTTPConnection(parts.netloc, timeout=self.timeout)
        headers = {}
        if self.credentials is not None:
            user, password = self.credentials
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        try:
            connection.request("GET", f"{parts.path}?{urllib.parse.urlencode(query)}", headers=headers)
            raw = connection.getresponse()
            body = raw.read()
        except OSError as e:
            raise RegistryError(f"token service {realm}: {e}") from None
        finally:
            connection.close()
        if raw.status != 200:
            raise RegistryError(f"token service {realm} refused {query['scope']}: {raw.status} {body[:200]!r}")
        answer = json.loads(body)
        token = answer.get("token") or answer.get("access_token")
        if not token:
            raise RegistryError(f"token service {realm} answered without a token")
        return str(token)

    def _expect(self, response: _Response, ok: tuple[int, ...], method: str, what: str) -> None:
        if response.status in ok:
            return
        if response.status == 401:
            raise RegistryError(f"{self.registry} refused the credentials for {method} {what} (401)")
        detail = response.body[:300].decode(errors="replace")
        try:
            errors = json.loads(response.body).get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or detail
        except (ValueError, AttributeError):
            pass
        raise RegistryError(f"{self.registry} refused {method} {what}: {response.status} {detail}".strip())


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
        client.put_manifest(repository, manifest.digest, manifest)
    client.put_manifest(repository, reference.tag, image.index)
    return result
