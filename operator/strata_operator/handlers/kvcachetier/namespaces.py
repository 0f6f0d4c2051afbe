"""The namespace collection's reads (wired pods, the caches' revisions) and writes (`STRATA.DROPNS` on every
server); the decisions are `resources/kvcachetier/namespaces.py`.

The servers are asked over RESP with the tier's token, as any client: `STRATA.NAMESPACES` lists what each holds,
`STRATA.DROPNS <namespace>` drops one through the store's own delete path (so KV events report the blocks
removed). A server that does not answer leaves its record pending; the next reconcile tries again.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.conditions import now_rfc3339
from strata_operator.resources.core import KV_TIER_LABEL, Event, label_selector
from strata_operator.resources.kvcachetier import namespaces as ns
from strata_operator.resources.kvcachetier.auth import token_secret
from strata_operator.resources.kvcachetier.names import TierRef

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 30.0
"""One server's answer to one command; dropping a large namespace deletes every block file."""


class ServerError(Exception):
    """A server did not answer, or answered with an error."""


def observe(tier: TierRef, previous: Mapping[str, Any], now: str | None = None) -> ns.NamespaceObservation:
    """The pods wired to this tier and the current revision of every cache they (or earlier records) name."""
    pods = kube.list_objects(
        "v1", "Pod", namespace=tier.namespace, label_selector=label_selector({KV_TIER_LABEL: tier.name})
    )
    caches = {r["modelCache"] for r in previous.get("namespaces") or []}
    caches |= {s.model_cache for pod in pods if (s := ns.served_by(pod)) is not None}
    current = {}
    for name in sorted(caches):
        cache = kube.read(API_VERSION, "ModelCache", name, tier.namespace)
        current[name] = ns.current_revisions(cache)
    return ns.NamespaceObservation(pods=pods, current=current, now=now or now_rfc3339())


def step(
    spec: KVCacheTierSpec,
    tier: TierRef,
    previous: Mapping[str, Any],
    server_pods: Sequence[Mapping[str, Any]],
    now: str | None = None,
) -> tuple[dict[str, Any], list[Event]]:
    """One reconcile's namespace step: observe, plan, drop what is due, and the status fields and Events."""
    seen = observe(tier, previous, now)
    collection = ns.plan_collection(spec, previous, seen)
    results: dict[tuple[str, str, str], list[ns.ServerDrops]] = {}
    if collection.due:
        try:
            token = _token(spec, tier)
        except ServerError as error:  # every due record stays pending, saying why
            failed = [ns.ServerDrops("token", error=str(error))]
            results = {(r["modelCache"], r["revision"], r["model"]): failed for r in collection.due}
        else:
            servers = _servers(server_pods)
            if not servers:  # a shared L2 keeps them until a server can drop them
                servers = [("(no server)", None)]
            for record in collection.due:
                key = (record["modelCache"], record["revision"], record["model"])
                results[key] = [_drop_on(name, host, spec.port, token, record["model"]) for name, host in servers]
    return ns.settle_collection(collection, results, previous, seen.now)


def _servers(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str | None]]:
    """(pod name, host or None when not reachable now) of every server pod that is not terminating."""
    servers = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        servers.append((str(meta.get("name")), status.get("podIP") if ready else None))
    return servers


def _token(spec: KVCacheTierSpec, tier: TierRef) -> bytes | None:
    ref = token_secret(spec, tier)
    if ref is None:
        return None
    secret = kube.read("v1", "Secret", ref.name, tier.namespace)
    data = (secret or {}).get("data") or {}
    if ref.key not in data:
        raise ServerError(f"the token Secret {ref.name} has no key {ref.key}")
    return base64.b64decode(data[ref.key]).strip()


def _drop_on(server: str, host: str | None, port: int, token: bytes | None, model: str) -> ns.ServerDrops:
    """Drop every namespace of `model` one server holds."""
    if host is None:
        return ns.ServerDrops(server, error="not ready")
    try:
        held = json.loads(command(host, port, token, b"STRATA.NAMESPACES"))
        freed = {}
        for namespace in sorted(n for n in held if ns.belongs(n, model)):
            answer = json.loads(command(host, port, token, b"STRATA.DROPNS", namespace.encode()))
            total = answer.get("freed") or {}
            freed[namespace] = (sum(t["blocks"] for t in total.values()), int(answer.get("bytes") or 0))
        return ns.ServerDrops(server, freed=freed)
    except (OSError, ServerError, ValueError) as error:
        log.warning("collecting the namespaces of %s on %s failed: %s", model, server, error)
        return ns.ServerDrops(server, error=str(error)[:200])


def command(host: str, port: int, token: bytes | None, *args: bytes, timeout: float = TIMEOUT_SECONDS) -> bytes:
    """One RESP command (after AUTH when there is a token); its reply as bytes. Errors raise ServerError."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        stream = sock.makefile("rb")
        if token is not None:
            sock.sendall(_encode(b"AUTH", token))
            _reply(stream)
        sock.sendall(_encode(*args))
        return _reply(stream)


def _encode(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _reply(stream: Any) -> bytes:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ServerError("connection closed")
    kind, body = line[:1], line[1:-2]
    if kind == b"-":
        raise ServerError(body.decode(errors="replace"))
    if kind in (b"+", b":"):
        return body
    if kind == b"$":
        size = int(body)
        if size < 0:
            return b""
        data: bytes = stream.read(size + 2)
        return data[:-2]
    raise ServerError(f"unexpected reply {line[:40]!r}")
