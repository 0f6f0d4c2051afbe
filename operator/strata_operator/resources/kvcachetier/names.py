"""Names, labels and quantities shared by the KVCacheTier builders (one place, so they never disagree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes.utils.quantity import parse_quantity
from strata_units import format_bytes

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


def quantity_bytes(value: str | int) -> int:
    """Bytes of a core/v1 memory quantity (container resources, node allocatable), which Kubernetes lets be
    fractional or milli (`1.5Gi`, `1e9`); rounds up, as a request must not shrink. Not for Strata's own sizes:
    the spec's sizes are `ByteSize` values already."""
    parsed = parse_quantity(value)
    whole = int(parsed)
    return whole if whole == parsed else whole + 1


def memory_quantity(count: int) -> str:
    """A memory quantity rounded up to whole Mi (`4Gi`, `4097Mi`): stable text, readable in `kubectl describe`."""
    return format_bytes(count, quantity=True, round_up_to=2**20)
