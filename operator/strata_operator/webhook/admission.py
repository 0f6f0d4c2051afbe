"""The admission webhooks: a small aiohttp server over TLS that wires pods at creation (`MUTATE_PODS_PATH`) and
refuses deleting a ModelCache or KVCacheTier that pods still use (`VALIDATE_DELETION_PATH`).

Its own server rather than kopf's admission support: the chart owns the MutatingWebhookConfiguration (the
operator needs no rights on webhook configurations), the patch is the exact JSON Patch `webhook.wiring`
computes, and tests can start and stop it apart from the operator. It reads the ModelCache and KVCacheTier a pod
names at admission time (two GETs), so the gate decision sees the cache as it is now. The certificate files are
re-read when they change (cert-manager or a rotated Secret), without a restart.

Its answers name a namespace's claims, Secrets, ConfigMaps and pods, read with the operator's cluster-wide rights,
so only the API server should get them: with a client CA (`WebhookAccess.client_ca`) the TLS handshake needs a
certificate it signed, and with `client_names` one of those names, before any byte of a request is read. Every
caller is bounded: the body's size, decisions at once and requests waiting for one (beyond: 413 or 429 at once),
and a decision makes at most two GETs or one LIST of `LISTED_PODS`.
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
from strata_operator.resources.runtime_image import RuntimeImage, default_runtime
from strata_operator.settings import DEFAULT_WEBHOOK_PORT, WebhookAccess
from strata_operator.webhook.wiring import (
    KV_TIER_LABEL,
    MODEL_CACHE_LABEL,
    WiringConflict,
    WiringRequest,
    build_pod_patch,
)

MUTATE_PODS_PATH = "/mutate-pods"
VALIDATE_DELETION_PATH = "/validate-deletion"
FORCE_DELETE_ANNOTATION = "strata.dev/delete-while-in-use"
"""`"true"` on a ModelCache or KVCacheTier lets it be deleted although pods still use it."""
CONSUMER_LABELS = {"ModelCache": MODEL_CACHE_LABEL, "KVCacheTier": KV_TIER_LABEL}
SHOWN_CONSUMERS = 5
LISTED_PODS = 500
"""A deletion's check reads at most this many of the pods that name the object (one page)."""
HEALTH_PATH = "/healthz"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CERT_CHECK_SECONDS = 30.0

log = logging.getLogger(__name__)

Lookup = Callable[[str, str, str], Mapping[str, Any] | None]
"""(kind, namespace, name) → the object as a dict, or None when it does not exist. Blocking; run in a thread."""
ListPods = Callable[[str, str], list[Mapping[str, Any]]]
"""(namespace, label selector) → the pods. Blocking; run in a thread."""


def api_lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return kube.read(API_VERSION, kind, name, namespace)


def api_list_pods(namespace: str, selector: str) -> list[Mapping[str, Any]]:
    return list(kube.list_objects("v1", "Pod", namespace=namespace, label_selector=selector, limit=LISTED_PODS))


def decide_deletion(request: Mapping[str, Any], list_pods: ListPods) -> dict[str, Any]:
    """Refuse deleting a ModelCache or KVCacheTier that live pods still name, unless it is annotated to allow it."""
    kind = (request.get("kind") or {}).get("kind")
    label = CONSUMER_LABELS.get(str(kind))
    if request.get("operation") != "DELETE" or label is None:
        return {"allowed": True}
    meta = (request.get("oldObject") or {}).get("metadata") or {}
    if (meta.get("annotations") or {}).get(FORCE_DELETE_ANNOTATION, "").lower() == "true":
        return {"allowed": True}
    name, namespace = request.get("name") or meta.get("name"), request.get("namespace") or meta.get("namespace")
    pods = [
        p["metadata"]["name"]
        for p in list_pods(str(namespace), f"{label}={name}")
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    ]
    if not pods:
        return {"allowed": True}
    shown = ", ".join(sorted(pods)[:SHOWN_CONSUMERS]) + (", ..." if len(pods) > SHOWN_CONSUMERS else "")
    count = f"{len(pods)} or more" if len(pods) >= LISTED_PODS else str(len(pods))
    return deny(
        f"{kind} {name} is used by {count} pod(s) ({shown}): delete them or remove their label {label} "
        f"first, or annotate the {kind} {FORCE_DELETE_ANNOTATION}=true to delete it anyway"
    )


def decide(request: Mapping[str, Any], lookup: Lookup, runtime: RuntimeImage | None = None) -> dict[str, Any]:
    """The AdmissionReview response (less its uid) for one request; blocking (it looks objects up). `runtime`: the
    image whose vLLM packages a vLLM container gets (the operator's configured runtime image)."""
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
            pod,
            model_cache=objects.get("ModelCache"),
            kv_tier=objects.get("KVCacheTier"),
            creating=True,
            runtime=runtime,
        )
    except WiringConflict as conflict:
        return deny(str(conflict))
    if not ops:
        return {"allowed": True}
    patch = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
    return {"allowed": True, "patchType": "JSONPatch", "patch": patch}


def deny(message: str) -> dict[str, Any]:
    return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": f"strata: {message}"}}


def certificate_names(peercert: Mapping[str, Any] | None) -> set[str]:
    """The common names and DNS SANs of a verified peer certificate (`SSLObject.getpeercert()`)."""
    if not peercert:
        return set()
    names = {value for rdn in peercert.get("subject") or () for key, value in rdn if key == "commonName"}
    return names | {value for kind, value in peercert.get("subjectAltName") or () if kind == "DNS"}


@dataclass
class AdmissionServer:
    """Serves `MUTATE_PODS_PATH` over TLS on `host:port` (port 0 picks a free one; `port` tells it after start)."""

    cert_dir: Path
    host: str = "0.0.0.0"
    port: int = DEFAULT_WEBHOOK_PORT
    lookup: Lookup = api_lookup
    list_pods: ListPods = api_list_pods
    access: WebhookAccess = field(default_factory=WebhookAccess)
    runtime: RuntimeImage = field(default_factory=default_runtime)
    """The runtime image whose vLLM packages the webhook gives vLLM containers (`webhook.vllm_packages`)."""
    requests: int = 0
    """Pod admission requests answered: tests prove with it which pods were sent."""
    deletion_requests: int = 0
    deciding: int = 0
    """Decisions running now; `admitted` counts those and the requests waiting for one."""
    admitted: int = 0
    _slots: asyncio.Semaphore | None = field(default=None, repr=False)
    _runner: web.AppRunner | None = field(default=None, repr=False)
    _watch: asyncio.Task[None] | None = field(default=None, repr=False)

    async def start(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.access.client_ca:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.access.client_ca)
        else:
            log.warning(
                "the admission webhook answers any caller that reaches its port (it reads with the operator's "
                "rights): set STRATA_WEBHOOK_CLIENT_CA (chart: webhook.clientAuth) or restrict the port "
                "(chart: webhook.networkPolicy)"
            )
        stamp = self._load(context)
        self._slots = asyncio.Semaphore(self.access.max_concurrent)
        app = web.Application(client_max_size=self.access.max_body_bytes, middlewares=[self._guard])
        app.router.add_post(MUTATE_PODS_PATH, self._review)
        app.router.add_post(VALIDATE_DELETION_PATH, self._review_deletion)
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
        return await self._answer(request, lambda admission: decide(admission, self.lookup, self.runtime))

    async def _review_deletion(self, request: web.Request) -> web.Response:
        return await self._answer(request, lambda admission: decide_deletion(admission, self.list_pods))

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Before any byte of the body is read: the client's name, then room among the requests admitted."""
        allowed = self.access.client_names
        if allowed:
            ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
            names = certificate_names(ssl_object.getpeercert() if ssl_object is not None else None)
            if not names & set(allowed):
                log.warning(
                    "refused a webhook client whose certificate names %s", ", ".join(sorted(names)) or "nothing"
                )
                return web.Response(status=403, text="this client certificate is not accepted")
        if self.admitted >= self.access.max_concurrent + self.access.max_queued:
            return web.Response(
                status=429,
                text=f"busy: {self.admitted} admission requests in progress or waiting "
                "(STRATA_WEBHOOK_MAX_CONCURRENT, STRATA_WEBHOOK_MAX_QUEUED)",
            )
        self.admitted += 1
        try:
            return await handler(request)
        finally:
            self.admitted -= 1

    async def _answer(
        self, request: web.Request, decision: Callable[[Mapping[str, Any]], dict[str, Any]]
    ) -> web.Response:
        try:
            review = await request.json()
            admission = review["request"]
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="expected an AdmissionReview with a request")
        if request.path == MUTATE_PODS_PATH:
            self.requests += 1
        else:
            self.deletion_requests += 1
        assert self._slots is not None
        async with self._slots:
            self.deciding += 1
            try:
                response = await asyncio.to_thread(decision, admission)
            except Exception as error:  # an API outage: refuse with the reason rather than answer 500
                log.exception("admission of %s failed", admission.get("name") or "an object")
                response = deny(f"could not read what the decision needs: {type(error).__name__}: {error}")
            finally:
                self.deciding -= 1
        return web.json_response(
            {
                "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
                "kind": "AdmissionReview",
                "response": {"uid": admission.get("uid"), **response},
            }
        )
