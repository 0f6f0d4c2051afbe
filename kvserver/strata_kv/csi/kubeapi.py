"""The few reads the plugin makes from the Kubernetes API (a pod, a DaemonSet, a KVCacheTier), over HTTPS with
the standard library: the runtime image carries no Kubernetes client for three GETs.

In a pod it finds the API server the way every in-cluster client does (`KUBERNETES_SERVICE_HOST`, the service
account's token and CA under /var/run/secrets/kubernetes.io/serviceaccount); `--api-server`, `--api-token-file`
and `--api-ca-file` override them. The token file is read for every request: a projected token rotates.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT_SECONDS = 10.0


class APIError(OSError):
    """The API server could not answer (unreachable, 5xx, a malformed reply): the gRPC answer is UNAVAILABLE, and
    the kubelet retries."""


class APIForbidden(APIError):
    """The plugin's service account may not read what it must (the chart's ClusterRole is missing a rule)."""


@dataclass(frozen=True)
class APISettings:
    server: str
    token_file: str
    ca_file: str

    @classmethod
    def in_cluster(cls, server: str = "", token_file: str = "", ca_file: str = "") -> APISettings:
        """The flags where given, else what a pod's environment says; SystemExit naming what is missing."""
        if not server:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise SystemExit(
                    "strata-kv-csi: no API server: the plugin checks every pod it publishes for with the API server; "
                    "run it in a pod (KUBERNETES_SERVICE_HOST) or pass --api-server, --api-token-file, --api-ca-file"
                )
            server = f"https://{f'[{host}]' if ':' in host else host}:{port}"
        token_file = token_file or os.path.join(SERVICE_ACCOUNT_DIR, "token")
        ca_file = ca_file or os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")
        for what, path in (("token", token_file), ("CA", ca_file)):
            if not os.path.isfile(path):
                raise SystemExit(
                    f"strata-kv-csi: the API {what} file {path} does not exist (the chart mounts the plugin's "
                    "service account token; give --api-token-file/--api-ca-file elsewhere)"
                )
        return cls(server.rstrip("/"), token_file, ca_file)


class KubeAPI:
    """GETs of single objects; nothing is listed or watched, so the plugin's RBAC is `get` only."""

    def __init__(self, settings: APISettings) -> None:
        self.settings = settings
        # Straight to the API server: a proxy from the environment has no business between the two.
        self._open = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=settings.ca_file)),
        ).open

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path` (e.g. /api/v1/namespaces/a/pods/p), or None when it does not exist."""
        with open(self.settings.token_file) as token:
            bearer = token.read().strip()
        request = urllib.request.Request(
            self.settings.server + urllib.parse.quote(path),
            headers={"Authorization": f"Bearer {bearer}", "Accept": "application/json"},
        )
        try:
            with self._open(request, timeout=TIMEOUT_SECONDS) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            detail = error.read(500).decode(errors="replace")
            if error.code in (401, 403):
                raise APIForbidden(
                    f"the API server refused GET {path} ({error.code}): the plugin's service account needs the "
                    f"chart's kv-socket-driver ClusterRole; {detail}"
                ) from None
            raise APIError(f"GET {path}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise APIError(f"GET {path} from {self.settings.server}: {error}") from None
        if not isinstance(body, dict):
            raise APIError(f"GET {path}: the reply is not an object")
        return body

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def daemonset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")

    def kv_cache_tier(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(f"/apis/strata.dev/v1alpha1/namespaces/{namespace}/kvcachetiers/{name}")
