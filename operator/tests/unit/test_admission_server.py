"""The webhook server itself, over real TLS on loopback: the operator's startup hook serves it from the
certificate directory, answers AdmissionReviews, and picks up a rotated certificate without a restart."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from strata_operator import settings
from strata_operator.webhook import admission, gates
from strata_testsupport.webhook import write_client_certificates, write_webhook_tls


async def post_review(port: int, ca: bytes, review: dict[str, Any]) -> dict[str, Any]:
    context = ssl.create_default_context(cadata=ca.decode())
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"https://127.0.0.1:{port}{admission.MUTATE_PODS_PATH}", json=review, ssl=context) as reply,
    ):
        assert reply.status == 200
        return dict(await reply.json())


def review(labels: dict[str, str]) -> dict[str, Any]:
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "vllm"}]}}
    request = {"uid": "u-1", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "n", "object": pod}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


async def test_the_startup_hook_serves_admission_from_the_certificate_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = write_webhook_tls(tmp_path)
    configured = settings.Settings.from_env(
        {settings.WEBHOOK_CERT_DIR_ENV: str(tmp_path), settings.WEBHOOK_PORT_ENV: "0"}
    )
    memo = kopf.Memo(strata=configured)
    await gates.start_webhook(memo=memo, logger=logging.getLogger("test"))
    server = gates.memory(memo).server
    assert server is not None and server.port != 0
    try:
        answer = await post_review(server.port, ca, review({"app": "plain"}))
        assert answer["response"] == {"uid": "u-1", "allowed": True}
        assert server.requests == 1
    finally:
        await gates.stop_webhook(memo=memo)


async def test_without_a_certificate_directory_no_webhook_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = kopf.Memo(strata=settings.Settings.from_env({}))
    await gates.start_webhook(memo=memo, logger=logging.getLogger("test"))
    assert gates.memory(memo).server is None


async def test_a_rotated_certificate_is_served_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "CERT_CHECK_SECONDS", 0.05)
    old_ca = write_webhook_tls(tmp_path)
    server = admission.AdmissionServer(tmp_path, host="127.0.0.1", port=0)
    await server.start()
    try:
        await post_review(server.port, old_ca, review({}))
        new_ca = write_webhook_tls(tmp_path)  # as cert-manager or a re-created Secret would
        for _ in range(100):
            try:
                await post_review(server.port, new_ca, review({}))
                break
            except aiohttp.ClientConnectorCertificateError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the new certificate was never served")
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post_review(server.port, old_ca, review({}))
    finally:
        await server.stop()


# -- who may call it, and how much at once --------------------------------------------------------------------------


class BlockingLookup:
    """A lookup that holds each decision until released and says how many are inside it; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.release = threading.Event()
        self.inside = threading.Semaphore(0)

    def __call__(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append((kind, namespace, name))
        self.inside.release()
        self.release.wait(timeout=60)
        return None


def client_context(ca: bytes, certificates: Path | None = None, name: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.decode())
    if certificates is not None and name is not None:
        context.load_cert_chain(certificates / f"{name}.crt", certificates / f"{name}.key")
    return context


async def post(port: int, context: ssl.SSLContext, body: bytes) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"https://127.0.0.1:{port}{admission.MUTATE_PODS_PATH}", data=body, ssl=context) as reply,
    ):
        return reply.status, await reply.text()


def other_namespace_review() -> bytes:
    """What a prober sends: a pod naming a cache in someone else's namespace."""
    labels = {"strata.dev/model-cache": "llama", "strata.dev/kv-cache-tier": "kv"}
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "vllm"}]}}
    request = {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "victim", "object": pod}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


async def test_only_a_client_certificate_of_the_client_ca_with_an_accepted_name_is_answered(tmp_path: Path) -> None:
    ca = write_webhook_tls(tmp_path / "serving")
    clients = tmp_path / "clients"
    client_ca = write_client_certificates(clients, "apiserver", "someone-else")
    write_client_certificates(tmp_path / "strangers", "apiserver")  # the same name, another CA
    looked_up: list[tuple[str, str, str]] = []

    def lookup(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        looked_up.append((kind, namespace, name))
        return None

    access = settings.WebhookAccess(client_ca=str(client_ca), client_names=("apiserver",))
    server = admission.AdmissionServer(tmp_path / "serving", host="127.0.0.1", port=0, lookup=lookup, access=access)
    await server.start()
    try:
        for refused in (client_context(ca), client_context(ca, tmp_path / "strangers", "apiserver")):
            with pytest.raises(aiohttp.ClientError):  # no certificate, or one the client CA did not sign
                await post(server.port, refused, other_namespace_review())
        status, text = await post(server.port, client_context(ca, clients, "someone-else"), other_namespace_review())
        assert (status, text) == (403, "this client certificate is not accepted")
        assert looked_up == [] and server.requests == 0, "a refused caller made the webhook look something up"

        status, text = await post(server.port, client_context(ca, clients, "apiserver"), other_namespace_review())
        assert status == 200 and "ModelCache 'llama'" in text and "victim" in text
        assert looked_up == [("ModelCache", "victim", "llama")]
    finally:
        await server.stop()


async def test_a_body_above_the_limit_is_refused_unread(tmp_path: Path) -> None:
    ca = write_webhook_tls(tmp_path)
    access = settings.WebhookAccess(max_body_bytes=64 * 1024)
    server = admission.AdmissionServer(tmp_path, host="127.0.0.1", port=0, access=access)
    await server.start()
    try:
        status, _ = await post(server.port, client_context(ca), b"{" + b" " * (64 * 1024) + b"}")
        assert status == 413
        assert server.requests == 0
        status, _ = await post(server.port, client_context(ca), other_namespace_review())
        assert status == 200, "a review under the limit is answered"
    finally:
        await server.stop()


async def test_decisions_at_once_and_waiting_are_bounded_and_the_rest_refused_at_once(tmp_path: Path) -> None:
    """2 decisions at once, 1 waiting: the 4th concurrent request is answered 429 without a lookup; the others
    are all answered once the lookups return."""
    ca = write_webhook_tls(tmp_path)
    lookup = BlockingLookup()
    access = settings.WebhookAccess(max_concurrent=2, max_queued=1)
    server = admission.AdmissionServer(tmp_path, host="127.0.0.1", port=0, lookup=lookup, access=access)
    await server.start()
    try:
        context = client_context(ca)
        held = [asyncio.create_task(post(server.port, context, other_namespace_review())) for _ in range(3)]
        for _ in range(2):  # both decision slots are taken (the lookups signal it), and the third request waits
            await asyncio.to_thread(lookup.inside.acquire)
        while server.admitted < 3:
            await asyncio.sleep(0.01)
        assert server.deciding == 2
        status, text = await post(server.port, context, other_namespace_review())
        assert status == 429 and "STRATA_WEBHOOK_MAX_CONCURRENT" in text, text
        assert len(lookup.calls) == 2
        lookup.release.set()
        answers = await asyncio.gather(*held)
        assert [status for status, _ in answers] == [200, 200, 200]
        assert len(lookup.calls) == 3 and server.admitted == 0 and server.deciding == 0
    finally:
        lookup.release.set()
        await server.stop()
