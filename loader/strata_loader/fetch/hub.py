"""The Hugging Face Hub as a fetch source: one commit's files, listed with the Hub's own sizes and SHA-256, read
by byte ranges over the Hub's resolve URLs.

Why ranges and not `huggingface_hub`'s downloader: the bytes then go through the same machinery as S3 (parallel
blocks, the contiguous watermark that resumes after a kill -9, the checksum check, the manifest written last),
so a Hub copy behaves exactly like every other source, and `strata-loader verify` reads it back the same way.
`huggingface_hub` (`HfApi`) still does what only it knows: resolving a branch or tag to a commit and listing
that commit's tree, with the Hub's error codes turned into its typed errors.

The revision is resolved once, to a commit, and every file is read at that commit: a branch that moves during
the copy (or between two nodes' copies) cannot mix two versions, and the commit is what the result reports.

Xet-stored repositories need no `hf_xet` here: the Hub's resolve URL of a Xet file redirects to an HTTP bridge
that answers ranged GETs (it is how `huggingface_hub` itself downloads when `hf_xet` is absent). Xet files stay
LFS files in git, so the tree gives their LFS SHA-256 and they are checked like any LFS file; a file listed
without one is checked by size (and its SHA-256 recorded), like the plain git files.

Settings (environment, which is what the operator injects from the ModelCache's credentials Secret):
HF_TOKEN (sent to the endpoint only; never to the host a redirect leads to), HF_ENDPOINT (a mirror; default
the Hub), STRATA_HF_RETRIES (attempts per request, default 8; `core/settings.py`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import urllib3

from ..contract import ENV_HF_ENDPOINT, ENV_HF_HUB_OFFLINE, ENV_HF_TOKEN
from ..core import settings
from ..paths import UnsafePathError, safe_relative_path

_RETRY_STATUS = {429, 500, 502, 503, 504}
_SECRET_HINT = "the ModelCache's credentials Secret (spec.source.credentials.secretRef), key HF_TOKEN"


class HubError(RuntimeError):
    """The Hub refused or failed a request: the message names the repository and what to change."""


def offline() -> bool:
    """The one rule for `hf://`: the Hub, unless HF_HUB_OFFLINE says to read only the local cache."""
    return os.environ.get(ENV_HF_HUB_OFFLINE, "").strip().lower() in {"1", "true", "yes", "on"}


def endpoint() -> str:
    from huggingface_hub import constants

    # Read now, not at import: huggingface_hub fixes its ENDPOINT when first imported.
    default = getattr(constants, "_HF_DEFAULT_ENDPOINT", constants.ENDPOINT)
    return (os.environ.get(ENV_HF_ENDPOINT) or default).rstrip("/")


def token() -> str | None:
    """HF_TOKEN only: a token file left on a machine is never sent without being named."""
    return os.environ.get(ENV_HF_TOKEN) or None


@dataclass(frozen=True, slots=True)
class HubFile:
    """One file of the commit: path, size, the Hub's SHA-256 (LFS and Xet files) and git blob id."""

    path: str
    size: int
    sha256: str | None
    blob_id: str


def list_commit(repo_id: str, revision: str | None) -> tuple[str, list[HubFile]]:
    """Resolve `revision` (branch, tag or commit; default main) to a commit once, and list that commit's files."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    rev = revision or "main"
    api = HfApi(endpoint=endpoint(), token=token() or False, library_name="strata-loader")
    with _hub_errors(repo_id, rev):
        commit = api.model_info(repo_id, revision=rev).sha or ""
        if not commit:
            raise HubError(f"hf://{repo_id}: {endpoint()} named no commit for revision {rev!r}; check HF_ENDPOINT")
        entries = list(api.list_repo_tree(repo_id, revision=commit, recursive=True))
    files = []
    for e in entries:
        if not isinstance(e, RepoFile):
            continue
        try:
            safe_relative_path(e.path)
        except UnsafePathError as err:
            raise HubError(
                f"refusing hf://{repo_id} at {commit}: file {e.path!r} {err}, so it could land outside DEST"
                " (a source holding such a name is refused whatever the globs say); use another revision"
            ) from None
        sha = e.lfs.sha256 if e.lfs is not None else None
        files.append(HubFile(e.path, int(e.size), sha, e.blob_id))
    return commit, files


@functools.lru_cache(maxsize=4)
def _pool(max_connections: int) -> urllib3.PoolManager:
    return urllib3.PoolManager(
        maxsize=max_connections,
        block=False,
        timeout=urllib3.Timeout(connect=10, read=60),
        # Redirects lead to the Hub's CDN with a signed URL; urllib3 drops Authorization on a cross-host redirect.
        retries=urllib3.Retry(total=None, connect=0, read=0, redirect=10, status=0, raise_on_redirect=True),
    )


def resolve_url(repo_id: str, commit: str, path: str) -> str:
    return f"{endpoint()}/{repo_id}/resolve/{commit}/{quote(path)}"


class HubReader:
    """One file at one commit, read by ranged GETs on its resolve URL; thread-safe (pooled connections).

    A server that ignores Range (answers 200 with the whole file, as olah does for repositories it serves from
    local git) is still read correctly: the reader skips to the offset. Each block then re-reads the file's
    start, so it says so once on stderr: such an endpoint suits small models only.
    """

    _warned = False
    _warn_lock = threading.Lock()

    def __init__(self, repo_id: str, commit: str, path: str, size: int, max_connections: int = 64) -> None:
        self.repo_id, self.commit, self.path = repo_id, commit, path
        self.name = f"hf://{repo_id}/{path}@{commit[:12]}"
        self.size = size
        self.url = resolve_url(repo_id, commit, path)
        self._pool = _pool(max_connections)
        tok = token()
        self._headers = {"Authorization": f"Bearer {tok}"} if tok else {}

    def read_into(self, offset: int, buf: memoryview) -> None:
        if not len(buf):
            return
        if offset + len(buf) > self.size:
            raise ValueError(f"{self.name}: range {offset}+{len(buf)} is past the end ({self.size} bytes)")
        retries = settings.current().hf_retries  # attempts, with jittered backoff (0.1 s doubling, 8 s cap)
        for attempt in range(retries):
            try:
                if self._get_range(offset, buf):
                    return
                what = "a server error or throttling"
            except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as e:
                what = f"{type(e).__name__} ({e})"
            if attempt == retries - 1:
                raise HubError(
                    f"{self.name}: {what} after {retries} attempts; check HF_ENDPOINT and the network, or retry later"
                )
            time.sleep(min(8.0, 0.1 * 2**attempt) * (0.5 + random.random()))

    def _get_range(self, offset: int, buf: memoryview) -> bool:
        """Fill `buf` from `offset`; False for a status worth retrying."""
        end = offset + len(buf) - 1
        headers = {**self._headers, "Range": f"bytes={offset}-{end}"}
        resp = self._pool.request("GET", self.url, headers=headers, preload_content=False, redirect=True)
        whole = False  # a connection goes back to the pool only with its body read to the end
        try:
            if resp.status in _RETRY_STATUS:
                return False
            if resp.status == 200:
                self._warn_ignored_range()
                _skip(resp, offset, self.name)
            elif resp.status != 206:
                raise HubError(_status_message(self.repo_id, self.commit, self.path, resp.status))
            done = 0
            while done < len(buf):
                n = resp.readinto(buf[done:])
                if not n:
                    raise urllib3.exceptions.IncompleteRead(done, len(buf) - done)
                done += n
            whole = resp.status == 206
            return True
        finally:
            if whole:
                resp.release_conn()
            else:
                resp.close()

    def _warn_ignored_range(self) -> None:
        with HubReader._warn_lock:
            if HubReader._warned:
                return
            HubReader._warned = True
        print(
            f"strata-loader fetch: {endpoint()} ignores Range requests; every block re-reads the file from its start"
            " (fine for small models; use an endpoint that serves ranges for large ones)",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        pass


def _skip(resp: Any, n: int, name: str) -> None:
    scratch = bytearray(min(n, 1 << 20) or 1)
    left = n
    while left:
        got = resp.readinto(memoryview(scratch)[: min(left, len(scratch))])
        if not got:
            raise urllib3.exceptions.IncompleteRead(n - left, left)
        left -= got


def _status_message(repo_id: str, commit: str, path: str, status: int) -> str:
    where = f"hf://{repo_id}: {path} at {commit[:12]}"
    if status == 401:
        return f"{where}: 401 Unauthorized; " + _token_advice()
    if status == 403:
        return f"{where}: 403 Forbidden; " + _token_advice(gated=True)
    if status == 404:
        return f"{where}: 404 Not Found on {endpoint()}; the file vanished from the commit, check HF_ENDPOINT"
    return f"{where}: HTTP {status} from {endpoint()}"


def _token_advice(gated: bool = False) -> str:
    if token() is None:
        return f"the repository needs a token: set HF_TOKEN in {_SECRET_HINT}"
    if gated:
        return "HF_TOKEN has no access: accept the model's terms on its page with the token's account, or use another"
    return f"HF_TOKEN was refused (invalid or expired); replace it in {_SECRET_HINT}"


@contextlib.contextmanager
def _hub_errors(repo_id: str, revision: str) -> Iterator[None]:
    """Turns huggingface_hub's typed errors into one HubError line naming the repo and what to change."""
    try:
        yield
    except HubError:
        raise
    except Exception as err:
        message = _explain(err, f"hf://{repo_id}", revision)
        if message is None:
            raise
        raise HubError(message) from None


def _explain(err: Exception, repo: str, rev: str) -> str | None:
    from huggingface_hub import errors

    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, errors.GatedRepoError):
        return f"{repo} is gated: " + _token_advice(gated=True)
    if isinstance(err, errors.RevisionNotFoundError):
        return f"{repo} has no revision {rev!r}; set source.revision to an existing branch, tag or commit"
    if isinstance(err, errors.RepositoryNotFoundError):
        # Some servers (olah) answer "repository not found" for a missing revision too: name both.
        what = f"no such repository (or no revision {rev!r} in it)" if rev != "main" else "no such repository"
        if token() is None:
            return (
                f"{repo}: {what} on {endpoint()}, or it is private or gated: check source.uri and source.revision,"
                f" or set HF_TOKEN in {_SECRET_HINT}"
            )
        return f"{repo}: {what} on {endpoint()}, or HF_TOKEN cannot see it; check source.uri and source.revision"
    if isinstance(err, errors.HfHubHTTPError) and status in (401, 403):
        return f"{repo}: {status} from {endpoint()}; " + _token_advice(gated=status == 403)
    if isinstance(err, errors.HfHubHTTPError):
        return f"{repo} at {rev!r}: HTTP {status} from {endpoint()}; check HF_ENDPOINT or retry later"
    if isinstance(err, OSError) or _is_transport_error(err):
        return f"{repo}: cannot reach {endpoint()} ({type(err).__name__}: {err}); check HF_ENDPOINT and the network"
    return None


def _is_transport_error(err: BaseException) -> bool:
    """A connection that failed below HTTP. By name: huggingface_hub's HTTP client package has changed (httpx,
    then httpx2) and both call it TransportError."""
    return any(c.__name__ == "TransportError" for c in type(err).__mro__)


def opener(repo_id: str, commit: str, f: HubFile, concurrency: int) -> Callable[[], HubReader]:
    return lambda: HubReader(repo_id, commit, f.path, f.size, max_connections=max(10, concurrency))
