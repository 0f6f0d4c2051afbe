"""The pod admission webhook: a small aiohttp server over TLS that answers AdmissionReviews for pod creation.

Its own server rather than kopf's admission support: the chart owns the MutatingWebhookConfiguration (the
operator needs no rights on webhook configurations), the patch is the exact JSON Patch `resources.serving`
computes, and tests can start and stop it apart from the operator. It reads the ModelCache and KVCacheTier a pod
names at admission time (two GETs), so the gate decision sees the cache as it is now. The certificate files are
re-read when they change (cert-manager or a rotated Secret), without a restart.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.resources.serving import (
    KV_TIER_LABEL,
    MODEL_CACHE_LABEL,
    WiringConflict,
    WiringRequest,
    build_pod_patch,
)

MUTATE_PODS_PATH = "/mutate-pods"
HEALTH_PATH = "/healthz"
DEFAULT_PORT = 9443
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CERT_CHECK_SECONDS = 30.0

log = logging.getLogger(__name__)

Lookup = Callable[[str, str, str], Mapping[str, Any] | None]
"""(kind, namespace, name) → the object as a dict, or None when it does not exist. Blocking; run in a thread."""


def api_lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    found = kube.get(API_VERSION, kind, name, namespace)
    return None if found is None else dict(found.to_dict())


def decide(request: Mapping[str, Any], lookup: Lookup) -> dict[str, Any]:
    """The AdmissionReview response (less its uid) for one request; blocking (it looks objects up)."""
    if request.get("kind", {}).get("kind") != "Pod" or request.get("operation") != "CREATE":
        return {"allowed": True}
    pod = request.get("object") or {}
    wanted = WiringRequest.from_pod(pod)
    if wanted is None:
        return {"allowed": True}
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "default"
    objects: dict[str, Mapping[str, Any]] = {}
    for kind, name, label in (
        ("ModelCache", wanted.model_cache, MODEL_CACHE_LABEL),
        ("KVCacheTier", wanted.kv_tier, KV_TIER_LABEL),
    ):
        if name is None:
            continue
        found = lookup(kind, namespace, name)
        if found is None:
            return deny(
                f"{kind} {name!r} (label {label}) does not exist in namespace {namespace}: "
                "create it, or correct the label"
            )
        objects[kind] = found
    try:
        ops = build_pod_patch(
            pod, model_cache=objects.get("ModelCache"), kv_tier=objects.get("KVCacheTier"), creating=True
        )
    except WiringConflict as conflict:
        return deny(str(conflict))
    if not ops:
        return {"allowed": True}
    patch = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
    return {"allowed": True, "patchType": "JSONPatch", "patch": patch}


def deny(message: str) -> dict[str, Any]:
    return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": f"strata: {message}"}}


@dataclass
class AdmissionServer:
    """Serves `MUTATE_PODS_PATH` over TLS on `host:port` (port 0 picks a free one; `port` tells it after start)."""

    cert_dir: Path
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    lookup: Lookup = api_lookup
    requests: int = 0
    """Admission requests answered: tests prove with it which pods were sent."""
    _runner: web.AppRunner | None = field(default=None, repr=False)
    _watch: asyncio.Task[None] | None = field(default=None, repr=False)

    async def start(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        stamp = self._load(context)
        app = web.Application()
        app.router.add_post(MUTATE_PODS_PATH, self._review)
        app.router.add_get(HEALTH_PATH, self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=context, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]
        self._watch = asyncio.create_task(self._reload_when_changed(context, stamp))
        log.info("pod admission webhook listening on %s:%s", self.host, self.port)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _load(self, context: ssl.SSLContext) -> tuple[float, float]:
        cert, key = self.cert_dir / CERT_FILE, self.cert_dir / KEY_FILE
        context.load_cert_chain(cert, key)
        return (os.stat(cert).st_mtime, os.stat(key).st_mtime)

    async def _reload_when_changed(self, context: ssl.SSLContext, stamp: tuple[float, float]) -> None:
        """A Secret volume swaps its files atomically; new handshakes use the new pair once it loads."""
        while True:
            await asyncio.sleep(CERT_CHECK_SECONDS)
            try:
                now = (os.stat(self.cert_dir / CERT_FILE).st_mtime, os.stat(self.cert_dir / KEY_FILE).st_mtime)
                if now != stamp:
                    stamp = self._load(context)
                    log.info("reloaded the webhook certificate from %s", self.cert_dir)
            except (OSError, ssl.SSLError) as error:  # a half-written pair: keep the old one, try again
                log.warning("webhook certificate not reloaded: %s", error)

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _review(self, request: web.Request) -> web.Response:
        try:
            review = await request.json()
            admission = review["request"]
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="expected an AdmissionReview with a request")
        self.requests += 1
        try:
            response = await asyncio.to_thread(decide, admission, self.lookup)
        except Exception as error:  # an API outage: refuse with the reason rather than answer 500
            log.exception("admission of %s failed", admission.get("name") or "a pod")
            response = deny(f"could not read the caches the pod names: {type(error).__name__}: {error}")
        return web.json_response(
            {
                "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
                "kind": "AdmissionReview",
                "response": {"uid": admission.get("uid"), **response},
            }
        )
