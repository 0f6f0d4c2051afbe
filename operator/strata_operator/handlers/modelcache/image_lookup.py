"""ImageVolume's one read outside the API server: the registry's answer to "which digest does this tag name
now, and how large is it", with the cache's pull Secret and CA bundle (`resources/modelcache/image.py` decides
when to ask and what the answer means).

The client is the loader's (`strata_loader.registry`): the one `strata-loader pack` pushes with.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from strata_loader import registry

from strata_operator import kube
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.image import ImageLookup

TIMEOUT_SECONDS = 20.0
DOCKER_CONFIG_TYPE = "kubernetes.io/dockerconfigjson"
DOCKER_CONFIG_KEY = ".dockerconfigjson"


class _Unusable(Exception):
    """A pull Secret or CA bundle the operator cannot use; `failure` is an `image.REASONS` key."""

    def __init__(self, failure: str, message: str) -> None:
        super().__init__(message)
        self.failure = failure


def look_up(spec: ModelCacheSpec, namespace: str, platform: str) -> ImageLookup:
    """Resolve the spec's reference in its registry (blocking, bounded by TIMEOUT_SECONDS per request)."""
    wanted = storage.image_reference(spec)

    def failed(failure: str, message: str, transient: bool = False) -> ImageLookup:
        return ImageLookup(wanted, platform, failure=failure, message=message, transient=transient)

    host = wanted.partition("/")[0]
    try:
        reference = registry.ImageReference.parse(wanted)
        credentials = _credentials(spec, namespace, reference.registry)
        ca_data = _ca_bundle(spec, namespace)
        with registry.RegistryClient(
            reference.registry,
            ca_data=ca_data,
            username=credentials[0] if credentials else None,
            password=credentials[1] if credentials else None,
            timeout=TIMEOUT_SECONDS,
            actions="pull",
            credentials_hint="name a kubernetes.io/dockerconfigjson Secret in storage.imageVolume.pullSecretRef",
        ) as client:
            found = registry.resolve(client, reference, platform)
    except registry.ReferenceError as error:
        return failed("NotFound", str(error))
    except _Unusable as error:
        return failed(error.failure, str(error))
    except registry.RegistryError as error:
        return failed(error.reason, str(error), error.transient)
    except OSError as error:  # TLS failures (an untrusted certificate) and the like
        return failed("Unreachable", f"{host}: {error}", transient=True)
    return ImageLookup(
        wanted,
        platform,
        digest=found.digest,
        reference=found.pinned,
        platform_digest=found.platform_digest,
        size_bytes=found.size_bytes,
        layers=found.layers,
    )


def _credentials(spec: ModelCacheSpec, namespace: str, host: str) -> tuple[str, str] | None:
    ref = storage.image_volume(spec).pull_secret_ref
    if ref is None:
        return None
    secret = kube.read("v1", "Secret", ref.name, namespace)
    where = f"Secret {ref.name!r} (storage.imageVolume.pullSecretRef) in namespace {namespace!r}"
    if secret is None:
        raise _Unusable("Credentials", f"{where} does not exist: create it (type {DOCKER_CONFIG_TYPE})")
    if secret.get("type") != DOCKER_CONFIG_TYPE or DOCKER_CONFIG_KEY not in (secret.get("data") or {}):
        raise _Unusable(
            "Credentials",
            f"{where} is of type {secret.get('type')!r}; it must be {DOCKER_CONFIG_TYPE} with the key "
            f"{DOCKER_CONFIG_KEY} (kubectl create secret docker-registry), which the kubelet reads too",
        )
    try:
        config: dict[str, Any] = json.loads(base64.b64decode(secret["data"][DOCKER_CONFIG_KEY]))
        found = registry.docker_config_credentials(config, host)
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        raise _Unusable("Credentials", f"{where}: {DOCKER_CONFIG_KEY} is not valid JSON auths ({error})") from None
    if found is None:
        raise _Unusable("Credentials", f"{where} has no credentials for {host} in its auths")
    return found


def _ca_bundle(spec: ModelCacheSpec, namespace: str) -> str | None:
    ref = storage.image_volume(spec).ca_config_map_ref
    if ref is None:
        return None
    where = f"ConfigMap {ref.name!r} (storage.imageVolume.caConfigMapRef) in namespace {namespace!r}"
    config_map = kube.read("v1", "ConfigMap", ref.name, namespace)
    if config_map is None:
        raise _Unusable("Trust", f"{where} does not exist")
    bundle = (config_map.get("data") or {}).get(ref.key)
    if not bundle or "BEGIN CERTIFICATE" not in bundle:
        raise _Unusable("Trust", f"{where} has no PEM certificate under the key {ref.key!r}")
    return str(bundle)
