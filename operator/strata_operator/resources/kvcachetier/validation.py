"""Checks the API server cannot make: does the config fit the selected nodes, do its Secrets and claim exist?

Pure: the handler fetches nodes, Secrets and the claim; these functions only judge them, so every
bad-input case is unit-tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_operator.api.kvcachetier import ConnectorType, KVCacheTierSpec
from strata_operator.resources.core import Problem
from strata_operator.resources.kvcachetier.daemonset import derived_memory_request, memory_request_bytes
from strata_operator.resources.kvcachetier.names import AUTH_FILE, memory_quantity, quantity_bytes

S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
DAEMONSET_TOLERATED_PREFIX = "node.kubernetes.io/"
"""The DaemonSet controller adds tolerations for these node-condition taints by itself."""


@dataclass
class ClusterFacts:
    """What the handler read from the API server for one reconcile."""

    nodes: Sequence[Mapping[str, Any]] = field(default_factory=list)
    secrets: dict[str, Mapping[str, Any] | None] = field(default_factory=dict)
    """Secret name -> its `data` keys (values blanked), None when the Secret does not exist."""
    existing_claim: Mapping[str, Any] | None = None
    claim_checked: bool = False
    socket_driver: Mapping[str, Any] | None = None
    """The CSIDriver `spec.nodeSocket.driver` names, None when there is none."""
    socket_driver_checked: bool = False


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' toleration matching for one taint."""
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        operator = toleration.get("operator", "Equal")
        key = toleration.get("key")
        if operator == "Exists" and not key:
            return True
        if key != taint.get("key"):
            continue
        if operator == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_selected(spec: KVCacheTierSpec, node: Mapping[str, Any]) -> bool:
    """Would the DaemonSet place a server here? nodeSelector and taints; affinity is left to the scheduler."""
    labels = node.get("metadata", {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in spec.node_selector.items()):
        return False
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if taint.get("key", "").startswith(DAEMONSET_TOLERATED_PREFIX):
            continue
        if not tolerates(spec.tolerations, taint):
            return False
    return True


def _allocatable_memory(node: Mapping[str, Any]) -> int:
    memory = (node.get("status", {}).get("allocatable") or {}).get("memory")
    return quantity_bytes(memory) if memory else 0


def check_node_memory(spec: KVCacheTierSpec, nodes: Sequence[Mapping[str, Any]]) -> Problem | None:
    """L1 plus headroom must fit on at least one selected node, or no server can ever be scheduled."""
    if not nodes:
        return None
    need = memory_request_bytes(spec)
    largest = max(_allocatable_memory(n) for n in nodes)
    if need <= largest:
        return None
    return Problem(
        "L1ExceedsNodeMemory",
        f"each server requests {memory_quantity(need)} of memory (l1.size {spec.l1.size.spelling} + headroom), "
        f"more than any of the {len(nodes)} selected nodes can allocate (largest: {memory_quantity(largest)}); "
        "lower l1.size or select bigger nodes",
    )


def nodes_too_small(spec: KVCacheTierSpec, nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Selected nodes where a server cannot fit (a warning when others can)."""
    need = memory_request_bytes(spec)
    return sorted(n["metadata"]["name"] for n in nodes if _allocatable_memory(n) < need)


def _check_secret(facts: ClusterFacts, name: str, keys: Iterable[str], field_path: str, reason: str) -> Problem | None:
    data = facts.secrets.get(name)
    if data is None:
        return Problem("SecretNotFound", f"Secret {name!r} ({field_path}) does not exist in this namespace")
    missing = [k for k in keys if k not in data]
    if missing:
        return Problem(reason, f"Secret {name!r} ({field_path}) has no key(s) {', '.join(missing)}")
    return None


def check_secrets(spec: KVCacheTierSpec, facts: ClusterFacts) -> list[Problem]:
    problems = []
    if (ref := spec.auth.secret_ref) is not None:
        problem = _check_secret(facts, ref.name, [ref.key or AUTH_FILE], "spec.auth.secretRef", "SecretKeyMissing")
        if problem:
            problems.append(problem)
    s3 = spec.l2.s3 if spec.l2 else None
    if s3 is not None and s3.secret_ref is not None:
        keys = [s3.secret_ref.key] if s3.secret_ref.key else list(S3_KEYS)
        problem = _check_secret(facts, s3.secret_ref.name, keys, "spec.l2.s3.secretRef", "S3CredentialsIncomplete")
        if problem:
            problems.append(problem)
    return problems


def check_existing_claim(spec: KVCacheTierSpec, facts: ClusterFacts) -> Problem | None:
    """An existing L2 claim must be ReadWriteMany: every node's server mounts it at once."""
    fs = spec.l2.fs if spec.l2 else None
    if fs is None or fs.pvc is None or fs.pvc.claim_name is None or not facts.claim_checked:
        return None
    name = fs.pvc.claim_name
    if facts.existing_claim is None:
        return Problem("PVCNotFound", f"PersistentVolumeClaim {name!r} (spec.l2.fs.pvc.claimName) does not exist")
    modes = facts.existing_claim.get("spec", {}).get("accessModes") or []
    if "ReadWriteMany" not in modes:
        return Problem(
            "PVCNotReadWriteMany",
            f"PersistentVolumeClaim {name!r} has access modes {modes}; the servers on every node mount it, "
            "so it must be ReadWriteMany (use a shared filesystem class, or l2.fs.hostPath for node NVMe)",
        )
    return None


RESOURCE_KEYS = ("limits", "requests", "claims")
AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")


def _quantity_problem(where: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return f"{where} is {type(value).__name__} {value!r}, not a quantity (e.g. 4Gi, 500m, 2)"
    try:
        quantity_bytes(value if isinstance(value, str | int) else str(value))
    except (ValueError, ArithmeticError):
        return f"{where} {value!r} is not a Kubernetes quantity (e.g. 4Gi, 500m, 2)"
    return None


def check_resources(spec: KVCacheTierSpec) -> Problem | None:
    """spec.resources must be a core/v1 ResourceRequirements the builders can read, with room for L1.

    The CRD keeps it free-form, so without this a typo reached the DaemonSet builder (a traceback every few
    seconds) or the API server (a refusal with no status).
    """
    resources = spec.resources or {}
    found = []
    for key, value in resources.items():
        if key not in RESOURCE_KEYS:
            found.append(f"spec.resources.{key} is not a field of ResourceRequirements ({', '.join(RESOURCE_KEYS)})")
        elif key != "claims" and not isinstance(value, Mapping):
            found.append(f"spec.resources.{key} must be a map of resource name to quantity, not {value!r}")
        elif key != "claims":
            found += [p for name, q in value.items() if (p := _quantity_problem(f"spec.resources.{key}.{name}", q))]
    if found:
        return Problem("ResourcesInvalid", "; ".join(found))
    limit = (resources.get("limits") or {}).get("memory")
    l1, wanted = spec.l1.size, derived_memory_request(spec)
    if limit is not None and quantity_bytes(limit) < l1:
        return Problem(
            "MemoryLimitBelowL1",
            f"resources.limits.memory {limit} ({quantity_bytes(limit)} bytes) is below l1.size {spec.l1.size.spelling} "
            f"({l1} bytes): a full L1 would be OOM-killed; raise the limit to at least l1.size + memoryHeadroom "
            f"({memory_quantity(wanted)}) or lower l1.size",
        )
    return None


def check_affinity(spec: KVCacheTierSpec) -> Problem | None:
    """spec.affinity must be shaped as a core/v1 Affinity (the API server answers a mistyped one with a 500)."""
    found = []
    for key, value in (spec.affinity or {}).items():
        if key not in AFFINITY_KEYS:
            found.append(f"spec.affinity.{key} is not a field of Affinity ({', '.join(AFFINITY_KEYS)})")
        elif not isinstance(value, Mapping):
            found.append(f"spec.affinity.{key} must be an object, not {type(value).__name__} {value!r}")
    return Problem("AffinityInvalid", "; ".join(found)) if found else None


def check_client_shm(spec: KVCacheTierSpec) -> Problem | None:
    """vLLM allocates its CPU tier (connector.cpuBytes) in /dev/shm and refuses to start when it does not fit."""
    if spec.connector.type != ConnectorType.VLLM or spec.client_shm_size is None:
        return None
    if spec.client_shm_size >= spec.connector.cpu_bytes:
        return None
    return Problem(
        "ShmTooSmall",
        f"spec.clientShmSize ({spec.client_shm_size.spelling}) is below spec.connector.cpuBytes "
        f"({spec.connector.cpu_bytes.spelling}): "
        "vLLM allocates its CPU tier in /dev/shm and would fail to start; raise clientShmSize (cpuBytes + 1Gi), or "
        "remove it to get that default",
    )


def check_socket_driver(spec: KVCacheTierSpec, facts: ClusterFacts) -> Problem | None:
    """Without the CSI driver every server pod would wait in ContainerCreating with a kubelet event nobody reads;
    without `podInfoOnMount` the driver cannot learn the pod's namespace, which is what keeps one namespace's pods
    off another's socket; without the Ephemeral mode the API server cannot use it inline."""
    if not spec.node_socket.enabled or not facts.socket_driver_checked:
        return None
    name = spec.node_socket.driver
    if facts.socket_driver is None:
        return Problem(
            "SocketDriverMissing",
            f"spec.nodeSocket.driver {name} is not installed (no CSIDriver of that name): install the chart with "
            "kvSocketDriver.enabled=true, or set spec.nodeSocket.enabled false",
        )
    driver_spec = facts.socket_driver.get("spec") or {}
    if not driver_spec.get("podInfoOnMount") or "Ephemeral" not in (driver_spec.get("volumeLifecycleModes") or []):
        return Problem(
            "SocketDriverUnsuitable",
            f"CSIDriver {name} must have podInfoOnMount: true and volumeLifecycleModes [Ephemeral] to publish a "
            "per-namespace socket directory inline: use the chart's kvSocketDriver, or another driver name",
        )
    return None


def validate(spec: KVCacheTierSpec, facts: ClusterFacts) -> list[Problem]:
    """Every problem, in a stable order (the first one names the ConfigValid reason).

    A spec whose own fields are malformed is reported alone: the checks against nodes need its quantities.
    """
    if shape := [p for p in (check_resources(spec), check_affinity(spec)) if p]:
        return shape
    checks = (
        check_node_memory(spec, facts.nodes),
        check_existing_claim(spec, facts),
        check_client_shm(spec),
        check_socket_driver(spec, facts),
    )
    problems = [p for p in checks if p]
    return problems + check_secrets(spec, facts)
