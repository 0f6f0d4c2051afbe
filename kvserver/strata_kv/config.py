"""The KV server's configuration: one pydantic model the operator renders and `strata-kv serve` parses.

Kept import-light on purpose (pydantic + yaml only): the operator imports this module to render the
ConfigMap, and must not pull in the server. Credentials never live here: S3 keys come from the
environment (or the pod's service account) and the auth token from a file.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from strata_units import ByteSize, SizeField

CONFIG_FILE_NAME = "strata-kv.yaml"
"""File name inside the ConfigMap / the `--config` default directory."""


Size = Annotated[ByteSize, SizeField(written="formatted")]
"""A size in the config or on the command line: `1GiB`, `512Mi`, `4096` or an int, read by the one parser (0 is
allowed where a field says what it means; fractions and `m` are refused) and written compactly (`1GiB`)."""


SenderThreads = Annotated[
    int,
    Field(
        ge=0,
        le=64,
        description="Threads that send replies holding a value above 1 MiB while another such reply is going out, "
        "so that large GETs to several clients use several cores. 0 (default): the event loop writes them, in 1 MiB "
        "slices. On 2 shared cores 2 threads moved 64 MiB GETs to 8-32 clients 39-43% faster, but doubled a small "
        "GET's p99 beside 8 of them (kvserver README; at nice 10, below the loop, as they run: 1.5x): for nodes with "
        "cores to spare.",
    ),
]
"""The server's sender threads, declared once: the KVCacheTier spec's `senderThreads` is this type."""


class EvictionPolicyName(StrEnum):
    """L1 eviction policies. `prefix-lirs` is scan-resistant and evicts chain tails before heads."""

    LRU = "lru"
    PREFIX_LIRS = "prefix-lirs"


class S3AddressingStyle(StrEnum):
    """How the S3 client names the bucket: `path` for most S3-compatible servers, `virtual` (a host per bucket),
    or `auto` (the client's choice)."""

    AUTO = "auto"
    PATH = "path"
    VIRTUAL = "virtual"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_enum_values=False)


DEFAULT_SHARED_MEMORY_BUDGET = 256 * 1024**2
"""A few hundred values of 1 MiB or more that clients still read: Strata's client copies and lets go at once,
so only a hoarding client (or a sweep's lag, about a second) comes near it."""
DEFAULT_SHARED_MEMORY_CLIENT_BUDGET = 64 * 1024**2


class ListenConfig(_Model):
    """Where RESP clients connect: TCP and/or a Unix socket (node-local pods share it via a hostPath)."""

    port: int = Field(default=6379, ge=0, le=65535, description="TCP port for RESP; 0 picks a free port")
    bind: str = Field(
        default="127.0.0.1",
        description="TCP bind address: loopback unless set (the operator sets 0.0.0.0 for its pods)",
    )
    unix_socket: str | None = Field(default=None, description="Path of a Unix socket to also listen on")
    unix_socket_mode: int = Field(
        default=0o660, description="Permission bits of the Unix socket: 0660 or tighter (never world-accessible)"
    )
    shared_memory: bool = Field(
        default=False,
        description="Clients on the Unix socket may GET large values as memory (STRATA.GETFD: a sealed memfd, "
        "mapped read-only) instead of bytes; needs unix_socket. Memory a client keeps mapped after L1 drops the "
        "value stays charged to the server until the client unmaps it, within shared_memory_budget",
    )
    shared_memory_budget: Size = Field(
        default=ByteSize(DEFAULT_SHARED_MEMORY_BUDGET),
        description="Bytes of values handed over as memory that clients may still hold, all clients together; "
        "past it STRATA.GETFD answers with the bytes instead. Counted from a value's first hand-over until no "
        "client holds it (its descriptor closed and its mapping gone)",
    )
    shared_memory_client_budget: Size = Field(
        default=ByteSize(DEFAULT_SHARED_MEMORY_CLIENT_BUDGET),
        description="Of those, handed to one connection while it is open; past it that connection's STRATA.GETFD "
        "answers with the bytes",
    )
    tcp_enabled: bool = True
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="auto",
        description="auto: uvloop when installed (its transports send a large reply without copying it), "
        "else asyncio's own",
    )
    sender_threads: SenderThreads = 0

    @model_validator(mode="after")
    def _socket_not_world_accessible(self) -> ListenConfig:
        if self.unix_socket_mode & ~0o660:
            raise ValueError(
                f"listen.unix_socket_mode {self.unix_socket_mode:#o} grants more than owner and group "
                "read/write (0660): anyone on the node could read and write every tenant's KV cache"
            )
        if self.shared_memory and not self.unix_socket:
            raise ValueError("listen.shared_memory hands memory over a Unix socket: set listen.unix_socket too")
        if self.shared_memory_client_budget > self.shared_memory_budget:
            raise ValueError(
                f"listen.shared_memory_client_budget {int(self.shared_memory_client_budget)} exceeds "
                f"listen.shared_memory_budget {int(self.shared_memory_budget)}: one client's share is part of it"
            )
        return self


class L1Config(_Model):
    """DRAM tier: never holds more than `size` bytes of values."""

    size: Size = Field(default=ByteSize(1024**3), description="Capacity in bytes of chunk values held in DRAM")
    eviction_policy: EvictionPolicyName = EvictionPolicyName.PREFIX_LIRS
    hir_fraction: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="prefix-lirs: the least share of L1 kept for new (not yet proven hot) chunks; the share grows "
        "by itself up to half of L1 while chunks it evicted are stored again",
    )
    exists_grace_seconds: float = Field(
        default=2.0,
        ge=0,
        description="A key that EXISTS reported present is not evicted for this long "
        "(LMCache GETs after EXISTS "
        "and hangs on a miss)",
    )
    infer_chains: bool = Field(
        default=True,
        description="Treat consecutive SETs on one connection as a prefix chain (parent -> child)",
    )


class L2FsConfig(_Model):
    """Shared-filesystem tier in vLLM's offloading FS layout, with the capacity limit vLLM lacks."""

    root_dir: str
    capacity: Size = Field(
        default=ByteSize(0), description="Bytes the tier may use; 0 means the filesystem's free space"
    )
    high_watermark: float = Field(default=0.90, gt=0, le=1, description="Start evicting above this fill ratio")
    low_watermark: float = Field(default=0.80, gt=0, le=1, description="Evict down to this fill ratio")
    rank: int = Field(default=0, ge=0, description="The `_r<rank>` directory suffix (tensor-parallel rank)")
    rescan_interval_seconds: float = Field(
        default=300.0,
        ge=0,
        description="Rescan the directory this often so chunks other nodes wrote count against capacity; 0 = never",
    )
    min_rescan_seconds: float = Field(
        default=10.0,
        ge=0,
        description="Over the high watermark with no indexed block left to evict (files a vLLM `fs` tier wrote "
        "since the last scan), rescan the directory at once, but at most this often",
    )
    max_namespaces: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Most vLLM namespace directories (`<model>_<digest12>_r<rank>`, one per model, KV layout and "
        "rank) under root_dir that vLLM-tier keys may use; a write that would create one more is refused (a miss "
        "later, counted in fs_namespaces_refused). Directories already there, vLLM's own included, count too",
    )
    fsync: bool = Field(default=False, description="fsync each block file before the rename (durability over speed)")
    max_ranks: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="LMCache keys name their rank directory (worker_id) only when worker_id < world_size <= this; "
        "other keys are stored under a hash of their bytes, so keys cannot create rank directories at will",
    )
    max_kv_groups: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="vLLM offload keys keep their `_g<group>` directory only for groups below this",
    )

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> L2FsConfig:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"l2.fs.low_watermark ({self.low_watermark}) must be below high_watermark ({self.high_watermark})"
            )
        return self


class L2S3Config(_Model):
    """S3 tier. Credentials come from AWS_* env vars, a web identity or a credentials file, never here."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    max_pool_connections: int = Field(default=16, ge=1)
    addressing_style: S3AddressingStyle = Field(
        default=S3AddressingStyle.AUTO, description="Bucket addressing; 'path' for most S3-compatible servers"
    )


class L2Config(_Model):
    fs: L2FsConfig | None = None
    s3: L2S3Config | None = None


class NamespaceConfig(_Model):
    """What makes chunks shareable: same model, same KV layout, same hash settings.

    Instances with different values get different digests and so never read each other's chunks
    (differing hash seeds otherwise give silent zero hits).
    """

    model: str = "default"
    layout: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM's offload config.json content (block size, tp/pp sizes, dtype, KV groups...)",
    )
    hash_algorithm: str = "sha256_cbor"
    hash_seed: str | None = Field(default=None, description="PYTHONHASHSEED shared by every engine (xxhash variants)")

    def run_config(self) -> dict[str, Any]:
        """The content of the namespace's `config.json`, and what its directory digest is taken over.

        With a `layout` (vLLM's FileMapper fields: model_name, hash_block_size, gpu_blocks_per_file,
        tp/pp/pcp/dcp sizes, dtype, kv_cache_groups, inference_engine) it is exactly that, so the server
        and unmodified vLLM instances pick the same directory. Without one (RESP-only use) the hash
        settings are folded in, so engines with different seeds never share chunks.
        """
        material = dict(self.layout)
        material.setdefault("model_name", self.model)
        if not self.layout:
            material["hash_algorithm"] = self.hash_algorithm
            if self.hash_seed is not None:
                material["hash_seed"] = self.hash_seed
        return material

    @property
    def digest(self) -> str:
        """First 12 hex of the sha256 of the compact sorted config JSON (vLLM's `_compute_base_path`)."""
        blob = json.dumps(self.run_config(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def directory_name(self) -> str:
        return f"{str(self.run_config()['model_name']).replace('/', '_')}_{self.digest}"


class TenancyConfig(_Model):
    """Tenant isolation by cache salt: LMCache appends `@<salt>` to keys, vLLM folds it into hashes."""

    require_salt: bool = Field(default=False, description="Reject keys that carry no tenant salt suffix")
    salt_separator: str = Field(default="@", min_length=1, max_length=1)


class AuthConfig(_Model):
    token_file: str | None = Field(default=None, description="File holding the shared token (a mounted Secret)")
    failure_delay_seconds: float = Field(
        default=0.1,
        ge=0,
        description="A failed AUTH is answered after this long, doubling with each failure on the connection "
        "(at most 5 s)",
    )
    max_failures: int = Field(default=10, ge=1, description="Failed AUTH attempts after which the connection is closed")


class LimitsConfig(_Model):
    max_value_size: Size = Field(default=ByteSize(512 * 1024**2), description="Largest value a SET may carry")
    max_key_size: Size = Field(default=ByteSize(4096))
    max_clients: int = Field(default=1024, ge=1)
    max_pipeline_depth: int = Field(
        default=1024, ge=1, description="Requests parsed ahead of the replies written, per connection"
    )
    max_request_size: Size = Field(
        default=ByteSize(1024**3),
        description="Largest total request (e.g. an MSET); larger gets an error, the connection closes",
    )
    max_output_buffer: Size = Field(
        default=ByteSize(1024**3),
        description="Most reply bytes one connection may have pending; a reply past it closes the connection "
        "(Redis' client-output-buffer-limit, hard). 0 = no limit; unset, at least twice max_value_size",
    )
    max_unauthenticated_clients: int = Field(
        default=128,
        ge=1,
        description="With auth on: connections still to authenticate at a time; past it (or at max_clients) "
        "a new connection closes the oldest of them",
    )
    auth_timeout_seconds: float = Field(
        default=10.0, ge=0, description="With auth on: close a connection not authenticated this long; 0 = never"
    )
    idle_timeout_seconds: float = Field(
        default=300.0,
        ge=0,
        description="Close a connection with no complete request, no finished command and no reply progress "
        "for this long (a running command does not count as idle); 0 = never",
    )
    max_unauthenticated_bulk: Annotated[ByteSize, SizeField(minimum=1, written="formatted")] = Field(
        default=ByteSize(16 * 1024),
        description="With auth on: largest argument a connection may send before AUTH succeeds",
    )
    max_unauthenticated_args: int = Field(
        default=10,
        ge=1,
        description="With auth on: most arguments in one request before AUTH succeeds "
        "(HELLO 3 AUTH user pass SETNAME name is 7)",
    )

    max_inflight_bytes: Size | None = Field(
        default=None,
        description="Bytes of large values (256 KiB and up) received but not yet stored, all connections "
        "together; past it a connection starting a large value waits before reading it. One value is "
        "always let in alone. Unset: 5% of l1.size, at least 64 MiB",
    )

    @model_validator(mode="after")
    def _largest_value_fits_the_output_buffer(self) -> LimitsConfig:
        """A GET of the largest value must fit; a config written before this limit existed still parses."""
        if "max_output_buffer" not in self.model_fields_set:
            self.max_output_buffer = ByteSize(max(self.max_output_buffer, 2 * self.max_value_size))
        elif self.max_output_buffer and self.max_output_buffer < self.max_value_size:
            raise ValueError(
                f"limits.max_output_buffer ({self.max_output_buffer}) is below limits.max_value_size "
                f"({self.max_value_size}): a GET of the largest value would close the connection; "
                "raise it, or set 0 for no limit"
            )
        return self


class MetricsConfig(_Model):
    port: int = Field(default=9121, ge=-1, le=65535, description="Prometheus + /healthz + /readyz; -1 disables")
    bind: str = Field(
        default="127.0.0.1",
        description="Bind address of the metrics endpoint: loopback unless set (the operator sets 0.0.0.0)",
    )


class WriteBehindConfig(_Model):
    queue_items: int = Field(default=1024, ge=1, description="Chunks waiting for L2; a full queue slows SETs down")
    queue_bytes: Size = Field(
        default=ByteSize(512 * 1024**2), description="Bytes waiting for L2 before SETs are held back"
    )
    workers: int = Field(default=4, ge=1, le=64)
    drain_timeout_seconds: float = Field(default=30.0, ge=0)


Medium = Literal["CPU", "STORAGE"]
"""vLLM's media for blocks outside the GPU (`vllm.distributed.kv_events.MEDIUM_CPU`, `MEDIUM_STORAGE`)."""


class EventMedia(_Model):
    """Which vLLM medium each server tier's KV events name. vLLM's own offloading publishes its DRAM tier as `CPU`
    and its disk and object tiers (`fs`, `obj`) as `STORAGE`; llm-d's indexer keeps one entry per (pod, medium)
    and weighs each medium on its own. Both L2 tiers (fs, S3) share the `l2` medium."""

    l1: Medium = Field(default="CPU", description="Medium of the DRAM L1")
    l2: Medium = Field(default="STORAGE", description="Medium of the L2 tiers (filesystem, S3)")

    @model_validator(mode="before")
    @classmethod
    def _one_for_all(cls, data: Any) -> Any:
        """`medium: STORAGE` (the only form before per-tier media): one medium for every tier."""
        if isinstance(data, str):
            return {"l1": data, "l2": data}
        return data

    def of(self, tier: str) -> str:
        """The medium of a tier by its name in stats and STRATA.LOCATE (`l1`, `fs`, `s3`)."""
        return self.l1 if tier == "l1" else self.l2


class EventsConfig(_Model):
    """KV events for what each tier of the server holds, in vLLM's own wire format, so a prefix-aware router (llm-d's
    indexer) learns which node's tier has a block and when a tier drops it. Off unless `publish` is set.

    Only vLLM-tier keys (`<model>_<digest12>_r<rank>/` + block hash + 4-byte KV group, see
    `strata_kv.vllm.tier`) produce events; LMCache keys and other RESP keys carry no vLLM block hash. No replay
    socket (vLLM's ROUTER replay): a subscriber that sees a gap in the sequence numbers resynchronises from the
    events that follow.
    """

    publish: str | None = Field(
        default=None,
        description="ZMQ endpoint the PUB socket binds, e.g. tcp://*:5557; unset: no events (pyzmq not needed)",
    )
    topic: str = Field(
        default="",
        max_length=256,
        description="Topic frame of every message (vLLM's `topic`, default empty); `{namespace}` is replaced by "
        "the block's namespace directory (`<model>_<digest12>_r<rank>`), so one subscriber can filter one model",
    )
    medium: EventMedia = Field(
        default_factory=lambda: EventMedia(),
        description="vLLM medium named by each tier's events: `{l1: CPU, l2: STORAGE}` (default: the DRAM L1 is "
        "vLLM's CPU medium, the L2 tiers its STORAGE medium, so a router's per-medium index follows each tier); one "
        "value (`STORAGE` or `CPU`) names every tier with it, a block then stays held until no tier has it",
    )
    int_block_hashes: bool = Field(
        default=True,
        description="Publish hashes as vLLM does by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the low 64 "
        "bits of the big-endian hash as an unsigned int; false: the hash bytes",
    )
    block_size: int = Field(
        default=0,
        ge=0,
        description="`block_size` in BlockStored events: 0 (unknown), as vLLM's own events for offloaded blocks "
        "whose tokens it did not see; the server stores chunks, never tokens",
    )
    batch_max: int = Field(default=256, ge=1, le=65536, description="Most events in one KVEventBatch message")
    queue_max: int = Field(
        default=65536,
        ge=1,
        description="Events waiting to be sent; past it new events are dropped and counted (a slow or absent "
        "subscriber never blocks a SET or grows memory)",
    )
    send_hwm: int = Field(
        default=1024, ge=1, description="ZMQ send high-water mark in messages per subscriber (ZMQ drops past it)"
    )


class KVServerConfig(_Model):
    """Complete configuration of one `strata-kv serve` process."""

    listen: ListenConfig = Field(default_factory=lambda: ListenConfig())
    l1: L1Config = Field(default_factory=lambda: L1Config())
    l2: L2Config = Field(default_factory=lambda: L2Config())
    chunk_tokens: int = Field(default=256, ge=1, description="Tokens per chunk; every engine must agree")
    namespace: NamespaceConfig = Field(default_factory=lambda: NamespaceConfig())
    tenancy: TenancyConfig = Field(default_factory=lambda: TenancyConfig())
    auth: AuthConfig = Field(default_factory=lambda: AuthConfig())
    limits: LimitsConfig = Field(default_factory=lambda: LimitsConfig())
    metrics: MetricsConfig = Field(default_factory=lambda: MetricsConfig())
    write_behind: WriteBehindConfig = Field(default_factory=lambda: WriteBehindConfig())
    events: EventsConfig = Field(default_factory=lambda: EventsConfig())
    log_level: str = "INFO"

    @property
    def inflight_budget(self) -> int:
        """`limits.max_inflight_bytes`, or its default derived from the L1 size."""
        if self.limits.max_inflight_bytes is not None:
            return int(self.limits.max_inflight_bytes)
        return max(64 * 1024**2, int(self.l1.size) // 20)

    @classmethod
    def from_yaml(cls, text: str) -> KVServerConfig:
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError(f"KV server config must be a YAML mapping, got {type(data).__name__}")
        return cls.model_validate(data)

    @classmethod
    def from_yaml_file(cls, path: str | Path) -> KVServerConfig:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"cannot read KV server config {path}: {e.strerror}") from e
        return cls.from_yaml(text)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)
