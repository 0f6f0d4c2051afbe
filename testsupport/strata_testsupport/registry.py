"""A real OCI registry (distribution's, built here by hack/build-registry.sh) for the tests: HTTPS with a throwaway
CA by default, optionally htpasswd basic auth, storage in a temporary directory.

`registry` is the session fixture on loopback for pushes from the test process; the real-node tier starts one
on the node's address (strata_testsupport.realnode) that containerd pulls from. The registry logs every request
as a JSON line, so a test counts what it really received (`uploaded_blobs`), not what a client says it sent.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from strata_testsupport.processes import free_port, serve_for_session, stop_process
from strata_testsupport.webhook import write_webhook_tls

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-registry.sh"
USERNAME = "strata-puller"


def registry_binary() -> Path:
    """The registry binary, built into the cache when missing (about a minute the first time)."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the registry failed ({BUILD_SCRIPT}):\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


@dataclass
class Registry:
    """Where it listens (`address` is host:port), how to trust it, and the one user when auth is on."""

    address: str
    ca_file: Path | None
    log: Path = field(repr=False)
    username: str | None = None
    password: str | None = None

    def reference(self, repository: str, tag: str) -> str:
        return f"{self.address}/{repository}:{tag}"

    def pack_args(self) -> list[str]:
        """The `strata-loader pack` options that reach this registry (the password goes by environment)."""
        args = ["--ca-file", str(self.ca_file)] if self.ca_file else ["--plain-http"]
        return args + (["--username", self.username] if self.username else [])

    def pull_secret(self, name: str, password: str | None = None) -> dict[str, object]:
        """A `kubernetes.io/dockerconfigjson` Secret for the registry's user (`password`: a wrong one, denied)."""
        auth = base64.b64encode(f"{self.username}:{password or self.password}".encode()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": json.dumps({"auths": {self.address: {"auth": auth}}})},
        }

    def ca_config_map(self, name: str) -> dict[str, object]:
        """A ConfigMap holding the registry's CA under `ca.crt` (what `imageVolume.caConfigMapRef` names)."""
        assert self.ca_file is not None, "a plain-HTTP registry has no CA"
        data = {"ca.crt": self.ca_file.read_text()}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}

    def requests(self) -> list[dict[str, object]]:
        """Every request the registry answered so far, from its log."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("msg") == "response completed":
                    found.append(entry)
        return found

    def uploaded_blobs(self, repository: str) -> list[str]:
        """Digests of the blob uploads into `repository` the registry completed (201), in order."""
        digests = []
        prefix = f"/v2/{repository}/blobs/uploads/"
        for entry in self.requests():
            uri = str(entry.get("http.request.uri", ""))
            completed = entry.get("http.response.status") == 201 and entry.get("http.request.method") == "PUT"
            if completed and uri.startswith(prefix):
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(uri).query)
                digests.extend(query.get("digest", []))
        return digests


def _config(directory: Path, address: str, tls: bool, htpasswd: Path | None) -> dict[str, object]:
    http: dict[str, object] = {"addr": address, "secret": secrets.token_hex(16)}
    if tls:
        http["tls"] = {"certificate": str(directory / "tls.crt"), "key": str(directory / "tls.key")}
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(directory / "data")}, "delete": {"enabled": True}},
        "http": http,
    }
    if htpasswd is not None:
        config["auth"] = {"htpasswd": {"realm": "strata-test", "path": str(htpasswd)}}
    return config


@contextlib.contextmanager
def running_registry(
    host: str = "127.0.0.1", *, tls: bool = True, auth: bool = False, parent: Path | None = None
) -> Iterator[Registry]:
    """Start a registry on `host` (a free port), yield it, stop it and remove its storage. `parent`: where its
    directory goes (the real node keeps it under its work dir, which its sweep removes)."""
    binary = registry_binary()
    with tempfile.TemporaryDirectory(prefix="strata-registry-", dir=parent) as tmp:
        directory = Path(tmp)
        ca_file = None
        if tls:
            ca_file = directory / "ca.crt"
            ca_file.write_bytes(write_webhook_tls(directory, address=host))
        password = secrets.token_urlsafe(16) if auth else None
        htpasswd = None
        if password is not None:
            line = subprocess.run(
                [str(binary), "htpasswd", USERNAME], input=password + "\n", capture_output=True, text=True, check=True
            ).stdout
            htpasswd = directory / "htpasswd"
            htpasswd.write_text(line)
        address = f"{host}:{free_port(host)}"
        (directory / "config.yml").write_text(yaml.safe_dump(_config(directory, address, tls, htpasswd)))
        log = directory / "registry.log"
        with open(log, "wb") as out:
            process = subprocess.Popen([str(binary), "serve", str(directory / "config.yml")], stdout=out, stderr=out)
        try:
            _wait_ready(process, address, ca_file, log)
            yield Registry(
                address=address,
                ca_file=ca_file,
                log=log,
                username=USERNAME if auth else None,
                password=password,
            )
        finally:
            stop_process(process, grace=10)


def _wait_ready(process: subprocess.Popen[bytes], address: str, ca_file: Path | None, log: Path) -> None:
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    url = f"{'https' if ca_file else 'http'}://{address}/v2/"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the registry exited ({process.returncode}): {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=2, context=context).close()
            return
        except urllib.error.HTTPError as e:
            if e.code == 401:  # auth on: it answers
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the registry did not answer on {url} within 30s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def registry() -> Iterator[Registry]:
    """A registry on loopback over HTTPS (its CA in `ca_file`), no auth."""
    yield from serve_for_session("OCI registry", running_registry)


@pytest.fixture(scope="session")
def registry_with_auth() -> Iterator[Registry]:
    """Like `registry`, with basic auth: only `username`/`password` may push or pull."""
    yield from serve_for_session("OCI registry with auth", lambda: running_registry(auth=True))
