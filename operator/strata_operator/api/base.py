"""Base model for CRD types: camelCase on the wire, snake_case in Python, unknown fields rejected."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import CoreSchema
from strata_units import BYTE_SIZE_PATTERN, BYTE_SIZE_SPELLING, SizeField


class CRDModel(BaseModel):
    """Every spec/status model derives from this so the CRD schema and the parser agree on field names."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_k8s(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class PullPolicy(StrEnum):
    """core/v1 imagePullPolicy."""

    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class Condition(CRDModel):
    """A Kubernetes-style condition (the shape kstatus, Flux and Argo CD read)."""

    type: str = Field(description="What the condition is about, in CamelCase, e.g. Ready or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        max_length=1024,
        description="Why the condition has this status, as one CamelCase word meant for tools, e.g. InvalidSpec.",
    )
    message: str = Field(
        default="", max_length=32768, description="The same for people: what happened and what to change."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation of the spec this condition was computed from."
    )
    last_transition_time: str = Field(
        description="When status last changed (RFC 3339, e.g. 2026-01-31T12:00:00Z); not touched while it holds."
    )


DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class SecretRef(CRDModel):
    """A Secret in the resource's namespace: the only way credentials enter a spec."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the Secret, in the resource's namespace (e.g. hf-token).",
    )


class SecretKeyRef(SecretRef):
    """A Secret in the resource's namespace, and optionally one key of it."""

    key: str | None = Field(default=None, description="Key inside the Secret; all keys when omitted.")


def cel(rule: str, message: str, *, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; the message is what `kubectl apply` shows the user."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry


BYTE_SIZE_UNITS = (
    "an integer, or one with a suffix Ki, Mi, Gi, Ti, Pi, Ei (powers of 1024) or k, M, G, T, P, E (powers of "
    "1000); no fractions, no m"
)
"""For descriptions of byte-size fields, so `kubectl explain` says how to write one."""

NON_ZERO_PATTERN = "[1-9]"
"""A size matching BYTE_SIZE_PATTERN is above 0 exactly when one of its digits is (suffixes have none)."""


BYTE_SIZE_MAX_LENGTH = 32
"""Characters of a byte size written as a string: more than any size up to 2**64 with its suffix."""


@dataclass(frozen=True)
class WholeBytes:
    """Marks a spec field as a byte size: `Annotated[ByteSize, WholeBytes("l1.size", text=True)]` for a string
    field, without `text` for int-or-string.

    The value is parsed once, here, into a `ByteSize` (an int that keeps its spelling): builders do arithmetic on
    it and never read the text again, and the object serialises back exactly as the user wrote it (the API server
    stores it so; `spelling` is what a message quotes). The CRD gets BYTE_SIZE_PATTERN and CEL rules whose
    messages say what to write; the model reads the value with the same parser as the loader and the KV server,
    so a spec stored under an older CRD is refused as well. Defaults must be `ByteSize` values, so that the CRD's
    default is written as given."""

    field: str
    minimum: Literal[0, 1] = 1
    """1 where a size must be positive; 0 where 0 has a meaning of its own (say so in the description)."""
    text: bool = False
    """A string field (`type: string`) rather than int-or-string."""

    @property
    def size_field(self) -> SizeField:
        return SizeField(minimum=self.minimum, strict=True, text_only=self.text, written="as_given")

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return self.size_field.__get_pydantic_core_schema__(source, handler)

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        json_schema: dict[str, Any] = (
            {"type": "string"} if self.text else {"anyOf": [{"type": "integer"}, {"type": "string"}]}
        )
        json_schema["pattern"] = BYTE_SIZE_PATTERN
        # Bounds the CEL rules' cost (the API server refuses a CRD whose estimate has no bound, as in a list).
        json_schema["maxLength"] = BYTE_SIZE_MAX_LENGTH
        json_schema["x-kubernetes-validations"] = self.rules(int_or_string=not self.text)
        return json_schema

    def rules(self, *, int_or_string: bool) -> list[dict[str, str]]:
        above = " above 0" if self.minimum else ""
        spelled = f"must be a whole number of bytes{above}: {BYTE_SIZE_SPELLING}; not a fraction such as 1.5Gi"
        spelled += " nor milli such as 500m"
        pattern = cel_string(BYTE_SIZE_PATTERN)
        if int_or_string:
            number = "self > 0" if self.minimum else "self >= 0"
            text = f"self.matches({pattern})" + (f" && self.matches('{NON_ZERO_PATTERN}')" if self.minimum else "")
            return [cel(f"type(self) == int ? {number} : {text}", f"{self.field} {spelled}")]
        rules = [cel(f"self.matches({pattern})", f"{self.field} {spelled}")]
        if self.minimum:
            rules.append(cel(f"self.matches('{NON_ZERO_PATTERN}')", f"{self.field} must be greater than 0"))
        return rules


SYSTEM_DIRECTORY_PATTERN = (
    r"^(/|/var|/var/lib|/(bin|boot|dev|etc|lib|lib32|lib64|libx32|proc|root|run|sbin|sys|usr"
    r"|var/run|var/log|var/lib/(kubelet|containerd|docker|etcd|rancher))(/.*)?)$"
)
"""Host directories a Strata pod must never be given writable: the root, the system's own trees, the kubelet's
and container runtimes' state, and everything inside them; also `/var` and `/var/lib`, which hold some of those
one or two levels down (a copy lands in `<path>/<namespace>/<name>`, so `/var/lib` with namespace `kubelet`
would be the kubelet's own directory)."""
UNCLEAN_SEGMENT_PATTERN = r"(^|/)[.][.]?(/|$)"
"""A `.` or `..` segment: the path would not mean what it says, and could step around the list above."""

HOST_PATH_CLEAN = "must be a clean absolute path: no '.' or '..' segment, no '//' and no trailing '/'"
HOST_PATH_NOT_SYSTEM = (
    "must not be a system directory or inside one (/, /etc, /usr, /boot, /dev, /proc, /sys, /run, /root, /var, "
    "/var/lib, /var/lib/kubelet, /var/lib/containerd, ...): it is mounted writable and removed from on clean-up; "
    "use a dedicated directory such as /var/lib/strata/models or /mnt/nvme/strata"
)
HOST_PATH_RULES = (
    " Refused: system directories and anything inside them (/, /etc, /usr, /boot, /dev, /proc, /sys, /run, /root, "
    "/var, /var/lib, /var/lib/kubelet, /var/lib/containerd, /var/lib/docker, ...) and paths with a '.' or '..' "
    "segment, '//' or a trailing '/'."
)
"""Appended to the description of every host path field, so `kubectl explain` says what is refused."""


def _host_directory(path: str) -> str:
    """The model's side of the CEL rules below, so a spec stored under an older CRD is refused as well."""
    if path != "/" and (path.endswith("/") or "//" in path or re.search(UNCLEAN_SEGMENT_PATTERN, path)):
        raise ValueError(f"{path!r} {HOST_PATH_CLEAN}")
    if re.fullmatch(SYSTEM_DIRECTORY_PATTERN, path):
        raise ValueError(f"{path!r} {HOST_PATH_NOT_SYSTEM}")
    return path


HostDirectory = Annotated[
    str,
    Field(
        pattern=r"^/",
        max_length=4096,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self == '/' || (!self.endsWith('/') && !self.contains('//') "
                    f"&& !self.matches('{UNCLEAN_SEGMENT_PATTERN}'))",
                    HOST_PATH_CLEAN,
                ),
                cel(f"!self.matches('{SYSTEM_DIRECTORY_PATTERN}')", HOST_PATH_NOT_SYSTEM),
            ]
        },
    ),
    AfterValidator(_host_directory),
]
"""An absolute directory on a node that a Strata pod mounts writable (hostPath)."""


_AUTHORITY = r"^https?://([^/?#]*@)?"
_HOST_END = r"([:/?#]|$)"
LINK_LOCAL_ENDPOINT_PATTERN = (
    rf"(?i){_AUTHORITY}(169[.]254[.]|\[(fe[89ab][0-9a-f]:|[^\]/]*:ffff:(169[.]254[.]|a9fe:)|fd00:ec2::254\])"
    rf"|(metadata[.]google[.]internal|metadata[.]goog|instance-data([.]ec2[.]internal)?)[.]?{_HOST_END})"
)
"""An endpoint URL whose host is a link-local address or a cloud metadata service: 169.254.0.0/16 (also as
IPv4-mapped IPv6, or as the first labels of a name such as 169.254.169.254.nip.io), fe80::/10, AWS's
fd00:ec2::254, and the metadata names of GCP and AWS. Only what the URL spells out can be checked; a DNS name
resolving to such an address needs a NetworkPolicy. Read on the URL itself, not a parsed host: the API server's
cost estimate bounds a regex on a field with maxLength, not on what `url()` returns."""
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
NUMERIC_ENDPOINT_PATTERN = rf"(?i){_AUTHORITY}(0x[0-9a-f]*|[0-9]+)([.](0x[0-9a-f]*|[0-9]+)){{0,3}}[.]?{_HOST_END}"
"""An endpoint whose host the C resolver reads as an IPv4 address (decimal, octal, hex, fewer than four parts)."""
DOTTED_QUAD_ENDPOINT_PATTERN = rf"{_AUTHORITY}({_OCTET}[.]){{3}}{_OCTET}{_HOST_END}"
"""The one spelling of an IPv4 host the link-local pattern can read."""

ENDPOINT_DOTTED_QUAD = (
    "must write an IPv4 address in plain dotted-decimal form (e.g. http://10.0.0.5:9000): other spellings "
    "(2852039166, 0xa9fea9fe, 0251.0376.0251.0376) can hide a link-local address"
)


def cel_string(text: str) -> str:
    """`text` as a single-quoted CEL string literal (regexes with backslashes included)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def endpoint_link_local_message(field: str, who: str) -> str:
    return (
        f"{field}.endpoint points at a link-local or cloud metadata address (169.254.0.0/16, fe80::/10, "
        f"metadata.google.internal, ...), where {who} would send its requests and credentials to the node's "
        f"metadata service; use the object store's own address, or set {field}.allowLinkLocal: true if it "
        "really is served there"
    )


def endpoint_rules(field: str, who: str) -> list[dict[str, str]]:
    """CEL rules of an S3 options object with `endpoint` and `allowLinkLocal` (`field` is its path in the spec)."""
    return [
        cel(
            f"!has(self.endpoint) || !self.endpoint.matches({cel_string(NUMERIC_ENDPOINT_PATTERN)}) "
            f"|| self.endpoint.matches({cel_string(DOTTED_QUAD_ENDPOINT_PATTERN)})",
            f"{field}.endpoint {ENDPOINT_DOTTED_QUAD}",
            field_path=".endpoint",
        ),
        cel(
            "(has(self.allowLinkLocal) && self.allowLinkLocal) || !has(self.endpoint) "
            f"|| !self.endpoint.matches({cel_string(LINK_LOCAL_ENDPOINT_PATTERN)})",
            endpoint_link_local_message(field, who),
            field_path=".endpoint",
        ),
    ]


def endpoint_problem(endpoint: str | None, allow_link_local: bool, field: str, who: str) -> str | None:
    """The models' side of `endpoint_rules` (the same regexes), so a spec stored under an older CRD is refused too."""
    if endpoint is None:
        return None
    if re.search(NUMERIC_ENDPOINT_PATTERN, endpoint) and not re.search(DOTTED_QUAD_ENDPOINT_PATTERN, endpoint):
        return f"{field}.endpoint {ENDPOINT_DOTTED_QUAD}"
    if not allow_link_local and re.search(LINK_LOCAL_ENDPOINT_PATTERN, endpoint):
        return endpoint_link_local_message(field, who)
    return None


class S3Endpoint(CRDModel):
    """Where an S3 client sends its requests: an endpoint (AWS when omitted), a region, and the refusal of link-local
    and metadata addresses. ModelCache's `source.s3` and KVCacheTier's `l2.s3` are this with fields of their own;
    a subclass names its path in the spec and who sends the requests, for the rules' messages."""

    FIELD: ClassVar[str]
    WHO: ClassVar[str]

    endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://.+",
        max_length=2048,
        description="S3-compatible endpoint URL (MinIO, Ceph, R2); AWS when omitted. Link-local and cloud metadata "
        "addresses are refused unless allowLinkLocal is set; IPv4 addresses must be written dotted-decimal.",
    )
    region: str | None = Field(
        default=None,
        max_length=64,
        description="Region of the bucket, e.g. us-east-1; the client's default (AWS_REGION) when omitted.",
    )
    allow_link_local: bool = Field(
        default=False,
        description="Allow an endpoint on a link-local or cloud metadata address (169.254.0.0/16, fe80::/10, "
        "metadata.google.internal). Refused by default: requests and credentials sent there reach the node's "
        "metadata service, not an object store.",
    )

    @model_validator(mode="after")
    def _endpoint_is_no_metadata_service(self) -> S3Endpoint:
        if problem := endpoint_problem(self.endpoint, self.allow_link_local, self.FIELD, self.WHO):
            raise ValueError(problem)
        return self
