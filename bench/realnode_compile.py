"""The compile cache on the real node, end to end (issue 43 item 4): a check per line, PASS or FAIL, and a non-zero
exit status on any FAIL.

The engine is the stock vLLM CPU image (nothing of Strata's: the webhook adds its packages) with compilation on (no
`--enforce-eager`; the webhook sets VLLM_USE_AOT_COMPILE=0), the node's own g++ mounted read-only (the image has no
C++ compiler and inductor on CPU builds C++; `strata_testsupport.compile_serving` says how), and TORCH_LOGS for
torch's cache lines. It is a Deployment whose pod names a NodeLocal ModelCache with `spec.compileCache.enabled`
(NodeLocal: the store is a directory of the node's copy, read here with the store's own code; the namespace is
`privileged` for the hostPaths). The webhook wires the rest: `strata-compile-key` and `strata-compile-restore`
init containers and the `strata-compile-capture` sidecar.

a. the first engine misses (its restore's termination message: the store holds nothing yet), compiles (inductor's
   FX graph cache misses), and its sidecar captures its key into the node copy's store; status counts the miss;
   status lists the key, and a `CompileCacheCaptured` Event names it and the pod that captured it, before any
   other engine starts (the operator reads the sidecar's log);
b. a fresh pod of the Deployment restores that key (a hit), torch logs FX graph and AOTAutograd cache hits and no
   miss, vLLM's `init engine ... took` is lower than the first engine's, the engine answers; its sidecar finds the
   key present; status lists the key with a hit, and the key still has that one `CompileCacheCaptured` Event;
c. the same Deployment with another `--max-model-len` misses with a reason that names the `config` part and no
   other, and its sidecar captures a second key: the store holds both; status's lastMiss says why;
d. deleting the ModelCache removes the node's copy and both keys' stores with it (its clean-up Job).

    sudo -E env PYTHONPATH=loader:operator:kvserver:testsupport:units .venv/bin/python bench/realnode_compile.py \
        [--shape small|test] [--output bench/results/realnode_compile]

Needs root (the node), the node's g++ and python3-dev, and the images (built on first use). About 15-25 minutes on
two cores: two engines compile. The pods' logs and the checks go to the output directory.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))  # the rest is installed in the venv

from strata_operator.webhook.compile_cache import CAPTURE_CONTAINER, KEY_CONTAINER  # noqa: E402
from strata_testsupport.compile_logs import compile_line_counts, init_engine_seconds  # noqa: E402
from strata_testsupport.compile_serving import (  # noqa: E402
    SMALL_MODEL,
    captured_events,
    compile_cache_on_the_node,
    compiled_engine_deployment,
    host_toolchain_missing,
    stored_keys,
    wait_capture,
    wait_restore,
)
from strata_testsupport.kube import resource, wait_for  # noqa: E402
from strata_testsupport.localcluster.node import (  # noqa: E402
    STOCK_VLLM_IMAGE,
)
from strata_testsupport.pods import API, cache_status, pod_log  # noqa: E402
from strata_testsupport.scenarios import Site  # noqa: E402
from strata_testsupport.serving import (  # noqa: E402
    TEST_MODEL,
    complete,
    delete_deployment,
    engine_log,
    fresh_engine,
    make_model,
    ready_engine,
)

CACHE, DEPLOYMENT = "llama", "vllm-compiled"
MAX_MODEL_LEN, OTHER_MAX_MODEL_LEN = 2048, 1024


class Checks:
    """Each check printed as it is judged; `failed` says whether any was a FAIL."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.results: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, detail: str) -> bool:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.results.append({"check": name, "ok": ok, "detail": detail})
        return ok

    @property
    def failed(self) -> bool:
        return not self.results or not all(r["ok"] for r in self.results)

    def keep_logs(self, site: Site, pod: dict[str, Any], label: str) -> str:
        """The pod's engine, key and capture logs into the output directory; returns the engine's."""
        name = pod["metadata"]["name"]
        engine = ""
        for container in ("vllm", KEY_CONTAINER, CAPTURE_CONTAINER):
            try:
                text = pod_log(site.client, site.namespace, name, container=container)
            except Exception as error:  # diagnostics only
                text = f"(no log: {error})"
            (self.output / f"{label}-{container}.log").write_text(text)
            engine = text if container == "vllm" else engine
        return engine


def compile_status(site: Site, predicate: Any, what: str, timeout: float = 180) -> dict[str, Any]:
    """status.compileCache once `predicate` holds for it (the operator reconciles when a restore ends)."""

    def current() -> dict[str, Any] | None:
        status = cache_status(site.client, site.namespace, CACHE).get("compileCache") or {}
        return status if predicate(status) else None

    try:
        found: dict[str, Any] = wait_for(current, timeout=timeout, interval=2, what=what)
    except AssertionError:
        return cache_status(site.client, site.namespace, CACHE).get("compileCache") or {}
    return found


def first_engine_misses_and_captures(site: Site, copy: Path, checks: Checks) -> dict[str, Any]:
    """(a): the first engine of the key."""
    body = compiled_engine_deployment(DEPLOYMENT, STOCK_VLLM_IMAGE, CACHE, max_model_len=MAX_MODEL_LEN)
    resource(site.client, "apps/v1", "Deployment").create(namespace=site.namespace, body=body)
    pod = ready_engine(site, DEPLOYMENT, set(), timeout=1800)
    name = pod["metadata"]["name"]
    restore = wait_restore(site, name)
    checks.check(
        "a1 the first engine's restore misses",
        restore.event == "miss" and "holds no compile cache yet" in (restore.reason or ""),
        f"{restore.event}: {restore.reason} (key {restore.key})",
    )
    capture = wait_capture(site, name)
    log = checks.keep_logs(site, pod, "a-first")
    counts = compile_line_counts(log)
    checks.check(
        "a2 it compiled",
        init_engine_seconds(log) is not None and counts["fx_graph_miss"] > 0,
        f"init engine {init_engine_seconds(log)} s, torch's cache lines {counts}",
    )
    checks.check(
        "a3 its sidecar captured its key",
        capture.get("event") == "captured" and capture.get("key") == restore.key,
        json.dumps(capture),
    )
    keys = stored_keys(copy)
    checks.check("a4 the node copy's store holds that key", keys == [restore.key], f"stored keys {keys}")
    status = compile_status(site, lambda s: s.get("misses", 0) >= 1, "the miss in status.compileCache")
    checks.check(
        "a5 status.compileCache counts the miss",
        status.get("misses") == 1 and name in (status.get("lastMiss") or ""),
        f"misses {status.get('misses')}, lastMiss {status.get('lastMiss')!r}",
    )
    key = str(restore.key)
    status = compile_status(
        site, lambda s: key in [c.get("key") for c in s.get("caches") or []], "the captured key in status"
    )
    entry = next((c for c in status.get("caches") or [] if c.get("key") == key), {})
    checks.check(
        "a6 status lists the captured key before any engine restores it, with the capture's size",
        entry.get("generation") == capture.get("generation") and entry.get("files") == capture.get("files")
        and status.get("hits") == 0 and status.get("capturing") == 0,
        f"entry {entry}, hits {status.get('hits')}, capturing {status.get('capturing')}",
    )
    events = [m for m in wait_for_events(site, key) if key[:12] in m]
    checks.check(
        "a7 a CompileCacheCaptured Event names the key and the pod that captured it",
        len(events) == 1 and f"captured from pod {name}" in events[0],
        f"{events}",
    )
    return {"pod": pod, "key": restore.key, "init_engine_s": init_engine_seconds(log)}


def fresh_engine_restores(site: Site, first: dict[str, Any], seen: set[str], checks: Checks) -> dict[str, Any]:
    """(b): the same Deployment's next pod."""
    pod = fresh_engine(site, DEPLOYMENT, first["pod"], seen)
    name = pod["metadata"]["name"]
    restore = wait_restore(site, name)
    checks.check(
        "b1 a fresh engine restores the key (hit)",
        restore.event == "restored" and restore.key == first["key"],
        f"{restore.event}: key {restore.key}, generation {restore.generation}, {restore.files} files, "
        f"{restore.bytes} bytes",
    )
    log = pod_log(site.client, site.namespace, name, container="vllm")  # the start, before any request
    counts = compile_line_counts(log)
    checks.check(
        "b2 torch loads from the restored cache",
        counts["fx_graph_hit"] > 0 and counts["aot_autograd_hit"] > 0 and counts["fx_graph_miss"] == 0,
        f"torch's cache lines {counts}",
    )
    init = init_engine_seconds(log)
    checks.check(
        "b3 vLLM's init engine time is lower",
        init is not None and first["init_engine_s"] is not None and init < first["init_engine_s"],
        f"{init} s, the first engine's {first['init_engine_s']} s",
    )
    answer = complete(pod, [7, 8, 9, 10], max_tokens=4)
    after = compile_line_counts(checks.keep_logs(site, pod, "b-fresh"))
    checks.check(
        "b4 the engine answers",
        answer["usage"]["completion_tokens"] >= 1,
        f"{answer['usage']['completion_tokens']} tokens: {answer['choices'][0]['text']!r}; torch's cache lines "
        f"after the request {after}",
    )
    capture = wait_capture(site, name)
    checks.check("b5 its sidecar stores nothing (present)", capture.get("event") == "present", json.dumps(capture))
    status = compile_status(
        site,
        lambda s: first["key"] in [c.get("key") for c in s.get("caches") or []] and s.get("hits") == 1,
        "the key and a hit in status.compileCache",
    )
    checks.check(
        "b6 status.compileCache lists the key with a hit",
        first["key"] in [c.get("key") for c in status.get("caches") or []] and status.get("hits") == 1,
        f"hits {status.get('hits')}, misses {status.get('misses')}, caches {status.get('caches')}, "
        f"summary {status.get('summary')!r}",
    )
    events = [m for m in captured_events(site, CACHE) if first["key"][:12] in m]
    checks.check(
        "b7 the key still has one CompileCacheCaptured Event, the capture's (a restore posts none)",
        len(events) == 1 and "captured from pod" in events[0],
        f"{events}",
    )
    seen.add(pod["metadata"]["uid"])
    return {"pod": pod}


def wait_for_events(site: Site, key: str, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        events = captured_events(site, CACHE)
        if any(key[:12] in m for m in events) or time.monotonic() > deadline:
            return events
        time.sleep(2)


def other_config_misses_and_captures(site: Site, copy: Path, first_key: str, seen: set[str], checks: Checks) -> None:
    """(c): the Deployment changed to another --max-model-len; Recreate replaces its pod."""
    deployments = resource(site.client, "apps/v1", "Deployment")
    body = deployments.get(name=DEPLOYMENT, namespace=site.namespace).to_dict()
    (engine,) = body["spec"]["template"]["spec"]["containers"]
    args = engine["args"]
    args[args.index("--max-model-len") + 1] = str(OTHER_MAX_MODEL_LEN)
    deployments.patch(
        name=DEPLOYMENT,
        namespace=site.namespace,
        body=[{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}],
        content_type="application/json-patch+json",
    )
    pod = ready_engine(site, DEPLOYMENT, seen, timeout=1800)
    name = pod["metadata"]["name"]
    restore = wait_restore(site, name)
    differing = re.findall(r"(\w+) differs", restore.reason or "")
    checks.check(
        "c1 another --max-model-len misses, naming the config part only",
        restore.event == "miss" and restore.key != first_key and differing == ["config"],
        f"{restore.event}: {restore.reason}",
    )
    capture = wait_capture(site, name)
    checks.keep_logs(site, pod, "c-other-config")
    keys = stored_keys(copy)
    checks.check(
        "c2 its sidecar captures a second key: the store holds both",
        capture.get("event") == "captured" and keys == sorted([first_key, str(restore.key)]),
        f"{json.dumps(capture)}; stored keys {keys}",
    )
    status = compile_status(site, lambda s: "config differs" in (s.get("lastMiss") or ""), "the config miss")
    checks.check(
        "c3 status.compileCache's lastMiss names the config part",
        "config differs" in (status.get("lastMiss") or ""),
        f"lastMiss {status.get('lastMiss')!r}",
    )


def deleting_the_cache_removes_the_stores(site: Site, copy: Path, checks: Checks) -> None:
    """(d): the ModelCache deleted once its engine is gone; its clean-up Job removes the node's copy."""
    before = stored_keys(copy)
    delete_deployment(site, DEPLOYMENT)
    resource(site.client, API, "ModelCache").delete(name=CACHE, namespace=site.namespace)
    wait_for(
        lambda: not resource(site.client, API, "ModelCache").get(namespace=site.namespace).items,
        timeout=300,
        interval=1,
        what="the ModelCache deleted (its clean-up done)",
    )
    checks.check(
        "d1 deleting the ModelCache removes both keys' stores with the node copy",
        len(before) == 2 and not copy.exists(),
        f"stored keys before {before}; {copy} exists after: {copy.exists()}",
    )


def prove(site: Site, copy: Path, checks: Checks) -> None:
    seen: set[str] = set()
    first = first_engine_misses_and_captures(site, copy, checks)
    fresh_engine_restores(site, first, seen, checks)
    other_config_misses_and_captures(site, copy, first["key"], seen, checks)
    deleting_the_cache_removes_the_stores(site, copy, checks)


def diagnose(site: Site, checks: Checks) -> None:
    """On an error: every pod's state and its engine's error lines, into the output directory."""
    lines = []
    try:
        for pod in resource(site.client, "v1", "Pod").get(namespace=site.namespace).to_dict()["items"]:
            lines.append(f"== {pod['metadata']['name']}: {json.dumps(pod.get('status'), indent=1)}")
            lines.append(engine_log(site, pod))
    except Exception as error:  # diagnostics only
        lines.append(f"(no more: {error})")
    (checks.output / "diagnostics.txt").write_text("\n".join(lines))
    print(f"diagnostics: {checks.output / 'diagnostics.txt'}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("small", "test"), default="small")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "realnode_compile")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    checks = Checks(args.output)
    missing = host_toolchain_missing()
    if missing:
        checks.check("the node's C++ toolchain", False, f"missing {missing} (apt-get install g++ python3-dev)")
        return 1
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="realnode-compile-") as tmp:
        model = make_model(Path(tmp) / "llama", SMALL_MODEL if args.shape == "small" else TEST_MODEL)
        with compile_cache_on_the_node(model, CACHE) as (site, copy, status):
            ready = status["phase"] == "Ready"
            checks.check("the NodeLocal cache with compileCache is Ready", ready, str(status.get("conditions")))
            try:
                if ready:
                    prove(site, copy, checks)
            except Exception as error:
                checks.check("the proof ran to its end", False, f"{type(error).__name__}: {error}"[:4000])
                diagnose(site, checks)
    summary = {"checks": checks.results, "wall_s": round(time.monotonic() - started, 1), "shape": args.shape}
    (args.output / "checks.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{'FAIL' if checks.failed else 'PASS'}: {sum(r['ok'] for r in checks.results)}/{len(checks.results)} checks")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
