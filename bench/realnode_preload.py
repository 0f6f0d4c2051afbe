"""Preloading on the real node, side by side in one run: a ModelCache (`kubectl apply` -> `Ready`: the operator
pod, the preloader Job, `strata-loader fetch` with checksums, the termination message read back) against a
plain copy of the same bytes from the same S3 server into the same kind of volume (a Job from the same image
running boto3's `download_file` for every object), and how long a preloader Job's pod takes to start.

    sudo .venv/bin/python bench/realnode_preload.py --size-gib 1.5 [--repeat 2] [--json out.json]

Needs root (the node) and the images (built on first use). The S3 server is moto's, on the node's address:
~0.1-0.2 GB/s, so both sides are bound by it; the ratio says what the preloader's orchestration and
verification cost on top of a bare copy, not how fast either could go against a fast store.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))

from strata_testsupport.kube import new_dynamic_client, resource, wait_for  # noqa: E402
from strata_testsupport.localcluster.node import NODE_IP, RealNode, node_images_archive  # noqa: E402
from strata_testsupport.pods import (  # noqa: E402
    RESTRICTED_CONTAINER,
    RUNTIME_IMAGE,
    model_cache,
    rwx_claim,
    s3_model_spec,
    s3_secret,
    static_volume,
    wait_phase,
)
from strata_testsupport.realnode import install_strata, pod_security_namespace  # noqa: E402
from strata_testsupport.s3 import running_s3_server  # noqa: E402

FILE_BYTES = 512 << 20

# The peer: what a user would write without Strata, boto3's managed transfer for each object.
PLAIN_COPY = """
import os, sys, boto3
bucket, prefix, dest = sys.argv[1], sys.argv[2], sys.argv[3]
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1")
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
    for obj in page.get("Contents", []):
        s3.download_file(bucket, obj["Key"], os.path.join(dest, os.path.basename(obj["Key"])))
"""


def upload(s3: Any, bucket: str, prefix: str, size: int) -> int:
    """Safetensors files of random uint8 data, FILE_BYTES each; returns the bytes uploaded."""
    import os
    import tempfile

    from strata_loader.tensor.writer import encode_header, layout

    total, index, files = 0, 0, max(1, round(size / FILE_BYTES))
    client = s3.client()
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(files):
            placed = layout([(f"w{index}", "U8", (FILE_BYTES,))])
            path = Path(tmp) / f"model-{index + 1:05d}-of-{files:05d}.safetensors"
            with path.open("wb") as f:
                f.write(encode_header(placed, None))
                for _ in range(FILE_BYTES // (64 << 20)):
                    f.write(os.urandom(64 << 20))
            client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
            total += path.stat().st_size
            path.unlink()
    return total


def plain_copy(client: Any, namespace: str, s3: Any, bucket: str, prefix: str) -> float:
    name = f"plain-{uuid.uuid4().hex[:6]}"
    rwx_claim(client, namespace, name, size="8Gi")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "volumes": [{"name": "dest", "persistentVolumeClaim": {"claimName": name}}],
                    "containers": [
                        {
                            "name": "copy",
                            "image": RUNTIME_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "-c", PLAIN_COPY, bucket, prefix, "/dest"],
                            "env": [{"name": "S3_ENDPOINT", "value": s3.endpoint_url}],
                            "envFrom": [{"secretRef": {"name": "s3-credentials"}}],
                            "volumeMounts": [{"name": "dest", "mountPath": "/dest"}],
                            "securityContext": RESTRICTED_CONTAINER,
                        }
                    ],
                }
            },
        },
    }
    jobs = resource(client, "batch/v1", "Job")
    started = time.monotonic()
    jobs.create(namespace=namespace, body=job)

    def done() -> str | None:
        status = jobs.get(name=name, namespace=namespace).status
        return "ok" if status.succeeded else ("failed" if status.failed else None)

    outcome = wait_for(done, timeout=1800, interval=0.2, what="the plain copy Job")
    if outcome != "ok":
        raise SystemExit("the plain copy Job failed")
    return time.monotonic() - started


def strata_preload(client: Any, namespace: str, s3: Any, bucket: str, prefix: str) -> tuple[float, float]:
    """(apply -> Ready, Job created -> its container running) for one SharedPVC cache."""
    name = f"mc-{uuid.uuid4().hex[:6]}"
    static_volume(client, namespace, f"{name}-model", size="8Gi")
    started = time.monotonic()
    model_cache(client, namespace, name, s3_model_spec(s3, bucket, prefix, "s3-credentials", size="8Gi"))
    pods = resource(client, "v1", "Pod")
    jobs = resource(client, "batch/v1", "Job")
    job = wait_for(
        lambda: jobs.get(namespace=namespace, label_selector=f"app.kubernetes.io/instance={name}").items,
        timeout=120,
        interval=0.05,
        what="the preloader Job",
    )[0]
    job_seen = time.monotonic()

    def running() -> bool:
        for pod in pods.get(namespace=namespace, label_selector=f"job-name={job.metadata.name}").items:
            for status in pod.status.containerStatuses or []:
                if status.state.running or status.state.terminated:
                    return True
        return False

    wait_for(running, timeout=300, interval=0.05, what="the preloader's container running")
    pod_start = time.monotonic() - job_seen
    status = wait_phase(client, namespace, name, {"Ready", "Degraded", "Failed"}, timeout=1800)
    if status["phase"] != "Ready":
        raise SystemExit(f"preload failed: {status.get('conditions')}")
    return time.monotonic() - started, pod_start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    with RealNode(node_images_archive()) as node:
        client = new_dynamic_client(str(node.kubeconfig))
        install_strata(node, client)
        with running_s3_server(host=NODE_IP) as s3:
            for namespace in pod_security_namespace(client, "restricted"):
                s3_secret(client, namespace, "s3-credentials", s3.access_key, s3.secret_key)
                bucket = s3.create_bucket()
                size = upload(s3, bucket, "model", int(args.size_gib * 2**30))
                plain, strata, starts = [], [], []
                for _ in range(args.repeat):  # alternate, so neither side always runs on a warmer server
                    plain.append(plain_copy(client, namespace, s3, bucket, "model"))
                    ready, pod_start = strata_preload(client, namespace, s3, bucket, "model")
                    strata.append(ready)
                    starts.append(pod_start)
    result = {
        "bytes": size,
        "node_start_seconds": node.timings,
        "plain_copy_seconds": plain,
        "strata_apply_to_ready_seconds": strata,
        "preloader_pod_start_seconds": starts,
        "ratio_plain_over_strata": statistics.median(plain) / statistics.median(strata),
    }
    gib = size / 2**30
    print(f"model: {gib:.2f} GiB in {max(1, round(size / FILE_BYTES))} files, moto S3 on the node address")
    print(f"{'':34}{'median s':>10}{'GB/s':>8}")
    for label, runs in (("plain copy Job (boto3 download)", plain), ("ModelCache apply -> Ready", strata)):
        m = statistics.median(runs)
        print(f"{label:34}{m:10.1f}{size / m / 1e9:8.2f}")
    print(f"ratio (plain / strata, >1 = strata faster): {result['ratio_plain_over_strata']:.2f}")
    print(f"preloader Job -> container running: median {statistics.median(starts):.2f}s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
