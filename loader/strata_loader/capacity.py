"""The node budget contract: what the operator tells one node's preload Job about the node path's capacity, and
what the Job reports back (inside its `FetchResult`).

The operator cannot see a node's filesystem; the Job on the node can. So the operator decides *which* copies may
go (other caches' idle copies on that node, of the Job's own namespace unless the policy allows more, least
recently used first) and the Job decides *whether* any must go: it measures the filesystem with `statvfs` (the
numbers `df` prints) and its namespace's copies as `du` would, evicts candidates in order only while the new copy
would not fit under the high watermark (down to the low one) or its namespace's budget, and says what it did.
The request travels in one environment variable (`ENV_NODE_CAPACITY`, compact JSON) so it stays out of the fetch
arguments and out of the Job's request hash: a copy is not fetched again because another cache was used more
recently.

This module has no imports from the rest of the loader, so `contract` can embed the report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from strata_units import ByteSize, SizeField

ENV_NODE_CAPACITY = "STRATA_NODE_CAPACITY"
"""JSON of a `CapacityRequest`; unset means no budget (the fetch only checks that the bytes fit)."""

MAX_CANDIDATES = 32
"""Copies the operator may name per Job: enough for any realistic node, small enough for the env and the
4096-byte termination message that reports the evictions back."""

EVICTED_REPORT_BYTES = 2400
"""What the candidates' names may add up to (plus a fixed share per entry): if the Job evicts every one, the
report of it still fits the 4096-byte termination message next to the rest of the result (the error message is
shortened first). The operator must learn of every eviction, so the list is bounded where it is made."""

EVICTED_ENTRY_OVERHEAD = 40
"""Bytes one evicted copy adds to the report besides its name: `{"copy_key":"","bytes":<up to 15 digits>},`."""

MAX_PROTECTED = 16
"""Copies named as kept (pinned, in use) for the InsufficientStorage message; the rest are counted."""

EXIT_INSUFFICIENT_STORAGE = 28
"""The exit status of a fetch that cannot fit (28 is ENOSPC): the Job's podFailurePolicy fails the Job at once
instead of retrying a copy that cannot fit until something changes."""

REASON_INSUFFICIENT_STORAGE = "InsufficientStorage"

COPY_KEY = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
"""`<namespace>/<name>` of a copy under the node root: a DNS label and a DNS subdomain, so no '..', no extra
'/', nothing that could name a path outside `<root>/<namespace>/<name>`."""


Bytes = Annotated[ByteSize, SizeField(minimum=0, written="count")]
"""A byte count in the request, 0 allowed; its JSON carries the count."""


class CapacityRequest(BaseModel):
    """The budget of the node path a Job writes into, and the copies it may evict (least recently used first)."""

    model_config = ConfigDict(extra="forbid")

    root: str = Field(description="the node path as mounted in the Job; copies live in <root>/<namespace>/<name>")
    policy: str = Field(description="the NodeCachePolicy this budget comes from, for messages")
    high_watermark: int = Field(ge=1, le=100, description="percent of the filesystem a new copy may fill up to")
    low_watermark: int = Field(ge=0, le=99, description="percent eviction brings usage down to")
    min_free_bytes: Bytes = Field(default=ByteSize(0), description="bytes that must stay free whatever the percentages")
    candidates: list[str] = Field(
        default_factory=list, max_length=MAX_CANDIDATES, description="<namespace>/<name>, least recently used first"
    )
    protected: list[str] = Field(
        default_factory=list,
        max_length=MAX_PROTECTED,
        description="'<namespace>/<name> (why)' of copies on the node the operator would not offer (pinned, in "
        "use): only for the message when the copy cannot fit",
    )
    protected_more: int = Field(default=0, ge=0, description="protected copies left out of `protected`")
    namespace_budget_bytes: Bytes | None = Field(
        default=None,
        description="bytes the copies of the Job's own namespace may take under the root (allocated, as du counts, "
        "with that namespace's reservations); None: no budget. Only that namespace's candidates bring it down.",
    )

    @field_validator("root")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or "/../" in f"{v}/" or "/./" in f"{v}/":
            raise ValueError(f"root {v!r} must be a clean absolute path")
        return v

    @field_validator("candidates")
    @classmethod
    def _copy_keys(cls, v: list[str]) -> list[str]:
        for key in v:
            if not COPY_KEY.match(key):
                raise ValueError(f"candidate {key!r} is not <namespace>/<name> of a ModelCache")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> CapacityRequest:
        if not self.low_watermark < self.high_watermark:
            raise ValueError(f"low_watermark {self.low_watermark} must be below high_watermark {self.high_watermark}")
        return self

    def to_env(self) -> dict[str, str]:
        return {ENV_NODE_CAPACITY: json.dumps(self.model_dump(mode="json"), separators=(",", ":"))}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CapacityRequest | None:
        text = environ.get(ENV_NODE_CAPACITY)
        if not text:
            return None
        try:
            return cls.model_validate_json(text)
        except ValueError as e:
            raise ValueError(f"{ENV_NODE_CAPACITY} is not a valid node budget: {e}") from None


class EvictedCopy(BaseModel):
    model_config = ConfigDict(extra="ignore")

    copy_key: str = Field(description="<namespace>/<name> of the evicted copy")
    bytes: int = Field(description="bytes its files occupied on disk (allocated blocks)")


class CapacityReport(BaseModel):
    """The node path's filesystem as the Job last measured it (statvfs, as `df` reports it) and what it evicted.

    `used_bytes` is df's Used, `free_bytes` df's Avail (what an unprivileged writer can still use); the
    watermarks are percentages of `used_bytes + free_bytes`, which is what df's Use% divides by.
    """

    model_config = ConfigDict(extra="ignore")

    policy: str = ""
    size_bytes: int = 0
    used_bytes: int = 0
    free_bytes: int = 0
    needed_bytes: int = Field(default=0, description="what the copy still had to write when it was planned")
    high_bytes: int = Field(default=0, description="used bytes the high watermark allows")
    low_bytes: int = Field(default=0, description="used bytes the low watermark aims eviction at")
    evicted: list[EvictedCopy] = Field(default_factory=list)
    namespace_used_bytes: int | None = Field(
        default=None, description="with a namespace budget: bytes the namespace's copies took when planned"
    )
    namespace_budget_bytes: int | None = Field(default=None, description="the namespace's budget, when it has one")
