"""The operator's own Prometheus endpoint (`STRATA_METRICS_PORT`): each KVCacheTier's offload verdict as gauges
(`resources/kvcachetier/offload_metrics.py`), read from the tier controller's memory at scrape time.

Plain HTTP on its own port, apart from kopf's health probe; served only when the port is set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import kopf
from aiohttp import web

from strata_operator.handlers.kvcachetier.events import memory as tier_memory
from strata_operator.handlers.process import settings_of
from strata_operator.resources.kvcachetier.offload_metrics import render

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class MetricsMemory:
    runner: web.AppRunner | None = None
    port: int = 0
    """The port bound (the setting, or the one picked for 0)."""


def memory(memo: kopf.Memo) -> MetricsMemory:
    return cast(MetricsMemory, memo.metrics)


async def start_metrics(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    memo.metrics = mine = MetricsMemory()
    port = settings_of(memo).metrics_port
    if port is None:
        logger.info("STRATA_METRICS_PORT is not set: the operator serves no /metrics")
        return

    async def metrics(_: web.Request) -> web.Response:
        offloads = dict(tier_memory(memo).offload) if hasattr(memo, "kvcachetiers") else {}
        return web.Response(body=render(offloads).encode(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    mine.runner = web.AppRunner(app, access_log=None)
    await mine.runner.setup()
    site = web.TCPSite(mine.runner, "0.0.0.0", port)  # scraped from other pods
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    mine.port = sockets[0].getsockname()[1] if sockets else port


async def stop_metrics(memo: kopf.Memo, **_: Any) -> None:
    mine = memory(memo) if hasattr(memo, "metrics") else None
    if mine is not None and mine.runner is not None:
        await mine.runner.cleanup()
