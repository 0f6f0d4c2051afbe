"""Session fixture `s3_server`: a real S3-compatible server process (moto's server mode) on a loopback port.

It speaks the S3 HTTP API (ranged GETs answer 206, multipart works), so clients under test use boto3
exactly as
in production, pointed at `endpoint_url`. It is slow (~0.1-0.2 GB/s): fine for correctness, not for
benchmarks.
When the server cannot start, tests skip with the reason, except under CI=true where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from strata_testsupport.processes import free_port, serve_for_session, stop_process

ACCESS_KEY = "strata-test"
SECRET_KEY = "strata-test-secret"
REGION = "us-east-1"


ANSI_STYLE = re.compile(r"\x1b\[[0-9;]*m")
# The server's access log line (werkzeug's): `client - - [date] "METHOD path HTTP/1.1" status size`.
ACCESS_LINE = re.compile(r'^(\S+) - - \[[^\]]*\] "(\S+) (\S+) [^"]*" (\d{3})', re.MULTILINE)


@dataclass(frozen=True)
class S3Request:
    """One request as the server logged it."""

    client: str  # the address the request came from (for pods: their node's, once masqueraded)
    method: str
    path: str  # /bucket/key, with any query string
    status: int


@dataclass
class S3Server:
    """Where the server listens and how to authenticate; `env()` is what a subprocess under test needs."""

    endpoint_url: str
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    log: Any = field(default=None, repr=False)  # the server's stderr: its own access log

    def requests(self) -> list[S3Request]:
        """Every request the server logged so far, in order: the server's own account of who read what (a test
        that must prove an object was read once, or only from one address, counts these)."""
        if self.log is None:
            return []
        text = ANSI_STYLE.sub("", os.pread(self.log.fileno(), os.fstat(self.log.fileno()).st_size, 0).decode())
        return [S3Request(*m.group(1, 2, 3), int(m.group(4))) for m in ACCESS_LINE.finditer(text)]

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=32),
        )

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique name when none is given) and return its name."""
        name = name or f"strata-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"server exited with code {proc.returncode}"
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=2):
                return None
        except OSError:
            time.sleep(0.2)
    return f"server did not answer on {url} within {timeout:.0f}s"


@contextlib.contextmanager
def running_s3_server(host: str = "127.0.0.1", *, authenticate: bool = False) -> Iterator[S3Server]:
    """Start a server process, yield it, stop it (also usable outside pytest, e.g. by benchmarks and
    demos). `host` is loopback unless pods of the real node must reach it (its node address).

    moto accepts any credentials unless told otherwise; with `authenticate` it checks every request against
    its IAM, and the yielded server's keys are a real IAM user's (allowed everything), made before checks start.
    """
    try:
        import moto.server  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"moto[server] is not installed ({e}); pip install 'moto[server]'") from None
    port = free_port()
    url = f"http://{host}:{port}"
    log = tempfile.TemporaryFile()  # noqa: SIM115 -- a pipe nobody drains would block the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={
            **os.environ,
            "MOTO_ALLOW_NONEXISTENT_REGION": "true",
            # The three IAM calls below are the only ones let through unchecked.
            **({"INITIAL_NO_AUTH_ACTION_COUNT": "3"} if authenticate else {}),
        },
    )
    try:
        problem = _wait_ready(url, proc)
        if problem:
            log.seek(0)
            raise RuntimeError(f"{problem}: {log.read()[-2000:].decode(errors='replace')}".strip())
        server = S3Server(endpoint_url=url, process=proc, log=log)
        yield _with_iam_user(server) if authenticate else server
    finally:
        stop_process(proc, grace=10)
        log.close()


def _with_iam_user(server: S3Server) -> S3Server:
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=server.endpoint_url,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
    )
    iam.create_user(UserName="strata")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="strata", PolicyName="all", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="strata")["AccessKey"]
    return S3Server(
        endpoint_url=server.endpoint_url,
        access_key=key["AccessKeyId"],
        secret_key=key["SecretAccessKey"],
        region=server.region,
        process=server.process,
        log=server.log,
    )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-compatible server for the whole session."""
    yield from serve_for_session("S3 server", running_s3_server)


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """Point this process's AWS variables at the test server for one test."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server
