"""A vLLM engine that compiles, served on the real node and wired to its ModelCache's compile cache
(docs/compilecache.md), written once for the proof (`bench/realnode_compile.py`) and the start-time bench
(`bench/compile_start.py`).

The cache is NodeLocal, so its store is a directory of the node's copy that this process (root, on the node) can
read, and whose removal with the cache can be seen; that needs a `privileged` namespace (hostPath), as does the
compiler below.

The stock CPU image (`STOCK_VLLM_IMAGE`) holds no C++ compiler, and vLLM on CPU compiles with stock torch.compile,
whose inductor backend writes C++ and builds it with `$CXX`. The images stay as they are: the node's own g++ (Debian
bookworm's, the release the image is built from) is mounted read-only into the engine container (`host_toolchain`):
the driver's directory apart from the image's (`CXX`; `COMPILER_PATH`, where g++ finds `as` and `ld`; and
`GCC_EXEC_PREFIX`, since a driver run from another directory looks for cc1plus relative to itself only), and
gcc's own directory, the headers (C++, libc, Python's) and the library directory (cc1plus's, as's and ld's shared
libraries, crt*.o, libc's linker script) over the image's, which hold none of it. The key container copies the
engine's env and mounts, so it sees what the engine sees.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from strata_loader.compilecache.store import CompileStore
from strata_loader.contract import CompileRestoreReport
from strata_operator.resources.modelcache.compile_cache import (
    CAPTURED_EVENT,
    COMPILE_STORE_DIR,
    restore_report,
)
from strata_operator.webhook.compile_cache import CAPTURE_CONTAINER, COMPILE_CACHE_ANNOTATION

from strata_testsupport.compile_logs import TORCH_CACHE_LOGS
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME, WORK_DIR
from strata_testsupport.pods import RUNTIME_UID, model_cache, pod_log, s3_model_spec
from strata_testsupport.scenarios import Site
from strata_testsupport.serving import TEST_MODEL, deployment

NODE_LOCAL_ROOT = WORK_DIR / "models"
"""Where the NodeLocal caches' copies go on the node (the sweep removes it with the node's work dir)."""
TOOLCHAIN_BIN = "/opt/host-toolchain/bin"
HOST_TOOLCHAIN = {
    "/usr/bin": TOOLCHAIN_BIN,
    "/usr/lib/gcc": "/usr/lib/gcc",
    "/usr/include": "/usr/include",
    "/usr/lib/x86_64-linux-gnu": "/usr/lib/x86_64-linux-gnu",
}
"""Host directory -> where the engine container sees it (read-only). /usr/bin goes beside the image's (whose
python the engine runs); the others have nothing of the image's that the host's same-release copy lacks."""
HOST_TOOLCHAIN_FILES = (
    "/usr/bin/g++",
    "/usr/bin/as",
    "/usr/bin/ld",
    "/usr/include/python3.11/Python.h",
    "/usr/include/c++",
    "/usr/lib/x86_64-linux-gnu/crti.o",
)
SMALL_MODEL = TEST_MODEL | {"hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4, "head_dim": 64}
"""A ~23M-parameter Llama with the serving test's 8 layers and vocabulary: the same graph to compile as
the larger model's (smaller kernels), in a fraction of the time on two shared cores."""


def host_toolchain_missing() -> list[str]:
    """What the node lacks of the compiler the engine is given (`make setup`'s build-essential and python3-dev)."""
    missing = [path for path in HOST_TOOLCHAIN_FILES if not os.path.exists(path)]
    if not list(Path("/usr/lib/gcc/x86_64-linux-gnu").glob("*/cc1plus")):
        missing.append("/usr/lib/gcc/x86_64-linux-gnu/*/cc1plus")
    return missing


def with_host_toolchain(pod: dict[str, Any], engine: dict[str, Any]) -> None:
    """Mount the node's g++ toolchain read-only into `engine` and point inductor at it (the module says why)."""
    for i, (host, path) in enumerate(HOST_TOOLCHAIN.items()):
        name = f"host-toolchain-{i}"
        pod["volumes"] = [*pod["volumes"], {"name": name, "hostPath": {"path": host, "type": "Directory"}}]
        engine["volumeMounts"] = [*engine["volumeMounts"], {"name": name, "mountPath": path, "readOnly": True}]
    engine["env"] = [
        *engine.get("env", []),
        {"name": "CXX", "value": f"{TOOLCHAIN_BIN}/g++"},
        {"name": "COMPILER_PATH", "value": TOOLCHAIN_BIN},
        {"name": "GCC_EXEC_PREFIX", "value": "/usr/lib/gcc/"},
    ]


def compiled_engine_deployment(
    name: str, image: str, cache: str, *, eager: bool = False, max_model_len: int = 2048
) -> dict[str, Any]:
    """The serving test's engine (`serving.deployment`) with compilation on (no `--enforce-eager`), torch's cache
    lines logged, the node's compiler mounted, and `Recreate` (a changed Deployment's new pod never compiles beside
    the old one on two cores). `eager`: `--enforce-eager` and annotated off the compile cache, as an engine that
    compiles nothing is run (no key, restore or capture containers)."""
    annotations = {COMPILE_CACHE_ANNOTATION: "false"} if eager else {}
    body = deployment(name, image, cache, None, annotations)
    body["spec"]["strategy"] = {"type": "Recreate"}
    pod = body["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    args = [a for a in engine["args"] if a != "--enforce-eager"] + (["--enforce-eager"] if eager else [])
    args[args.index("--max-model-len") + 1] = str(max_model_len)
    engine["args"] = args
    engine["env"] = [*engine["env"], {"name": "TORCH_LOGS", "value": TORCH_CACHE_LOGS}]
    with_host_toolchain(pod, engine)
    return body


def node_local_compile_cache(site: Site, s3: Any, name: str, uri: str) -> Path:
    """A NodeLocal ModelCache of `uri` on the node with `compileCache.enabled`; returns the node copy's directory
    (the store is its `COMPILE_STORE_DIR`). Returns at once: the preload has just begun."""
    NODE_LOCAL_ROOT.mkdir(parents=True, exist_ok=True)
    os.chown(NODE_LOCAL_ROOT, RUNTIME_UID, RUNTIME_UID)
    bucket, prefix = uri.removeprefix("s3://").split("/", 1)
    spec = s3_model_spec(s3, bucket, prefix, site.s3_secret)
    spec["storage"] = {
        "mode": "NodeLocal",
        "nodeLocal": {"path": str(NODE_LOCAL_ROOT), "nodeSelector": {"kubernetes.io/hostname": NODE_NAME}},
    }
    spec["compileCache"] = {"enabled": True}
    model_cache(site.client, site.namespace, name, spec)
    return NODE_LOCAL_ROOT / site.namespace / name


@contextmanager
def compile_cache_on_the_node(model: Path, cache: str) -> Iterator[tuple[Site, Path, dict[str, Any]]]:
    """The real node with Strata installed and the stock CPU vLLM image imported, an S3 server holding `model`, and
    in a `privileged` namespace (the engine mounts the node's toolchain) a NodeLocal ModelCache `cache` of it with
    the compile cache on, waited for until it settles. Yields the site, the node copy's directory and the cache's
    status, Ready or not: what a cache that failed means is the caller's to say."""
    from strata_testsupport.kube import new_dynamic_client
    from strata_testsupport.localcluster.node import NODE_IP, RealNode, node_images_archive, stock_vllm_image_archive
    from strata_testsupport.pods import s3_secret, wait_phase
    from strata_testsupport.realnode import held_shared_pvc, install_strata, pod_security_namespace
    from strata_testsupport.s3 import running_s3_server
    from strata_testsupport.serving import upload_model_dir

    with RealNode(node_images_archive()) as node:
        node.import_images(stock_vllm_image_archive())
        client = new_dynamic_client(str(node.kubeconfig))
        install_strata(node, client)
        with running_s3_server(host=NODE_IP) as s3:
            for namespace in pod_security_namespace(client, "privileged"):
                s3_secret(client, namespace, "s3-credentials", s3.access_key, s3.secret_key)
                site = Site(client, namespace, s3.endpoint_url, "s3-credentials", held_shared_pvc, region=s3.region)
                copy = node_local_compile_cache(site, s3, cache, upload_model_dir(s3, model))
                status = wait_phase(client, namespace, cache, {"Ready", "Degraded", "Failed"}, timeout=1200)
                yield site, copy, status


def stored_keys(copy: Path) -> list[str]:
    """The key digests the node copy's store holds a usable generation of (read with the store's own code)."""
    store = copy / COMPILE_STORE_DIR
    return sorted(c.digest for c in CompileStore(store).caches()) if store.is_dir() else []


def empty_store(copy: Path) -> list[str]:
    """Remove every key (and any capture in progress) from the node copy's store, as the copy's clean-up removes
    the whole store; the store directory stays, owned by the capture's user. Returns what was removed."""
    store = copy / COMPILE_STORE_DIR
    removed = sorted(entry.name for entry in store.iterdir()) if store.is_dir() else []
    for name in removed:
        shutil.rmtree(store / name)
    return removed


def wait_restore(site: Site, pod_name: str, timeout: float = 600) -> CompileRestoreReport:
    """The pod's `strata-compile-restore` report (its termination message), once it ended."""

    def report() -> CompileRestoreReport | None:
        pod = resource(site.client, "v1", "Pod").get(name=pod_name, namespace=site.namespace).to_dict()
        return restore_report(pod)

    found: CompileRestoreReport = wait_for(report, timeout=timeout, interval=1, what=f"{pod_name}'s restore report")
    return found


CAPTURE_OUTCOMES = ("captured", "unchanged", "present", "not-captured")


def wait_capture(site: Site, pod_name: str, timeout: float = 900) -> dict[str, Any]:
    """The capture sidecar's outcome: its JSON line (`captured`, `unchanged`, `present`, `not-captured`), or
    `{"event": "error", "line": ...}` for a refused capture (said once on stderr, the sidecar stays)."""

    def outcome() -> dict[str, Any] | None:
        log = pod_log(site.client, site.namespace, pod_name, container=CAPTURE_CONTAINER)
        for line in log.splitlines():
            if line.startswith("strata-loader compile: error:"):
                return {"event": "error", "line": line}
            try:
                said = json.loads(line) if line.startswith("{") else None
            except ValueError:
                said = None
            if isinstance(said, dict) and said.get("event") in CAPTURE_OUTCOMES:
                return said
        return None

    found: dict[str, Any] = wait_for(outcome, timeout=timeout, interval=2, what=f"{pod_name}'s capture sidecar")
    return found


def captured_events(site: Site, cache: str) -> list[str]:
    """The messages of the cache's `CompileCacheCaptured` Events."""
    events = resource(site.client, "v1", "Event").get(
        namespace=site.namespace, field_selector=f"involvedObject.name={cache}"
    )
    return [str(e.message) for e in events.items if e.reason == CAPTURED_EVENT]


def _time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def pod_ready_seconds(pod: dict[str, Any]) -> float:
    """Pod created -> Ready, by the API server's and the kubelet's own timestamps (whole seconds)."""
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready" and c["status"] == "True")
    return (_time(ready["lastTransitionTime"]) - _time(pod["metadata"]["creationTimestamp"])).total_seconds()


def init_container_seconds(pod: dict[str, Any], name: str) -> float | None:
    """How long an init container that ended ran (started -> finished), None if it did not run to its end."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated")
        if status["name"] == name and ended and ended.get("startedAt") and ended.get("finishedAt"):
            return (_time(ended["finishedAt"]) - _time(ended["startedAt"])).total_seconds()
    return None
