"""Names and labels of a ModelCache's children: deterministic, within Kubernetes' length limits.

A Job's name is also a label value (`batch.kubernetes.io/job-name`), so it must fit in 63 characters; a node
label's name part must too. Long names are shortened and made unique again with a hash of the full name.
"""

from __future__ import annotations

import re

from strata_operator.api import GROUP
from strata_operator.resources.core import stable_hash

MAX_NAME = 63
CACHE_LABEL = f"{GROUP}/modelcache"
"""On every child: the owning ModelCache's name (the owner's namespace is the child's namespace)."""
NODE_LABEL = f"{GROUP}/node"
PRELOAD_HASH_LABEL = f"{GROUP}/preload-hash"
ROLE_LABEL = f"{GROUP}/role"
NODE_LABEL_READY = "Ready"
MODEL_LABEL_PREFIX = f"{GROUP}/model."
"""Node labels Strata owns: `<prefix><namespace>.<name>` (see `node_label_key`)."""

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def bounded_name(*parts: str, limit: int = MAX_NAME) -> str:
    """Join parts with '-'; if too long, keep a prefix and append a hash of the whole so names stay unique."""
    full = "-".join(p for p in parts if p)
    if len(full) <= limit:
        return full
    digest = stable_hash([full], length=8)
    prefix = full[: limit - len(digest) - 1].rstrip("-.")
    return f"{prefix}-{digest}"


def dns_label(*parts: str) -> str:
    """Join parts with '-' into a DNS-1123 label (what a pod's volume name must be: no dots, at most 63).

    A join that already is one is kept, and one that is only too long is shortened as `bounded_name` does. Any
    other (a cache name is a DNS subdomain, dots allowed) has each run of characters a label cannot hold turned
    into '-' and a hash of the original appended, so `a.b` and `a-b` still get different labels.
    """
    full = "-".join(p for p in parts if p)
    if _DNS_LABEL.match(full) and len(full) <= MAX_NAME:
        return full
    cleaned = re.sub(r"[^a-z0-9-]+", "-", full.lower())
    if cleaned == full:
        return bounded_name(full)
    digest = stable_hash([full], length=8)
    prefix = cleaned[: MAX_NAME - len(digest) - 1].strip("-")
    return f"{prefix}-{digest}" if prefix else digest


def claim_name(cache_name: str) -> str:
    """The claim the operator creates for SharedPVC when `claimName` is not given."""
    return bounded_name(cache_name, "model", limit=253)


def preload_job_name(cache_name: str, preload_hash: str) -> str:
    return bounded_name(cache_name, "preload", preload_hash)


def node_job_name(cache_name: str, role: str, node_hash: str) -> str:
    """`role` is preload, prepull or cleanup; `node_hash` already covers the node and the request."""
    return bounded_name(cache_name, role, node_hash)


def node_label_key(namespace: str, cache_name: str) -> str:
    """`strata.dev/model.<namespace>.<name>`: node labels are cluster-wide, so the key names the namespace.

    The part after the slash is limited to 63 characters; longer keys keep a prefix and a hash.
    """
    name_part = bounded_name(f"model.{namespace}.{cache_name}")
    if not _LABEL_NAME.match(name_part):
        raise ValueError(f"node label name {name_part!r} is not a valid label name")
    return f"{GROUP}/{name_part}"


def leftover_annotation_key(namespace: str, cache_name: str) -> str:
    """`strata.dev/leftover.<namespace>.<name>` on a node: a deleted cache's copy that nobody removed (value: its
    path). Like `node_label_key`, bounded to the 63 characters an annotation's name part allows."""
    name_part = bounded_name(f"leftover.{namespace}.{cache_name}")
    if not _LABEL_NAME.match(name_part):
        raise ValueError(f"node annotation name {name_part!r} is not a valid name")
    return f"{GROUP}/{name_part}"
