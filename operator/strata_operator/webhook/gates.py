"""kopf side of serving-pod wiring: start the admission webhook, and lift the `strata.dev/model-ready` gate.

The webhook gates a pod whose ModelCache is not Ready. Two watches lift the gate: a gated pod (it may have been
admitted just as its cache became Ready) and a ModelCache change (it became Ready, or failed). A cache that
failed keeps the gate and says why in a Warning Event on the pod, once per pod and message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import kopf
from kubernetes.dynamic.exceptions import ApiException

from strata_operator import kube
from strata_operator.handlers.process import runtime_of, settings_of
from strata_operator.settings import WEBHOOK_CERT_DIR_ENV, WebhookTLS
from strata_operator.webhook import certificate_keeper
from strata_operator.webhook.admission import AdmissionServer, api_lookup
from strata_operator.webhook.certificates import CHECK_SECONDS
from strata_operator.webhook.wiring import (
    MODEL_CACHE_LABEL,
    MODEL_READY_GATE,
    cache_failure,
    cache_is_ready,
    rewire_revision,
)

log = logging.getLogger(__name__)


@dataclass
class ServingMemory:
    """The webhook server this operator runs (if any) and the Events already posted, per pod uid and message."""

    server: AdmissionServer | None = None
    explained: set[tuple[str, str]] = field(default_factory=set)
    keeping_tls: asyncio.Task[None] | None = None


def memory(memo: kopf.Memo) -> ServingMemory:
    return cast(ServingMemory, memo.serving)


async def start_webhook(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    memo.serving = ServingMemory()
    process = settings_of(memo)
    if not process.webhook_cert_dir:
        logger.info(f"{WEBHOOK_CERT_DIR_ENV} is not set: the pod admission webhook is not served by this operator")
        return
    cert_dir = Path(process.webhook_cert_dir)
    if process.webhook_tls is not None:  # the operator keeps the certificate: have one before serving
        try:
            await asyncio.to_thread(certificate_keeper.keep, process.webhook_tls, cert_dir)
        except (ApiException, certificate_keeper.SecretMissing) as error:
            raise kopf.TemporaryError(f"webhook certificate not ready: {error}", delay=10) from error
        memory(memo).keeping_tls = asyncio.create_task(keep_tls(process.webhook_tls, cert_dir))
    server = AdmissionServer(
        cert_dir, port=process.webhook_port, access=process.webhook_access, runtime=runtime_of(process)
    )
    await server.start()
    memory(memo).server = server


async def keep_tls(config: WebhookTLS, cert_dir: Path) -> None:
    """Re-check the certificate every `CHECK_SECONDS`; after a failure, again in a minute."""
    delay = CHECK_SECONDS
    while True:
        await asyncio.sleep(delay)
        try:
            await asyncio.to_thread(certificate_keeper.keep, config, cert_dir)
            delay = CHECK_SECONDS
        except Exception:  # an API outage or a conflict: the current certificate stays; retry soon
            log.exception("keeping the webhook certificate failed; retrying in 60 s")
            delay = 60.0


async def stop_webhook(memo: kopf.Memo, **_: Any) -> None:
    mine = memory(memo) if hasattr(memo, "serving") else None
    if mine is not None and mine.keeping_tls is not None:
        mine.keeping_tls.cancel()
    if mine is not None and mine.server is not None:
        await mine.server.stop()


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == MODEL_READY_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def release_gate(pod: Mapping[str, Any]) -> bool:
    """Remove Strata's gate (and only it); the `test` makes a concurrent change to the gates fail, not vanish.
    False when the pod changed or went away meanwhile (its next event retries)."""
    gates = list(pod["spec"].get("schedulingGates") or [])
    remaining = [g for g in gates if g.get("name") != MODEL_READY_GATE]
    ops = [
        {"op": "test", "path": "/spec/schedulingGates", "value": gates},
        {"op": "replace", "path": "/spec/schedulingGates", "value": remaining},
    ]
    try:
        kube.json_patch("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"], ops)
    except ApiException as error:
        if error.status in (404, 409, 422):
            return False
        raise
    return True


def gated_pods(namespace: str, cache: str) -> list[dict[str, Any]]:
    found = kube.list_objects("v1", "Pod", namespace=namespace, label_selector=f"{MODEL_CACHE_LABEL}={cache}")
    return [{"apiVersion": "v1", "kind": "Pod", **p} for p in found if gated(p)]


async def replace_pod(pod: Mapping[str, Any], cache: Mapping[str, Any], revision: str) -> None:
    """Delete a gated pod wired with its request's KV namespace; its controller creates it again, wired with the
    resolved revision (`wiring.rewire_revision`). The Event goes on the cache: the pod is gone."""
    meta = pod["metadata"]
    deleted = await asyncio.to_thread(kube.delete, "v1", "Pod", meta["name"], meta["namespace"], meta.get("uid"))
    if deleted:
        kopf.info(
            cast(kopf.Body, dict(cache)),
            reason="GatedPodReplaced",
            message=f"pod {meta['name']} was wired while the cache had no revision yet; deleted at the gate so its "
            f"controller re-creates it with revision {revision} (its KV namespace is then the one later pods share)",
        )


async def settle(pod: Mapping[str, Any], cache: Mapping[str, Any] | None, mine: ServingMemory) -> None:
    """Lift the gate when the cache is Ready; otherwise say once on the pod what it waits for."""
    name = (pod.get("metadata") or {}).get("labels", {}).get(MODEL_CACHE_LABEL)
    if cache is not None and cache_is_ready(cache):
        if (revision := rewire_revision(pod, cache)) is not None:
            await replace_pod(pod, cache, revision)
            return
        if await asyncio.to_thread(release_gate, pod):
            kopf.info(
                cast(kopf.Body, dict(pod)),
                reason="ModelCacheReady",
                message=f"ModelCache {name} is Ready: gate removed",
            )
        return
    failure = None if cache is None else cache_failure(cache)
    if cache is None:
        type_, reason, message = "Warning", "ModelCacheMissing", f"ModelCache {name} does not exist; the pod waits"
    elif failure is not None:
        type_, reason = "Warning", "ModelCacheDegraded"
        message = f"ModelCache {name} failed ({failure}); the pod stays gated until it is Ready"
    else:
        phase = (cache.get("status") or {}).get("phase") or "Pending"
        type_, reason, message = "Normal", "WaitingForModelCache", f"waiting for ModelCache {name} ({phase})"
    key = (pod["metadata"].get("uid", ""), reason)
    if key not in mine.explained:
        mine.explained.add(key)
        kopf.event(cast(kopf.Body, dict(pod)), type=type_, reason=reason, message=message)


async def gated_pod_seen(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    mine = memory(memo)
    if event.get("type") == "DELETED":
        mine.explained = {k for k in mine.explained if k[0] != body["metadata"].get("uid")}
        return
    if not gated(body):
        return
    namespace, name = body["metadata"]["namespace"], body["metadata"]["labels"][MODEL_CACHE_LABEL]
    cache = await asyncio.to_thread(api_lookup, "ModelCache", namespace, name)
    await settle(dict(body), cache, mine)


async def cache_state_for_gated_pods(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Only a Ready or failed cache changes anything for its gated pods."""
    if event.get("type") == "DELETED" or not (cache_is_ready(body) or cache_failure(body)):
        return
    cache = dict(body)
    for pod in await asyncio.to_thread(gated_pods, body["metadata"]["namespace"], body["metadata"]["name"]):
        await settle(pod, cache, memory(memo))
