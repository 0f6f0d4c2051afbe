"""What the reconciles of every kind share, once: the owner type, Strata's ownership labels, label selectors, one
stable hash, and the reconcile kit (a `Problem`, the writes a plan lists as `Action`s, the name-conflict check,
the token Secret, the spec refusal and the status patch). Pure (no client, no environment), like everything
under `resources/`; the I/O half of the kit is `handlers/common.py`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self, TypeVar

from pydantic import BaseModel, ValidationError

from strata_operator.api import API_VERSION, GROUP

SpecT = TypeVar("SpecT", bound=BaseModel)
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY = "strata"
MODEL_CACHE_LABEL = f"{GROUP}/model-cache"
"""On a serving pod: the ModelCache it uses (the webhook mounts it; `status.consumers` counts it)."""
KV_TIER_LABEL = f"{GROUP}/kv-cache-tier"
"""On a serving pod: the KVCacheTier it uses."""


@dataclass(frozen=True)
class Owner:
    """A Strata custom resource as its children need it: enough to name, label and own them.

    Each kind subclasses it with its `KIND` and `COMPONENT` (and the names of its own children); the
    ownerReference, the ownership labels and the "did we create this?" test are the same for every kind.
    """

    KIND: ClassVar[str] = ""
    COMPONENT: ClassVar[str] = ""

    name: str
    namespace: str
    uid: str
    generation: int | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        meta = body["metadata"]
        return cls(meta["name"], meta["namespace"], meta.get("uid", ""), meta.get("generation"))

    def reference(self) -> dict[str, Any]:
        """A controller ownerReference, so kube-controller-manager's garbage collector removes the child."""
        return {
            "apiVersion": API_VERSION,
            "kind": self.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def ownership_labels(self) -> dict[str, str]:
        """Strata's managed-by, instance and component labels, on every child."""
        return child_labels(self.name, self.COMPONENT)

    def created(self, live: Mapping[str, Any]) -> bool:
        """Whether this owner made `live`: only then may Strata apply over it (see `created_by_strata`)."""
        return created_by_strata(live, self.uid, self.name, self.COMPONENT)


@dataclass(frozen=True)
class Problem:
    """Why a resource cannot go on as written: `reason` is a condition reason (CamelCase), `message` says what to
    change. Every kind reports its problems with this one type."""

    reason: str
    message: str


def child_labels(owner_name: str, component: str | None = None) -> dict[str, str]:
    labels = {MANAGED_BY_LABEL: MANAGED_BY, INSTANCE_LABEL: owner_name}
    if component:
        labels[COMPONENT_LABEL] = component
    return labels


def created_by_strata(live: Mapping[str, Any], owner_uid: str, owner_name: str, component: str) -> bool:
    """Whether Strata made this object for that owner: its ownerReference (the owner's uid), or, for a child
    kept without one (a claim under deletionPolicy Retain), Strata's managed-by, instance and component labels.

    Anything else of the same name belongs to someone else: applying over it (forced) would take it over, and the
    garbage collector would later delete it with the owner.
    """
    meta = live.get("metadata") or {}
    if any(ref.get("uid") == owner_uid for ref in meta.get("ownerReferences") or []):
        return True
    labels = meta.get("labels") or {}
    return (
        labels.get(MANAGED_BY_LABEL) == MANAGED_BY
        and labels.get(INSTANCE_LABEL) == owner_name
        and labels.get(COMPONENT_LABEL) == component
    )


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field we render already has that value live (server defaults may add more): a child
    that differs only by what the API server added needs no write."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    return bool(desired == live)


def node_not_ready(node: Mapping[str, Any]) -> str | None:
    """Why a Node is not Ready, from its own Ready condition ("<reason>: <message> (since <time>)"), or None when it
    is. A node whose kubelet stopped posting status (powered off, partitioned, restarting) reads `NodeStatusUnknown:
    Kubelet stopped posting node status.`: what status and Events then say about copies and servers on it."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        return "the node has not reported a Ready condition yet"
    if ready.get("status") == "True":
        return None
    why = ": ".join(str(ready[k]) for k in ("reason", "message") if ready.get(k)) or f"Ready is {ready.get('status')}"
    since = ready.get("lastTransitionTime")
    return f"{why} (since {since})" if since else why


def label_selector(labels: Mapping[str, str]) -> str | None:
    """`k=v,k2=v2` (sorted, so the same labels give the same string); None for no labels (select all)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None


def stable_hash(value: Any, *, length: int = 10) -> str:
    """A hex digest of JSON-able data that never depends on dict order (keys sorted) or on the process: names,
    labels and annotations built from it stay the same across operator restarts and versions."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:length]


Event = tuple[str, str, str]
"""(type, reason, message) of a Kubernetes Event on the reconciled object."""


@dataclass(frozen=True)
class Action:
    """One write of a plan: `apply` an object (server-side), or `delete` one of our Jobs. `event` is posted once
    the write succeeded, so a refused write never claims to have happened."""

    verb: Literal["apply", "delete"]
    body: Mapping[str, Any]
    event: Event | None = None

    @property
    def key(self) -> tuple[str, str]:
        return str(self.body["kind"]), str(self.body["metadata"]["name"])


SPEC_INVALID = "InvalidSpec"
"""The condition reason of a spec the operator's model or builders refuse, for every kind."""


def invalid_spec(error: ValidationError) -> Problem:
    """The model's refusal, one `spec.<field>: <what is wrong>` per error (pydantic's text names no fields)."""
    details = "; ".join(
        f"spec.{'.'.join(str(part) for part in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
        for e in error.errors()
    )
    return Problem(SPEC_INVALID, f"{details}; fix the spec, the operator retries when it changes")


def parse_spec(model: type[SpecT], body: Mapping[str, Any]) -> tuple[SpecT | None, Problem | None]:
    """The object's spec as its model, or why the model refuses it (what the CRD let through): every gather
    starts here, so a refused spec is a condition, never an exception retried in a loop."""
    try:
        return model.model_validate(body.get("spec") or {}), None
    except ValidationError as error:
        return None, invalid_spec(error)


def name_conflict(owner: Owner, kind: str, name: str, live: Mapping[str, Any] | None, hint: str = "") -> Problem | None:
    """A child's name taken by an object this owner did not create: applying over it (forced) would take it over,
    and deleting the owner would then garbage-collect it. `hint` names the spec field that avoids the name."""
    if live is None or owner.created(live):
        return None
    return Problem(
        "NameConflict",
        f"{kind} {name!r} already exists in namespace {owner.namespace!r} and was not created by {owner.KIND} "
        f"{owner.name!r}: rename the {owner.KIND}, or rename or delete that {kind}{hint}",
    )


TOKEN_BYTES = 32
"""Random bytes in a generated token (the KV server warns below 16)."""


@dataclass(frozen=True)
class GeneratedToken:
    """A token Secret a plan needs before its children: created once, with a random token the executing handler
    draws (a plan is pure). Immutable, so nothing (the operator included) rewrites a token its clients hold; one
    deleted by hand comes back with a new token and uid. Created, never patched: the operator needs no right to
    rewrite Secrets."""

    metadata: Mapping[str, Any]
    key: str
    hint: str = ""
    """The spec field that avoids the name, for the conflict message (see `name_conflict`)."""

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    def secret(self, token: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": dict(self.metadata),
            "type": "Opaque",
            "immutable": True,
            "stringData": {self.key: token},
        }


def with_consumers(status: dict[str, Any], previous: Mapping[str, Any], consumers: int | None) -> dict[str, Any]:
    """`status` with status.consumers: the live pods that name the object in their opt-in label, as the daemon's
    pod index counts them; None (a reconcile run outside the daemon: a test, the benchmark) keeps the stored one."""
    count = previous.get("consumers") if consumers is None else consumers
    return status if count is None else {**status, "consumers": count}


def status_patch(previous: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """A JSON merge patch from the stored status to the one a reconcile rendered (None for keys to drop), or None
    when nothing changed: a reconcile that changes nothing writes nothing."""
    patch: dict[str, Any] = {k: v for k, v in desired.items() if previous.get(k) != v}
    patch.update({k: None for k in previous if k not in desired})
    return patch or None
