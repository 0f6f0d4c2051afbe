"""The Grafana dashboard the chart ships: rendered by the real Helm CLI, every panel's PromQL tokenized, and every
metric it names checked against what a real `strata-kv serve` and the operator's real /metrics endpoint export."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import kopf
import pytest
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.handlers import metrics as operator_metrics
from strata_operator.handlers.kvcachetier.events import TierMemory
from strata_operator.handlers.kvcachetier.io import scrape
from strata_operator.resources.kvcachetier import offload_metrics
from strata_operator.resources.kvcachetier.engines import parse_engine_metrics
from strata_operator.resources.kvcachetier.offload import METRIC_NAMES, offload_status, sample
from strata_operator.settings import Settings
from strata_testsupport.kvserver import running_kv_server

pytestmark = pytest.mark.integration

FUNCTIONS = {"rate", "irate", "increase", "sum", "max", "min", "avg", "count", "histogram_quantile", "label_values"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
_TOKEN = re.compile(
    r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<duration>\[\d+[smhdw]\])|(?P<number>\d+(?:\.\d+)?)'
    r"|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?P<op>=~|!~|!=|==|>=|<=|[-+*/(){},=<>]))"
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords, label names in a
    matcher or names in a grouping clause. Fails on anything the tokenizer does not know, or unbalanced brackets."""
    names: set[str] = set()
    depth_braces, grouping, parens, position = 0, False, 0, 0
    tokens: list[tuple[str, str]] = []
    expr = expr.replace("$namespace", "x").replace("$kvcachetier", "x")
    while position < len(expr.rstrip()):
        match = _TOKEN.match(expr, position)
        assert match is not None and match.end() > position, f"cannot read {expr[position:]!r} in {expr!r}"
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    for kind, text in tokens:
        if text == "{":
            depth_braces += 1
        elif text == "}":
            depth_braces -= 1
        elif text == "(":
            parens += 1
        elif text == ")":
            parens -= 1
            grouping = False
        if kind != "name":
            continue
        if text in KEYWORDS:
            grouping = text in {"by", "without", "on", "ignoring", "group_left", "group_right"}
            continue
        if depth_braces or grouping or text in FUNCTIONS:
            continue
        names.add(text)
    assert depth_braces == 0 and parens == 0, f"unbalanced brackets in {expr!r}"
    return names


def test_the_tokenizer_tells_metrics_from_functions_labels_and_grouping() -> None:
    expr = 'sum by (namespace, tier) (rate(a_total{tier="l1",x=~"$namespace"}[5m])) / ignoring(tier) b + c == 1'
    assert metric_names(expr) == {"a_total", "b", "c"}


def dashboard_exprs(helm: Any, chart_helpers: Any) -> list[str]:
    objects = helm.template({"grafanaDashboard": {"enabled": True}})
    config_map = chart_helpers.find(objects, "ConfigMap", "strata-kv-offload-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["strata-kv-offload.json"])
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # label_values(<selector>, <label>): the selector reads a metric
            match = re.fullmatch(r"label_values\((.*),\s*[a-zA-Z_]\w*\)", variable["query"])
            assert match is not None, variable["query"]
            exprs.append(match.group(1))
    assert len(dashboard["panels"]) >= 8 and all(exprs)
    return exprs


def exported(text: str) -> set[str]:
    return {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}


def serve_operator_metrics(offload: dict[str, Any]) -> str:
    """The operator's real /metrics endpoint (`handlers/metrics.py`) with one tier's status.offload in memory."""

    async def fetch() -> str:
        memo = kopf.Memo()
        memo["strata"] = Settings(metrics_port=0)
        memo.kvcachetiers = TierMemory(offload={("serving", "kv"): offload})
        await operator_metrics.start_metrics(memo=memo, logger=_Logger())
        try:
            url = f"http://127.0.0.1:{operator_metrics.memory(memo).port}/metrics"
            return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        finally:
            await operator_metrics.stop_metrics(memo=memo)

    return asyncio.run(fetch())


class _Logger:
    def info(self, *_: Any) -> None:
        pass


def test_every_dashboard_query_reads_metrics_real_servers_export(helm: Any, chart_helpers: Any, tmp_path: Path) -> None:
    exprs = dashboard_exprs(helm, chart_helpers)
    value = bytes(16 * 1024)  # 60 fit in L1: 57 protected, 3 passing through the cold slots
    with running_kv_server(tmp_path / "kv", {"l1": {"size": "1MiB"}}, l2_fs=False) as server:
        client = server.redis()
        before = scrape("127.0.0.1", server.metrics_port)
        for key in range(70):  # more than L1 holds: the cold ones it let go stay as the policy's ghosts
            client.set(f"chunk@{key}", value)
        for key in reversed(range(70)):  # the latest evicted first: a slightly larger L1 would have held them
            client.get(f"chunk@{key}")
        server_text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read()
        usage = scrape("127.0.0.1", server.metrics_port)
    assert usage is not None and before is not None
    spec = KVCacheTierSpec.model_validate({"l1": {"size": "1Mi"}, "offloadVerdict": {"minLookups": 1}})
    engines = [("vllm-0/0", parse_engine_metrics("vllm:kv_offload_allocation_failure_total 3\n"))]
    first, _ = offload_status(spec, None, sample([("kv-0/0", before)], "2026-12-04T10:00:00Z", engines))
    offload, _ = offload_status(spec, first, sample([("kv-0/0", usage)], "2026-12-04T10:01:00Z", engines))
    assert offload.get("suggestedL1Size"), f"the ghosts suggest a larger L1: {offload}"
    operator_text = serve_operator_metrics(offload)
    served, gauges = exported(server_text.decode()), exported(operator_text)
    assert set(METRIC_NAMES) <= served, "the verdict reads only what the server exports"
    assert set(offload_metrics.METRIC_NAMES) <= gauges, "every gauge has a sample"
    available = served | gauges
    wanted = set().union(*(metric_names(e) for e in exprs))
    assert wanted, "the dashboard reads metrics"
    assert wanted <= available, f"not exported by a real server or the operator: {sorted(wanted - available)}"


def test_the_operator_serves_metrics_and_prometheus_scrapes_it_when_asked(helm: Any, chart_helpers: Any) -> None:
    objects = helm.template()
    assert "ConfigMap" not in {o["kind"] for o in objects if o["metadata"]["name"].endswith("dashboard")}
    container = chart_helpers.find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "STRATA_METRICS_PORT", "value": "8081"} in container["env"]
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    monitored = helm.template({"serviceMonitor": {"enabled": True}})
    pod_monitor = chart_helpers.find(monitored, "PodMonitor")
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    off = helm.template({"metrics": {"enabled": False}, "serviceMonitor": {"enabled": True}})
    assert "PodMonitor" not in {o["kind"] for o in off}
