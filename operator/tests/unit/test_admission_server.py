"""The webhook server itself, over real TLS on loopback: the operator's startup hook serves it from the
certificate directory, answers AdmissionReviews, and picks up a rotated certificate without a restart."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from strata_operator import admission, settings
from strata_operator.handlers import webhook
from strata_testsupport.webhook import write_webhook_tls


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
    await webhook.start_webhook(memo=memo, logger=logging.getLogger("test"))
    server = webhook.memory(memo).server
    assert server is not None and server.port != 0
    try:
        answer = await post_review(server.port, ca, review({"app": "plain"}))
        assert answer["response"] == {"uid": "u-1", "allowed": True}
        assert server.requests == 1
    finally:
        await webhook.stop_webhook(memo=memo)


async def test_without_a_certificate_directory_no_webhook_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = kopf.Memo(strata=settings.Settings.from_env({}))
    await webhook.start_webhook(memo=memo, logger=logging.getLogger("test"))
    assert webhook.memory(memo).server is None


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
