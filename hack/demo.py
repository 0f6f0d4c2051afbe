"""`make demo`: a real local control plane, the operator, Strata's samples, and what the operator made.

Steps: start etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok on loopback,
install the CRDs, add fake GPU nodes (kwok), run `strata-operator run` as a real process, apply every
sample in samples/, print the children and status the operator produced, then stop everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))

from strata_operator.api.registry import all_crds  # noqa: E402
from strata_testsupport.localcluster import LocalCluster  # noqa: E402
from strata_testsupport.localcluster.cluster import free_port  # noqa: E402
from strata_testsupport.cluster import install_crds  # noqa: E402
from strata_testsupport.kube import create_fake_node, new_dynamic_client, resource  # noqa: E402

CHILD_KINDS = [
    ("batch/v1", "Job"),
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "DaemonSet"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "Pod"),
]


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def apply_samples(client: Any, namespace: str) -> list[dict[str, Any]]:
    applied = []
    for path in sorted((REPO / "samples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            doc.setdefault("metadata", {})["namespace"] = namespace
            api = resource(client, doc["apiVersion"], doc["kind"])
            api.server_side_apply(
                body=doc,
                name=doc["metadata"]["name"],
                namespace=namespace,
                field_manager="strata-demo",
                force_conflicts=True,
            )
            print(f"applied {doc['kind']}/{doc['metadata']['name']} from samples/{path.name}")
            applied.append(doc)
    return applied


def show_children(client: Any, namespace: str) -> None:
    for api_version, kind in CHILD_KINDS:
        items = resource(client, api_version, kind).get(namespace=namespace).items
        managed = [
            i
            for i in items
            if (i.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "strata" or kind == "Pod"
        ]
        for item in managed:
            owners = ",".join(f"{o.kind}/{o.name}" for o in (item.metadata.ownerReferences or []))
            print(f"  {kind:<22} {item.metadata.name:<48} owner={owners or '-'}")


def show_status(client: Any, namespace: str, applied: list[dict[str, Any]]) -> None:
    for doc in applied:
        if not doc["apiVersion"].startswith("strata.dev/"):
            continue
        obj = resource(client, doc["apiVersion"], doc["kind"]).get(name=doc["metadata"]["name"], namespace=namespace)
        status = obj.to_dict().get("status") or {}
        conditions = ", ".join(f"{c['type']}={c['status']}({c['reason']})" for c in status.get("conditions", []))
        print(f"  {doc['kind']}/{doc['metadata']['name']}: phase={status.get('phase', '-')} {conditions}")
        if status.get("volume"):
            print("    volume for serving pods: " + json.dumps(status["volume"]))


def show_connection(client: Any, namespace: str, applied: list[dict[str, Any]]) -> None:
    """The `<tier>-connection` ConfigMap: what a vLLM pod passes as --kv-transfer-config, and its env."""
    for doc in applied:
        if doc["kind"] != "KVCacheTier":
            continue
        name = f"{doc['metadata']['name']}-connection"
        configmap = resource(client, "v1", "ConfigMap").get(name=name, namespace=namespace)
        for key, value in (configmap.data or {}).items():
            print(f"  {name}[{key}]: {value}")


def wait_for_status(client: Any, namespace: str, applied: list[dict[str, Any]], operator: Any) -> None:
    """Wait (up to a minute) until every Strata resource has conditions, or the operator exits."""
    deadline = time.monotonic() + 60
    strata = [d for d in applied if d["apiVersion"].startswith("strata.dev/")]
    while time.monotonic() < deadline and operator.poll() is None:
        pending = [
            d
            for d in strata
            if not (
                resource(client, d["apiVersion"], d["kind"])
                .get(name=d["metadata"]["name"], namespace=namespace)
                .to_dict()
                .get("status")
                or {}
            ).get("conditions")
        ]
        if not pending:
            return
        time.sleep(1)


def main() -> int:
    started = time.monotonic()
    banner("starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)")
    with LocalCluster() as cluster:
        print(
            f"API server {cluster.server} ready in {time.monotonic() - started:.1f}s; kubeconfig {cluster.kubeconfig}"
        )
        client = new_dynamic_client(str(cluster.kubeconfig))
        install_crds(client, all_crds())
        print("CRDs installed: " + ", ".join(c["metadata"]["name"] for c in all_crds()))
        for index in range(2):
            create_fake_node(client, f"gpu-node-{index}", labels={"nvidia.com/gpu.present": "true"})
        print("fake GPU nodes (kwok): gpu-node-0, gpu-node-1")
        resource(client, "v1", "Namespace").create(
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}
        )

        banner("running the operator: strata-operator run")
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        log = (cluster.workdir / "operator.log").open("wb")
        operator = subprocess.Popen(
            [sys.executable, "-m", "strata_operator.cli", "run", f"--liveness=http://127.0.0.1:{free_port()}/healthz"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            applied = apply_samples(client, "demo")
            wait_for_status(client, "demo", applied, operator)
            banner("what the operator created in namespace demo")
            show_children(client, "demo")
            banner("status")
            show_status(client, "demo", applied)
            print(
                "  (no kubelet runs here: kwok marks pods running and Job pods complete without running the\n"
                "   loader, so NodeLocal caches cannot verify a result and say so; no storage provisioner\n"
                "   binds the shared PVC, so SharedPVC stays Preloading)"
            )
            banner("vLLM connection info")
            show_connection(client, "demo", applied)
        finally:
            operator.terminate()
            operator.wait(20)
            log.close()
            if operator.returncode not in (0, -15):
                print((cluster.workdir / "operator.log").read_text()[-4000:])
                raise SystemExit(f"the operator exited with {operator.returncode}")
        banner("stopping the control plane")
    print(f"demo finished in {time.monotonic() - started:.1f}s; everything stopped and removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
