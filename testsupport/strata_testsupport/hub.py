"""Session fixture `hub_server`: a real Hugging Face Hub-compatible server (olah) on a loopback port, serving git
repositories that tests create on disk.

olah is a self-hosted Hub mirror; in offline mode it serves "local mirrors": plain git repositories whose large
files are Git LFS pointers with the objects under `.git/lfs/objects`, exactly the layout `git lfs` leaves. It
answers the Hub's API as `huggingface_hub` calls it (`/api/models/<repo>/revision/<rev>`, the recursive tree
with sizes and LFS SHA-256) and the resolve URLs, for branches, tags and commits. What it does not do, so
these tests cannot cover it: tokens and gated repositories (it never checks Authorization), ranged GETs on the
repositories it serves from git (it answers 200 with the whole file; the loader copes, see
`strata_loader.fetch.hub.HubReader`), and "revision not found" (a missing revision is "repository not found").

olah lives in its own venv (its dependencies conflict with the dev venv's), built once into the cache by
`hack/build-olah.sh`. It is configured to reach nothing but loopback. When it cannot start, tests skip with the
reason, except under CI=true where they fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from strata_testsupport.processes import free_port, serve_for_session, stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-olah.sh"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt")
"""Files stored as LFS objects, as the Hub's `.gitattributes` does for weights; the rest are plain git blobs."""


@dataclass
class HubServer:
    """Where the server listens and where its repositories live; `env()` is what a process under test needs."""

    endpoint: str
    mirrors: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def env(self) -> dict[str, str]:
        return {"HF_ENDPOINT": self.endpoint}

    def repo_dir(self, repo_id: str) -> Path:
        return self.mirrors / "models" / repo_id

    def create_repo(self, repo_id: str | None = None) -> str:
        """An empty repository with branch main (a fresh unique `strata/<name>` when none is given)."""
        repo_id = repo_id or f"strata/tiny-{uuid.uuid4().hex[:10]}"
        d = self.repo_dir(repo_id)
        d.mkdir(parents=True)
        _git(d, "init", "-q", "-b", "main")
        return repo_id

    def commit(self, repo_id: str, files: dict[str, bytes], message: str = "update", branch: str = "main") -> str:
        """Write `files` on `branch` (created from the current one when new) and commit; returns the commit sha.
        Weights are stored as Git LFS: a pointer in git, the bytes under .git/lfs/objects."""
        d = self.repo_dir(repo_id)
        current = _git(d, "symbolic-ref", "--short", "HEAD")
        if branch != current:
            exists = subprocess.run(["git", "-C", str(d), "rev-parse", "--verify", "-q", branch], capture_output=True)
            _git(d, "checkout", "-q", *([] if exists.returncode == 0 else ["-b"]), branch)
        for rel, data in files.items():
            path = d / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if rel.endswith(LFS_SUFFIXES):
                oid = hashlib.sha256(data).hexdigest()
                obj = d / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
                obj.parent.mkdir(parents=True, exist_ok=True)
                obj.write_bytes(data)
                path.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n")
            else:
                path.write_bytes(data)
        _git(d, "add", "-A")
        _git(d, "commit", "-q", "--allow-empty", "-m", message)
        return _git(d, "rev-parse", "HEAD")

    def tag(self, repo_id: str, name: str, commit: str) -> None:
        _git(self.repo_dir(repo_id), "tag", name, commit)

    def lfs_object(self, repo_id: str, sha256: str) -> Path:
        return self.repo_dir(repo_id) / ".git" / "lfs" / "objects" / sha256[:2] / sha256[2:4] / sha256


def _git(d: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "strata",
        "GIT_AUTHOR_EMAIL": "strata@localhost",
        "GIT_COMMITTER_NAME": "strata",
        "GIT_COMMITTER_EMAIL": "strata@localhost",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    out = subprocess.run(["git", "-C", str(d), *args], check=True, capture_output=True, text=True, env=env)
    return out.stdout.strip()


def olah_python() -> str:
    """The olah venv's python, built on first use (about a minute) and cached under ~/.cache/strata."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed: {proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"olah exited with code {proc.returncode}"
        try:
            with urllib.request.urlopen(url + "/api/whoami-v2", timeout=2):
                return None
        except urllib.error.HTTPError:
            return None  # any HTTP answer: it is serving
        except OSError:
            time.sleep(0.2)
    return f"olah did not answer on {url} within {timeout:.0f}s"


@contextlib.contextmanager
def running_hub_server(host: str = "127.0.0.1") -> Iterator[HubServer]:
    """Start olah over a fresh, empty mirrors folder, yield it, stop it (also usable outside pytest)."""
    python = olah_python()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="strata-hub-") as tmp:
        root = Path(tmp)
        mirrors = root / "mirrors"
        mirrors.mkdir()
        config = root / "olah.toml"
        # Upstream is a closed loopback port: offline mode never calls it, and if it did nothing would leave.
        config.write_text(
            "[basic]\n"
            f'host = "{host}"\nport = {port}\n'
            f'repos-path = "{root / "cache"}"\nmirrors-path = ["{mirrors}"]\n'
            f'mirror-netloc = "{host}:{port}"\nmirror-lfs-netloc = "{host}:{port}"\n'
            'hf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\nhf-lfs-netloc = "127.0.0.1:9"\n'
            "metadata-cache-ttl = 0\n"
            "[accessibility]\noffline = true\n"
        )
        log = tempfile.TemporaryFile()  # noqa: SIM115 -- a pipe nobody drains would block the server
        proc = subprocess.Popen(
            [python, "-m", "olah.server", "-c", str(config), "--log-path", str(root / "logs")],
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("HF_")},
        )
        try:
            url = f"http://{host}:{port}"
            problem = _wait_ready(url, proc)
            if problem:
                log.seek(0)
                raise RuntimeError(f"{problem}: {log.read()[-2000:].decode(errors='replace')}".strip())
            yield HubServer(endpoint=url, mirrors=mirrors, process=proc)
        finally:
            stop_process(proc, grace=10)
            log.close()


@pytest.fixture(scope="session")
def hub_server() -> Iterator[HubServer]:
    """A real Hub-compatible server for the whole session."""
    yield from serve_for_session("Hub server", running_hub_server)


@pytest.fixture
def hub_env(hub_server: HubServer, monkeypatch: pytest.MonkeyPatch) -> HubServer:
    """Point this process's Hugging Face variables at the test server for one test (and at no token)."""
    for k in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in hub_server.env().items():
        monkeypatch.setenv(k, v)
    return hub_server
