"""A client of the OCI distribution API over `http.client`: what `strata-loader pack` pushes with and what the
operator resolves an image volume's tag to a digest with (so there is one client, with one way to authenticate).

Why not a client library: the maintained Python OCI client (oras-py) uploads a blob from a file on disk, read
into memory whole; a layer here is a tar made on the fly from the model's files, tens of GB for large models. The
protocol is small: HEAD a blob (present: skip it), POST an upload and PUT the bytes with their digest (one
monolithic PUT, the body streamed with a known length), PUT and GET manifests. Auth is the registry's challenge:
Basic, or a Bearer token fetched from the realm it names for this repository's scope.

Contract level (it imports nothing else of strata_loader): the operator imports it.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import ssl
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEDIA_TYPE_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_TYPE_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_TYPE_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_TYPE_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_MEDIA_TYPES = (
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST,
)
INDEX_MEDIA_TYPES = (MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_DOCKER_LIST)

DENIED, NOT_FOUND, DIGEST_MISMATCH, UNREACHABLE, REFUSED, NO_PLATFORM = (
    "Denied",
    "NotFound",
    "DigestMismatch",
    "Unreachable",
    "Refused",
    "NoPlatform",
)
"""Why a request failed, as `RegistryError.reason`: the operator turns each into a condition reason."""
TRANSIENT = frozenset({UNREACHABLE, REFUSED})
"""Failures worth retrying soon on their own (a registry down or answering 5xx); the others need a person."""

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(RuntimeError):
    """The registry refused a request or could not be reached; the message names the request and the answer,
    `reason` the kind of failure (`DENIED`, `NOT_FOUND`, ...), `status` the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = REFUSED) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def transient(self) -> bool:
        return self.reason in TRANSIENT and (self.status is None or self.status >= 500 or self.status == 429)


class ReferenceError(ValueError):
    """An image reference that names no registry, repository, tag or digest correctly; the message says how."""


@dataclass(frozen=True)
class ImageReference:
    """`registry/repository:tag` or `registry/repository@sha256:...` (the registry host explicit, as `oci://`
    URIs write it); a reference with both keeps the digest."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.tag}")

    def pinned(self, digest: str) -> str:
        """`registry/repository@digest`: what a node pulls, whatever the tag names later."""
        return f"{self.registry}/{self.repository}@{digest}"

    @classmethod
    def parse(cls, text: str) -> ImageReference:
        rest = text.removeprefix("oci://")
        host, slash, path = rest.partition("/")
        if not slash or not ("." in host or ":" in host or host == "localhost"):
            raise ReferenceError(f"reference {text!r}: name the registry, e.g. registry.example.com/models/name:tag")
        path, at, digest = path.partition("@")
        if at and not _DIGEST.match(digest):
            raise ReferenceError(f"reference {text!r}: digest {digest!r} must be sha256: and 64 lowercase hex digits")
        last = path.rsplit("/", 1)[-1]
        repository, tag = path.rsplit(":", 1) if ":" in last else (path, None)
        if not _REPOSITORY.match(repository):
            raise ReferenceError(
                f"reference {text!r}: repository {repository!r} must be lowercase [a-z0-9._-] components"
            )
        if tag is not None and not _TAG.match(tag):
            raise ReferenceError(f"reference {text!r}: tag {tag!r} must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")
        if tag is None and not at:
            raise ReferenceError(f"reference {text!r}: name a tag or a digest, e.g. {rest}:v1")
        return cls(registry=host, repository=repository, tag=tag, digest=digest or None)


@dataclass(frozen=True)
class Manifest:
    """A manifest or index as the registry served it: its digest (checked against its bytes) and document."""

    digest: str
    media_type: str
    document: Mapping[str, Any]

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_MEDIA_TYPES or "manifests" in self.document

    def layer_bytes(self) -> int:
        return sum(int(layer.get("size") or 0) for layer in self.document.get("layers") or [])


@dataclass(frozen=True)
class Resolution:
    """What a reference names now: the digest to pin (the index's when there is one), the manifest of the
    platform asked for, and the bytes of that manifest's layers (what a node pulls)."""

    reference: ImageReference
    digest: str
    platform_digest: str
    size_bytes: int
    layers: int

    @property
    def pinned(self) -> str:
        return self.reference.pinned(self.digest)


def resolve(client: RegistryClient, reference: ImageReference, platform: str = "linux/amd64") -> Resolution:
    """The digest a tag names now (or the digest given, checked to exist), and the size of its `platform`
    manifest's layers. Raises RegistryError (reason `NO_PLATFORM` when an index has no such platform)."""
    top = client.get_manifest(reference.repository, reference.digest or str(reference.tag))
    chosen = top
    if top.is_index:
        os_, _, arch = platform.partition("/")
        entries = [
            m
            for m in top.document.get("manifests") or []
            if (m.get("platform") or {}).get("os") == os_ and (m.get("platform") or {}).get("architecture") == arch
        ]
        if not entries:
            offered = sorted(
                f"{(m.get('platform') or {}).get('os')}/{(m.get('platform') or {}).get('architecture')}"
                for m in top.document.get("manifests") or []
            )
            raise RegistryError(
                f"{reference} has no manifest for {platform} (it offers {', '.join(offered) or 'none'})",
                reason=NO_PLATFORM,
            )
        chosen = client.get_manifest(reference.repository, str(entries[0]["digest"]))
    return Resolution(
        reference=reference,
        digest=top.digest,
        platform_digest=chosen.digest,
        size_bytes=chosen.layer_bytes(),
        layers=len(chosen.document.get("layers") or []),
    )


def docker_config_credentials(config: Mapping[str, Any], registry: str) -> tuple[str, str] | None:
    """(username, password) for `registry` from a `.dockerconfigjson` document (its `auths`), as the kubelet
    matches them: the host with or without a scheme and path."""
    for key, entry in (config.get("auths") or {}).items():
        host = urllib.parse.urlsplit(key if "://" in key else f"//{key}").netloc
        if host != registry or not isinstance(entry, Mapping):
            continue
        if entry.get("username") is not None:
            return str(entry["username"]), str(entry.get("password") or "")
        if entry.get("auth"):
            user, _, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
            return user, password
    return None


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
        ca_data: str | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 300.0,
        actions: str = "pull,push",
        credentials_hint: str = "pass --username and the password",
    ) -> None:
        self.registry = registry
        self.scheme = "http" if plain_http else "https"
        self.context = (
            None
            if plain_http
            else ssl.create_default_context(cafile=str(ca_file) if ca_file else None, cadata=ca_data or None)
        )
        """Verification is never off: the system's trust, or the CA given (a file, or PEM text)."""
        self.credentials = (username, password) if username is not None else None
        self.timeout = timeout
        self.actions = actions
        self.credentials_hint = credentials_hint
        """What to do when the registry asks for credentials none were given for (the caller's own words)."""
        """The token scope's actions: `pull,push` to push, `pull` to read (a read-only user gets no push token)."""
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

    def put_manifest(self, repository: str, reference: str, media_type: str, data: bytes) -> None:
        headers = {"Content-Type": media_type, "Content-Length": str(len(data))}
        response = self._call("PUT", f"/v2/{repository}/manifests/{reference}", repository, headers, data)
        self._expect(response, (201,), "PUT", f"manifest {reference}")

    def get_manifest(self, repository: str, reference: str) -> Manifest:
        """The manifest or index a tag or digest names, its digest checked against its bytes (and against
        `reference` when that is a digest: a registry answering with other bytes is refused)."""
        headers = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
        response = self._call("GET", f"/v2/{repository}/manifests/{reference}", repository, headers)
        self._expect(response, (200,), "GET", f"manifest {repository}:{reference}")
        digest = "sha256:" + hashlib.sha256(response.body).hexdigest()
        said = response.headers.get("Docker-Content-Digest")
        if reference.startswith("sha256:") and reference != digest:
            raise RegistryError(
                f"{self.registry} answered GET manifest {repository}@{reference} with bytes whose digest is {digest}",
                status=response.status,
                reason=DIGEST_MISMATCH,
            )
        if said and said.startswith("sha256:") and said != digest:
            raise RegistryError(
                f"{self.registry} says manifest {repository}:{reference} is {said}, but its bytes hash to {digest}",
                status=response.status,
                reason=DIGEST_MISMATCH,
            )
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            document = json.loads(response.body)
        except ValueError:
            raise RegistryError(f"{self.registry}: manifest {repository}:{reference} is not JSON") from None
        if not isinstance(document, dict):
            raise RegistryError(f"{self.registry}: manifest {repository}:{reference} is not a JSON object")
        return Manifest(digest=digest, media_type=str(document.get("mediaType") or media_type), document=document)

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
                    raise RegistryError(f"{method} {url}: the connection broke ({e})", reason=UNREACHABLE) from None
            except OSError as e:
                self.close()
                raise RegistryError(f"{method} {url}: {e}", reason=UNREACHABLE) from None
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
            raise RegistryError(
                f"{self.registry} requires credentials: {self.credentials_hint} ({header or 'no challenge'})",
                status=401,
                reason=DENIED,
            )
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
        query = {"scope": f"repository:{repository}:{self.actions}"}
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
            raise RegistryError(f"token service {realm}: {e}", reason=UNREACHABLE) from None
        finally:
            connection.close()
        if raw.status != 200:
            raise RegistryError(
                f"token service {realm} refused {query['scope']}: {raw.status} {body[:200]!r}",
                status=raw.status,
                reason=DENIED if raw.status in (401, 403) else REFUSED,
            )
        answer = json.loads(body)
        token = answer.get("token") or answer.get("access_token")
        if not token:
            raise RegistryError(f"token service {realm} answered without a token")
        return str(token)

    def _expect(self, response: _Response, ok: tuple[int, ...], method: str, what: str) -> None:
        if response.status in ok:
            return
        if response.status == 401:
            raise RegistryError(
                f"{self.registry} refused the credentials for {method} {what} (401)", status=401, reason=DENIED
            )
        detail = response.body[:300].decode(errors="replace")
        try:
            errors = json.loads(response.body).get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or detail
        except (ValueError, AttributeError):
            pass
        reason = {403: DENIED, 404: NOT_FOUND}.get(response.status, REFUSED)
        raise RegistryError(
            f"{self.registry} refused {method} {what}: {response.status} {detail}".strip(),
            status=response.status,
            reason=reason,
        )
