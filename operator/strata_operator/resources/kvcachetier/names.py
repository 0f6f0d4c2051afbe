"""Names, labels and quantities shared by the KVCacheTier builders (one place, so they never disagree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes.utils.quantity import parse_quantity
from strata_units import parse_bytes

from strata_operator.resources.core import Owner

COMPONENT = "kvserver"
APP_NAME = "strata-kv"
NAME_LABEL = "app.kubernetes.io/name"
CONFIG_HASH_ANNOTATION = "strata.dev/config-hash"
CONFIG_DIR = "/etc/strata-kv"
AUTH_DIR = "/var/run/secrets/strata-kv"
AUTH_FILE = "token"
L2_FS_ROOT = "/var/lib/strata-kv/l2"
RESP_PORT_NAME = "resp"
METRICS_PORT_NAME = "metrics"
EVENTS_PORT_NAME = "kv-events"
KIND = "KVCacheTier"


@dataclass(frozen=True)
class TierRef(Owner):
    """The owning KVCacheTier, with the names of its children."""

    KIND = KIND
    COMPONENT = COMPONENT

    @property
    def daemonset(self) -> str:
        return self.name

    @property
    def service(self) -> str:
        return self.name

    @property
    def config_map(self) -> str:
        return f"{self.name}-config"

    @property
    def connection_config_map(self) -> str:
        return f"{self.name}-connection"

    @property
    def created_pvc(self) -> str:
        return f"{self.name}-l2"

    @property
    def generated_token_secret(self) -> str:
        return f"{self.name}-kv-token"

    def selector_labels(self) -> dict[str, str]:
        """The DaemonSet selector: immutable, so it never grows beyond these."""
        return {NAME_LABEL: APP_NAME, **self.ownership_labels()}

    def metadata(self, name: str, **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": self.selector_labels(),
            "ownerReferences": [self.reference()],
            **extra,
        }


def byte_size(value: str | int) -> int:
    """Bytes of a size field of the spec (l1.size, memoryHeadroom, l2.fs.capacity): read by the parser the CRD's
    pattern, the loader and the KV server share, so the server is configured with what the user wrote."""
    return parse_bytes(value, minimum=0, strict=True)


def quantity_bytes(value: str | int) -> int:
    """Bytes of a core/v1 memory quantity (container resources, node allocatable), which Kubernetes lets be
    fractional or milli (`1.5Gi`, `1e9`); rounds up, as a request must not shrink. Not for Strata's own sizes."""
    parsed = parse_quantity(value)
    whole = int(parsed)
    return whole if whole == parsed else whole + 1


def mebibytes(n: int) -> str:
    """A quantity rounded up to whole Mi, in Gi when exact: stable text, readable in `kubectl describe`."""
    mib = -(-n // 1024**2)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"
