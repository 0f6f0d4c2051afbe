"""Pod start with the model as an image volume, side by side in one run on the real node, for the same generated
model (safetensors files of random bytes):
- `image-prepulled`: a ModelCache `ImageVolume` with `prePull: true`, its pre-pull done before the pod is created;
- `image-cold`: an image of the same size the node never pulled (one per round, its own random bytes: containerd
  reuses unpacked layers by content, so the same image again would not be cold), pulled by the kubelet to start
  the pod;
- `shared-pvc`: a `SharedPVC` cache preloaded from S3 into a claim (a static volume on the node);
- `node-local`: a `NodeLocal` cache copied onto the node's disk;
- `no-model`: the same pod with no model volume, the floor every row stands on.
Each consumer is a pod that only carries `strata.dev/model-cache` (the webhook wires it), timed from its create
call to its container running (polled every 50 ms); rounds alternate the order, so no side always goes first.

Then the registry's side: `strata-loader pack --to` (hash and push, one per image) and the kubelet's pull of a cold
image (its own "Successfully pulled" Event for the image volume) against a plain `cp -r` + `sync` of the same
bytes on the same disk, page cache dropped before each.

    sudo .venv/bin/python bench/image_volume_start.py [--size-mib 256] [--rounds 3] [--output DIR]

Two shared cores, one node, registry on the node's address: read the ratios, not the absolutes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))

from strata_testsupport.kube import new_dynamic_client, resource, wait_for  # noqa: E402
from strata_testsupport.localcluster.node import NODE_IP, NODE_NAME, WORK_DIR, RealNode, node_images_archive  # noqa: E402
from strata_testsupport.pods import (  # noqa: E402
    API,
    RUNTIME_IMAGE,
    RUNTIME_UID,
    model_cache,
    s3_secret,
    static_volume,
    unique,
    wait_phase,
)
from strata_testsupport.realnode import install_strata, pod_security_namespace  # noqa: E402
from strata_testsupport.registry import running_registry  # noqa: E402
from strata_testsupport.s3 import running_s3_server  # noqa: E402

SIDES = ("no-model", "image-prepulled", "image-cold", "shared-pvc", "node-local")
FILES = 2
PULLED = re.compile(r"Successfully pulled image .* in ([0-9.]+)(ms|s)")


def make_model(directory: Path, size: int) -> int:
    """FILES safetensors files of random uint8 data and a config.json; returns the bytes written."""
    from strata_loader.tensor.writer import encode_header, layout

    directory.mkdir(parents=True)
    each = size // FILES
    for index in range(FILES):
        placed = layout([(f"w{index}", "U8", (each,))])
        with (directory / f"model-{index + 1:05d}-of-{FILES:05d}.safetensors").open("wb") as f:
            f.write(encode_header(placed, None))
            left = each
            while left:
                chunk = min(left, 64 << 20)
                f.write(os.urandom(chunk))
                left -= chunk
    (directory / "config.json").write_text('{"architectures": ["Bench"]}')
    return sum(p.stat().st_size for p in directory.iterdir())


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    drop_caches()
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed: {result.stderr[-2000:]}")
    return seconds, result.stdout


def consumer_start(client: Any, namespace: str, cache: str | None) -> tuple[str, float]:
    """Create -> container running for a pod wired to `cache` by its label (or with no model); deleted after."""
    name = unique("consumer")
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"strata.dev/model-cache": cache} if cache else {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "containers": [
                {"name": "main", "image": RUNTIME_IMAGE, "imagePullPolicy": "IfNotPresent", "command": ["sleep", "600"]}
            ],
        },
    }
    pods = resource(client, "v1", "Pod")
    started = time.monotonic()
    pods.create(namespace=namespace, body=body)

    def running() -> bool:
        status = pods.get(name=name, namespace=namespace).to_dict().get("status") or {}
        return any((s.get("state") or {}).get("running") for s in status.get("containerStatuses") or [])

    wait_for(running, timeout=600, interval=0.05, what=f"pod {name} running")
    seconds = time.monotonic() - started
    pods.delete(name=name, namespace=namespace, body={"gracePeriodSeconds": 0})
    wait_for(lambda: not pods.get(namespace=namespace, field_selector=f"metadata.name={name}").items, timeout=120)
    return name, seconds


def pulled_seconds(client: Any, namespace: str) -> dict[str, float]:
    """The kubelet's own pull time of each pod's image volume ("Successfully pulled image ... in 1.2s"), by pod."""
    found = {}
    for event in resource(client, "v1", "Event").get(namespace=namespace).to_dict()["items"]:
        if match := PULLED.search(event.get("message") or ""):
            value = float(match.group(1))
            found[event["involvedObject"]["name"]] = value / 1000 if match.group(2) == "ms" else value
    return found


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    size = make_model(tmp / "model", args.size_mib << 20)
    for round_ in range(args.rounds):  # the cold images: same size, their own bytes
        make_model(tmp / f"cold-{round_}", args.size_mib << 20)
    copy_s, _ = timed(["sh", "-c", f"cp -r '{tmp / 'model'}' '{tmp / 'copy'}' && sync"])
    shutil.rmtree(tmp / "copy")
    rows: dict[str, list[float]] = {side: [] for side in SIDES}
    cold_pods: list[str] = []
    with RealNode(node_images_archive()) as node:
        client = new_dynamic_client(str(node.kubeconfig))
        install_strata(node, client)
        with (
            running_registry(host=NODE_IP, auth=True, parent=WORK_DIR) as registry,
            running_s3_server(host=NODE_IP) as s3,
        ):
            node.trust_registry(registry.address, registry.ca_file)
            assert registry.ca_file is not None and registry.password is not None
            env = {**os.environ, "STRATA_REGISTRY_PASSWORD": registry.password}
            pushes, uris = [], {}
            for image in ["model", *(f"cold-{r}" for r in range(args.rounds))]:
                reference = registry.reference(f"models/{unique(image)}", "v1")
                argv = [sys.executable, "-m", "strata_loader.cli", "pack", str(tmp / image), "--to", reference]
                seconds, out = timed([*argv, *registry.pack_args()], env)
                pushes.append({"seconds": seconds, **json.loads(out)})
                uris[image] = f"oci://{reference}"
            for namespace in pod_security_namespace(client, "privileged"):  # NodeLocal's hostPath needs it
                caches = prepare_caches(client, namespace, registry, uris, s3, tmp / "model", args.rounds)
                for round_ in range(args.rounds):
                    order = SIDES if round_ % 2 == 0 else tuple(reversed(SIDES))
                    for side in order:
                        cache = caches.get(f"image-cold-{round_}" if side == "image-cold" else side)
                        pod, seconds = consumer_start(client, namespace, cache)
                        rows[side].append(seconds)
                        if side == "image-cold":
                            cold_pods.append(pod)
                pulls = pulled_seconds(client, namespace)
    cold = [pulls[p] for p in cold_pods if p in pulls]
    return {"bytes": size, "pushes": pushes, "push_s": [p["seconds"] for p in pushes], "copy_s": copy_s,
            "pull_s": cold, "pulls_by_pod": pulls, "rows": rows}  # fmt: skip


def prepare_caches(
    client: Any, namespace: str, registry: Any, uris: dict[str, str], s3: Any, model: Path, rounds: int
) -> dict[str, str]:
    """One Ready cache per side that has one (side -> cache name)."""
    auth = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    resource(client, "v1", "Secret").create(
        namespace=namespace,
        body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"},
              "type": "kubernetes.io/dockerconfigjson",
              "stringData": {".dockerconfigjson": json.dumps({"auths": {registry.address: {"auth": auth}}})}},
    )  # fmt: skip
    resource(client, "v1", "ConfigMap").create(
        namespace=namespace,
        body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "registry-ca"},
              "data": {"ca.crt": registry.ca_file.read_text()}},
    )  # fmt: skip
    image = {"pullSecretRef": {"name": "regcred"}, "caConfigMapRef": {"name": "registry-ca"}}
    caches = {"image-prepulled": "image-prepulled"}
    here = {"kubernetes.io/hostname": NODE_NAME}
    pulled = {**image, "prePull": True, "nodeSelector": here}
    volume = {"mode": "ImageVolume", "imageVolume": pulled}
    model_cache(client, namespace, "image-prepulled", {"source": {"uri": uris["model"]}, "storage": volume})
    for round_ in range(rounds):
        name = caches[f"image-cold-{round_}"] = f"image-cold-{round_}"
        volume = {"mode": "ImageVolume", "imageVolume": image}
        model_cache(client, namespace, name, {"source": {"uri": uris[f"cold-{round_}"]}, "storage": volume})
    wait_for(
        lambda: (resource(client, API, "ModelCache").get(name="image-prepulled", namespace=namespace).to_dict()
                 .get("status") or {}).get("readyNodes") == 1,
        timeout=600, what="the pre-pull",
    )  # fmt: skip

    s3_secret(client, namespace, "s3", s3.access_key, s3.secret_key)
    bucket = s3.create_bucket()
    for path in sorted(model.iterdir()):
        s3.client().upload_file(str(path), bucket, f"model/{path.name}")
    source = {"uri": f"s3://{bucket}/model", "credentials": {"secretRef": {"name": "s3"}},
              "s3": {"endpoint": s3.endpoint_url}}  # fmt: skip
    static_volume(client, namespace, "shared-pvc-model", size="4Gi")
    model_cache(
        client,
        namespace,
        "shared-pvc",
        {"source": source, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "4Gi"}}},
    )
    root = WORK_DIR / "models"
    root.mkdir(parents=True, exist_ok=True)
    os.chown(root, RUNTIME_UID, RUNTIME_UID)
    local = {"path": str(root), "nodeSelector": here}
    model_cache(
        client, namespace, "node-local", {"source": source, "storage": {"mode": "NodeLocal", "nodeLocal": local}}
    )
    for name in (*caches, "shared-pvc", "node-local"):
        status = wait_phase(client, namespace, name, {"Ready", "Degraded", "Failed"}, timeout=900)
        if status["phase"] != "Ready":
            raise SystemExit(f"{name}: {status.get('conditions')}")
    return {**caches, "shared-pvc": "shared-pvc", "node-local": "node-local"}


def summary(measured: dict[str, Any]) -> dict[str, Any]:
    rows = {
        side: {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs), "runs": runs}
        for side, runs in measured["rows"].items()
    }
    base = rows["image-prepulled"]["median_s"]
    for row in rows.values():
        row["over_image_prepulled"] = row["median_s"] / base
    pull = statistics.median(measured["pull_s"]) if measured["pull_s"] else None
    push = statistics.median(measured["push_s"])
    return {
        "table": rows,
        "pull_median_s": pull,
        "push_median_s": push,
        "push_over_copy": push / measured["copy_s"],
        "pull_over_copy": pull / measured["copy_s"] if pull else None,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = result["table"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    medians = [table[s]["median_s"] for s in SIDES]
    low = [table[s]["median_s"] - table[s]["min_s"] for s in SIDES]
    high = [table[s]["max_s"] - table[s]["median_s"] for s in SIDES]
    left.bar(SIDES, medians, yerr=[low, high], capsize=4, color=["#999", "#2e7d32", "#81c784", "#1565c0", "#6a1b9a"])
    for i, median in enumerate(medians):
        left.annotate(f"{median:.2f}s", (i, median), ha="center", va="bottom")
    left.set_ylabel("pod created -> container running (s)")
    left.set_title(f"consumer pod start, {result['bytes'] / 2**20:.0f} MiB model, real node")
    left.tick_params(axis="x", rotation=20)
    labels, values = ["cp -r + sync", "pack + push"], [result["copy_s"], result["push_median_s"]]
    if result["pull_median_s"]:
        labels.append("kubelet pull (cold)")
        values.append(result["pull_median_s"])
    right.bar(labels, values, color=["#999", "#2e7d32", "#81c784"][: len(values)])
    for i, value in enumerate(values):
        right.annotate(f"{value:.2f}s", (i, value), ha="center", va="bottom")
    right.set_ylabel("seconds (page cache dropped first)")
    right.set_title("moving the same bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "image_volume_start")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="image-volume-start-", dir="/var/tmp") as tmp:
        measured = measure(args, Path(tmp))
    result = measured | summary(measured) | {"rounds": args.rounds}
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "result.json").write_text(json.dumps(result, indent=2))
    plot(result, args.output / "start.png")
    print(f"model: {result['bytes'] / 2**20:.0f} MiB in {FILES} safetensors files + config.json; {args.rounds} rounds")
    print(f"{'consumer pod':<17}{'created -> running':>20}{'range':>16}{'x image-prepulled':>19}")
    for side, row in result["table"].items():
        span = f"{row['min_s']:.2f}-{row['max_s']:.2f}s"
        print(f"{side:<17}{row['median_s']:>19.2f}s{span:>16}{row['over_image_prepulled']:>18.2f}x")
    print(f"plain cp -r + sync: {result['copy_s']:.2f}s; pack + push: median {result['push_median_s']:.2f}s of "
          f"{[round(x, 2) for x in result['push_s']]} "
          f"({result['push_over_copy']:.2f}x the copy)")  # fmt: skip
    if result["pull_median_s"] is not None:
        print(f"kubelet pull of a cold image (its Event): median {result['pull_median_s']:.2f}s of {result['pull_s']} "
              f"({result['pull_over_copy']:.2f}x the copy)")  # fmt: skip
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
