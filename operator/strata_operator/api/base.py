"""Base model for CRD types: camelCase on the wire, snake_case in Python, unknown fields rejected."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


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

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    observed_generation: int | None = Field(default=None, ge=0)
    last_transition_time: str


class SecretKeyRef(CRDModel):
    """A key of a Secret in the resource's namespace: the only way credentials enter a spec."""

    name: str = Field(min_length=1, max_length=253)
    key: str | None = Field(default=None, description="Key inside the Secret; all keys when omitted.")


def cel(rule: str, message: str, *, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; the message is what `kubectl apply` shows the user."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry


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
