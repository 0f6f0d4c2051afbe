"""End-to-end fixtures: a kind cluster (a control plane, two workers and a spare one that joins only when a test
adds it), Strata's images loaded, the chart installed.

Needs Docker (a daemon is started for the session when none answers and `dockerd` is installed) and kind (KIND, on
PATH, or built from its Go module by hack/build-kind.sh). The node image is chosen by E2E_NODE_IMAGE:
  local (the default as root with debootstrap)  built here with no pull by hack/kind/build-node-image.sh
  stock (the default otherwise)                 kind's own kindest/node image, which kind pulls (needs internet)
  any other value                               that image reference
Tests that need a GPU keep their condition: a GPU worker (e2e/kind-config-gpu.yaml) is used when the host has an
NVIDIA GPU with the NVIDIA container toolkit, or E2E_GPU=1; elsewhere those tests skip and say what they need.
`make test` runs it after the other tiers (under CI=true a missing prerequisite fails it); `make e2e` runs it alone.
Environment:
  E2E_KEEP_CLUSTER=1   leave the kind cluster running afterwards (and reuse one that exists)
  E2E_SKIP_BUILD=1     do not rebuild the images (they must already be loaded into the cluster)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
E2E = REPO / "e2e"
CLUSTER = "strata-e2e"
TAG = "e2e"
PREFIX = "ghcr.io/strata-dev/"
RUNTIME_IMAGE = f"{PREFIX}strata-runtime:{TAG}"
S3_IMAGE = f"strata-e2e-s3:{TAG}"
RELEASE, RELEASE_NAMESPACE = "strata", "strata-system"
NAMESPACE = "strata-e2e"
GPU_LABEL = {"strata.dev/e2e-gpu": "true"}
CONTROL_PLANE_ROLE = "node-role.kubernetes.io/control-plane"  # kubeadm's label and taint on the control plane
SPARE_LABEL = "strata.dev/e2e-spare"
"""e2e/kind-config.yaml's label on its spare worker (the kubelet's --node-labels, in the node's /kind/kubeadm.conf)."""


def run(*args: str, timeout: float = 1800, capture: bool = True, **kwargs: Any) -> str:
    """Run a command (`strata_testsupport.kindengines.run`); on failure, fail the test with its output."""
    from strata_testsupport import kindengines

    try:
        return kindengines.run(*args, timeout=timeout, capture=capture, **kwargs)
    except kindengines.CommandFailed as error:
        pytest.fail(str(error), pytrace=False)


def missing_gpu() -> list[str]:
    """What this host lacks to hand a GPU to a kind worker (nvkind's way; e2e/kind-config-gpu.yaml)."""
    if shutil.which("nvidia-smi") is None or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        return ["an NVIDIA GPU (nvidia-smi -L)"]
    missing = []
    runtime = subprocess.run(["docker", "info", "--format", "{{.DefaultRuntime}}"], capture_output=True, text=True)
    if runtime.stdout.strip() != "nvidia":
        missing.append("Docker's default runtime set to nvidia (`nvidia-ctk runtime configure --set-as-default`)")
    config = Path("/etc/nvidia-container-runtime/config.toml")
    if not config.exists() or "accept-nvidia-visible-devices-as-volume-mounts = true" not in config.read_text():
        missing.append(
            "accept-nvidia-visible-devices-as-volume-mounts = true in /etc/nvidia-container-runtime/config.toml"
        )
    return missing


def use_gpu() -> bool:
    return os.environ.get("E2E_GPU") == "1" or not missing_gpu()


def docker_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def missing_prerequisites() -> list[str]:
    """Everything this machine lacks for the suite, so one skip message names all of it."""
    missing = []
    if shutil.which("docker") is None:
        missing.append("docker CLI")
    elif not docker_answers() and not (shutil.which("dockerd") and os.geteuid() == 0):
        missing.append("a running Docker daemon")
    if not os.environ.get("KIND") and shutil.which("kind") is None and shutil.which("go") is None:
        missing.append("kind (sigs.k8s.io/kind) on PATH, KIND=/path/to/kind, or Go to build it")
    if shutil.which("go") is None and not os.environ.get("HELM"):
        missing.append("Go (to build Helm with hack/build-helm.sh) or HELM=/path/to/helm")
    return missing


@pytest.fixture(scope="session", autouse=True)
def prerequisites() -> None:
    missing = missing_prerequisites()
    if missing:
        from strata_testsupport.processes import unavailable

        unavailable("the kind suite needs: " + "; ".join(missing))


LIB = REPO / "hack" / "images" / "lib.sh"


@pytest.fixture(scope="session")
def docker_daemon(prerequisites: None) -> Iterator[None]:
    """A Docker daemon for the session: the one running, or one started by hack/images/lib.sh's ensure_dockerd (as
    the image builds start theirs: no default bridge, no iptables rules of its own, and runc-bounded where this
    host cannot grant every capability to kind's privileged nodes), stopped at the end."""
    started = None
    if not docker_answers():
        log = E2E / ".cache" / "dockerd.log"
        log.parent.mkdir(exist_ok=True)
        script = f'source "{LIB}"; ensure_dockerd "{log}"; echo "$started_dockerd"'
        started = int(run("bash", "-c", script).split()[-1])
    host_ok = subprocess.run(["bash", "-c", f'source "{LIB}"; host_grants_all_capabilities']).returncode == 0
    runtime = run("docker", "info", "--format", "{{.DefaultRuntime}}").strip()
    if not host_ok and runtime != "runc-bounded":
        pytest.fail(
            "this host cannot grant every capability, and the running Docker daemon's default runtime is "
            f"{runtime!r}: kind's privileged nodes would not start. Stop it and let the suite start one "
            "(hack/images/lib.sh ensure_dockerd), or give it --add-runtime runc-bounded=hack/images/runc-bounded "
            "--default-runtime runc-bounded",
            pytrace=False,
        )
    try:
        yield
    finally:
        # A kept cluster's nodes are this daemon's containers: it stays up with them.
        if started and os.environ.get("E2E_KEEP_CLUSTER") != "1":
            os.kill(started, signal.SIGTERM)


@pytest.fixture(scope="session")
def kind_binary(prerequisites: None) -> str:
    """kind: KIND, the one on PATH, or the one hack/build-kind.sh builds from the version hack/kind/go.mod pins."""
    found = os.environ.get("KIND") or shutil.which("kind")
    if found:
        return found
    return run("bash", str(REPO / "hack" / "build-kind.sh")).strip().splitlines()[-1]


def node_image_choice() -> str:
    """E2E_NODE_IMAGE, or the default: build the node image here when this machine can (root, debootstrap)."""
    choice = os.environ.get("E2E_NODE_IMAGE", "")
    if choice:
        return choice
    return "local" if os.geteuid() == 0 and shutil.which("debootstrap") else "stock"


@pytest.fixture(scope="session")
def node_image(docker_daemon: None) -> str | None:
    """The node image for `kind create cluster --image`, or None for kind's stock image."""
    choice = node_image_choice()
    if choice == "stock":
        return None
    if choice == "local":
        return run("bash", str(REPO / "hack" / "kind" / "build-node-image.sh"), timeout=3600).strip().splitlines()[-1]
    return choice


@pytest.fixture(scope="session")
def helm_binary() -> str:
    return run("bash", str(REPO / "hack" / "build-helm.sh")).strip().splitlines()[-1]


@pytest.fixture(scope="session")
def kind_cluster(kind_binary: str, node_image: str | None) -> Iterator[Path]:
    """The kind cluster's kubeconfig: a control plane and two CPU workers, or one GPU worker where there is a GPU."""
    keep = os.environ.get("E2E_KEEP_CLUSTER") == "1"
    config = E2E / ("kind-config-gpu.yaml" if use_gpu() else "kind-config.yaml")
    kubeconfig = E2E / ".cache" / "kubeconfig"
    kubeconfig.parent.mkdir(exist_ok=True)
    existing = run(kind_binary, "get", "clusters").split()
    if CLUSTER not in existing:
        # Its own kubeconfig file: kind leaves the user's ~/.kube/config alone.
        create = [kind_binary, "create", "cluster", "--name", CLUSTER, "--config", str(config), "--wait", "5m"]
        create += ["--kubeconfig", str(kubeconfig)]
        if node_image:
            create += ["--image", node_image]
        run(*create)
    kubeconfig.write_text(run(kind_binary, "get", "kubeconfig", "--name", CLUSTER))
    spare = spare_container(kind_binary)
    if spare:
        # Before anything is installed: nothing of the suite's lands on a node that leaves.
        SpareWorker(spare, kubeconfig).leave()
    try:
        yield kubeconfig
    finally:
        if not keep:
            subprocess.run([kind_binary, "delete", "cluster", "--name", CLUSTER], timeout=600)


def spare_container(kind_binary: str) -> str | None:
    """The node container whose kubelet is configured with SPARE_LABEL (kind names a node after its container)."""
    for container in run(kind_binary, "get", "nodes", "--name", CLUSTER).split():
        config = subprocess.run(
            ["docker", "exec", container, "cat", "/kind/kubeadm.conf"], capture_output=True, text=True
        )
        if SPARE_LABEL in config.stdout:
            return container
    return None


class SpareWorker:
    """A node container of the cluster that is not a Node of it until a test joins it: a machine a node pool adds.
    `join` runs what kind ran to join it (`kubeadm join --config /kind/kubeadm.conf`, whose bootstrap token lives a
    day); `leave` is a node removed from its pool (`kubeadm reset`, its Node deleted), so it can join again."""

    def __init__(self, container: str, kubeconfig: Path) -> None:
        from strata_testsupport.kube import new_dynamic_client

        self.name = container
        self.client = new_dynamic_client(str(kubeconfig))

    def node(self) -> Any:
        from strata_testsupport.kube import get_or_none

        return get_or_none(self.client, "v1", "Node", self.name, None)

    def join(self, timeout: float = 300) -> str:
        """Join, and wait until the Node is Ready; returns its InternalIP."""
        from strata_testsupport.kube import wait_for

        assert self.node() is None, f"{self.name} is already a node of the cluster"
        run("docker", "exec", self.name, "kubeadm", "join", "--config", "/kind/kubeadm.conf", timeout=timeout)

        def ready() -> str | None:
            node = self.node()
            conditions = {c.type: c.status for c in (node.status.conditions or [])} if node else {}
            if conditions.get("Ready") != "True":
                return None
            return next(a.address for a in node.status.addresses if a.type == "InternalIP")

        return wait_for(ready, timeout=timeout, interval=2, what=f"{self.name} joined and Ready")

    def leave(self) -> None:
        from strata_testsupport.kube import delete_quietly, wait_for

        run("docker", "exec", self.name, "kubeadm", "reset", "--force")
        # As reset's own output advises: its pod network configuration goes too (a pod started on the next join
        # before the network rewrites it would take an address from the CIDR the node had before).
        run("docker", "exec", self.name, "sh", "-c", "rm -rf /etc/cni/net.d/*")
        delete_quietly(self.client, "v1", "Node", self.name, None)
        wait_for(lambda: self.node() is None, timeout=120, interval=1, what=f"{self.name}'s Node deleted")


@pytest.fixture(scope="session")
def spare_worker(kind_cluster: Path, kind_binary: str) -> Iterator[SpareWorker]:
    """e2e/kind-config.yaml's spare worker, out of the cluster; it is out again after the test that joins it."""
    container = spare_container(kind_binary)
    if container is None:
        pytest.skip("the cluster has no spare worker (e2e/kind-config-gpu.yaml has none): nothing can join it")
    spare = SpareWorker(container, kind_cluster)
    yield spare
    if spare.node() is not None:
        spare.leave()


@pytest.fixture(scope="session")
def k8s_e2e(kind_cluster: Path) -> Any:
    from strata_testsupport.kube import new_dynamic_client

    return new_dynamic_client(str(kind_cluster))


def gpu_nodes(k8s: Any) -> list[Any]:
    from strata_testsupport.kube import resource

    selector = ",".join(f"{k}={v}" for k, v in GPU_LABEL.items())
    return list(resource(k8s, "v1", "Node").get(label_selector=selector).items)


@pytest.fixture(scope="session")
def gpu_node(k8s_e2e: Any) -> str:
    """The worker, with containerd on the NVIDIA runtime and NVIDIA's device plugin advertising its GPUs."""
    from strata_testsupport.kube import wait_for

    missing = missing_gpu()
    if missing:
        pytest.skip("needs a GPU worker: " + "; ".join(missing))
    (node,) = gpu_nodes(k8s_e2e)
    name = node.metadata.name
    with (E2E / "gpu-node-setup.sh").open() as script:
        run("docker", "exec", "-i", name, "bash", stdin=script)
    apply_file(k8s_e2e, E2E / "manifests" / "nvidia-device-plugin.yaml", namespace=None)

    def gpus() -> int:
        (current,) = gpu_nodes(k8s_e2e)
        return int((current.status.allocatable or {}).get("nvidia.com/gpu", 0))

    wait_for(gpus, timeout=300, interval=2, what=f"nvidia.com/gpu allocatable on {name}")
    return name


@pytest.fixture(scope="session")
def images(kind_cluster: Path, kind_binary: str) -> None:
    """Strata's images loaded into every node with `kind load docker-image`. With a GPU: built by images/build.sh
    (the same script as `make images`) with torch for the GPU load test, and the S3 server's. On CPU: the operator
    and runtime images hack/node/build-images.sh builds with no pull (the real node's), tagged for this suite."""
    if os.environ.get("E2E_SKIP_BUILD") == "1":
        return
    if not use_gpu():
        archive = run("bash", str(REPO / "hack" / "node" / "build-images.sh"), timeout=3600).strip().splitlines()[-1]
        run("docker", "load", "--input", archive)
        version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        for name in ("strata-operator", "strata-runtime"):
            run("docker", "tag", f"{PREFIX}{name}:{version}", f"{PREFIX}{name}:{TAG}")
            run(kind_binary, "load", "docker-image", "--name", CLUSTER, f"{PREFIX}{name}:{TAG}")
        return
    # The GPU load test imports torch in the runtime image: build it with the tensor extra.
    env = {
        **os.environ,
        "IMAGE_TAG": TAG,
        "IMAGE_PREFIX": PREFIX,
        "KIND_CLUSTER": CLUSTER,
        "BUILD_ARGS": "--build-arg STRATA_EXTRAS=runtime,tensor",
    }
    run("bash", str(REPO / "images" / "build.sh"), env=env, capture=False)
    run("docker", "build", "--tag", S3_IMAGE, str(E2E / "s3"), capture=False)
    run(kind_binary, "load", "docker-image", "--name", CLUSTER, S3_IMAGE)


@pytest.fixture(scope="session")
def strata_release(kind_cluster: Path, images: None, helm_binary: str) -> Iterator[dict[str, str]]:
    """The chart installed as a user would (`helm upgrade --install --wait`), images from the build above."""
    env = {**os.environ, "KUBECONFIG": str(kind_cluster)}
    run(
        helm_binary,
        "upgrade",
        "--install",
        RELEASE,
        str(REPO / "charts" / "strata"),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        f"image.tag={TAG}",
        "--set",
        f"runtimeImage.tag={TAG}",
        "--set",
        "verbose=true",
        env=env,
    )
    yield {"helm": helm_binary, "kubeconfig": str(kind_cluster)}
    subprocess.run(
        [helm_binary, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait"], env=env, timeout=600
    )


def kind_gateway() -> str:
    """The host's IPv4 address on kind's Docker network: the nodes reach the host there, nothing else does."""
    out = run("docker", "network", "inspect", "kind", "--format", "{{range .IPAM.Config}}{{.Gateway}} {{end}}")
    return next(address for address in out.split() if ":" not in address)


@pytest.fixture(scope="session")
def kind_s3(kind_cluster: Path) -> Iterator[Any]:
    """A real S3 server on this host at kind's gateway address: the origin models are read from. Pod traffic leaves
    the pod network masqueraded as its node, so the server's own access log says which node read what."""
    from strata_testsupport.s3 import running_s3_server

    with running_s3_server(host=kind_gateway()) as server:
        yield server


@pytest.fixture(scope="session")
def kind_workers(k8s_e2e: Any) -> dict[str, str]:
    """The CPU workers, name -> InternalIP (the address their pods' traffic carries outside the pod network); the
    spare worker is not one of them, even while it is joined."""
    from strata_testsupport.kube import resource

    workers = {}
    for node in resource(k8s_e2e, "v1", "Node").get().items:
        taints, labels = {t.key for t in node.spec.taints or []}, node.metadata.labels or {}
        if CONTROL_PLANE_ROLE in labels or CONTROL_PLANE_ROLE in taints or SPARE_LABEL in labels:
            continue
        workers[node.metadata.name] = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    return workers


@pytest.fixture(scope="module")
def stock_vllm() -> Iterator[Any]:
    """The stock vLLM CPU image's archive, imported into a worker by the test when its engine needs it and dropped
    from every worker it is still in at the end."""
    from strata_testsupport.kindengines import StockImage
    from strata_testsupport.localcluster.node import NodeUnavailable, stock_vllm_image_archive

    try:
        archive = stock_vllm_image_archive()
    except NodeUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    image = StockImage(archive)
    try:
        yield image
    finally:
        for worker in sorted(image.loaded):
            image.drop(worker)


@pytest.fixture
def hostpath_namespace(k8s_e2e: Any) -> Iterator[str]:
    """For what the design cannot run restricted: NodeLocal's hostPath (docs/security.md says so); deleted after."""
    from strata_testsupport.realnode import pod_security_namespace

    yield from pod_security_namespace(k8s_e2e, "privileged")


def apply_object(k8s: Any, obj: dict[str, Any], namespace: str | None) -> Any:
    from strata_testsupport.kube import resource

    meta = obj["metadata"]
    ns = meta.get("namespace", namespace)
    return resource(k8s, obj["apiVersion"], obj["kind"]).server_side_apply(
        body=obj, name=meta["name"], namespace=ns, field_manager="strata-e2e", force_conflicts=True
    )


def apply_file(k8s: Any, path: Path, namespace: str | None) -> list[dict[str, Any]]:
    objects = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for obj in objects:
        apply_object(k8s, obj, namespace)
    return objects


@pytest.fixture(scope="session")
def e2e_namespace(k8s_e2e: Any) -> Iterator[str]:
    """Where the test resources live; it enforces the restricted Pod Security Standard for real."""
    from strata_testsupport.kube import resource

    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    apply_object(
        k8s_e2e, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}, None
    )
    yield NAMESPACE
    resource(k8s_e2e, "v1", "Namespace").delete(name=NAMESPACE)


@pytest.fixture(scope="session")
def scripts_config_map(k8s_e2e: Any, e2e_namespace: str) -> str:
    data = {path.name: path.read_text() for path in sorted((E2E / "scripts").glob("*.py"))}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e2e-scripts"}, "data": data}
    apply_object(k8s_e2e, body, e2e_namespace)
    return "e2e-scripts"


def sample(kind: str) -> dict[str, Any]:
    """The first object of `kind` in samples/: the suite runs the samples users start from, not copies."""
    for path in sorted((REPO / "samples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind:
                return dict(doc)
    pytest.fail(f"samples/ has no {kind}: the end-to-end suite applies the samples", pytrace=False)


def runtime_job(
    name: str,
    script: str,
    *,
    env: list[dict[str, Any]] | None = None,
    env_from: list[dict[str, Any]] | None = None,
    gpu: bool = False,
    on_gpu_node: bool = False,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A one-shot Job running one of e2e/scripts from the runtime image, hardened for "restricted"."""
    container: dict[str, Any] = {
        "name": "main",
        "image": RUNTIME_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", f"/scripts/{script}"],
        "env": env or [],
        "envFrom": env_from or [],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "scripts", "mountPath": "/scripts", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            *(mounts or []),
        ],
    }
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            {"name": "scripts", "configMap": {"name": "e2e-scripts"}},
            {"name": "tmp", "emptyDir": {}},
            *(volumes or []),
        ],
    }
    if gpu or on_gpu_node:
        pod["nodeSelector"] = dict(GPU_LABEL)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 600, "template": {"spec": pod}},
    }


def run_job(k8s: Any, job: dict[str, Any], namespace: str, timeout: float = 600) -> dict[str, Any]:
    """Apply a Job, wait for it to finish, and return its pod (for the node) and its JSON result (last line)."""
    import kubernetes
    from strata_testsupport.kube import resource, wait_for

    name = job["metadata"]["name"]
    apply_object(k8s, job, namespace)
    jobs = resource(k8s, "batch/v1", "Job")

    def finished() -> str | None:
        status = jobs.get(name=name, namespace=namespace).to_dict().get("status") or {}
        return "succeeded" if status.get("succeeded") else "failed" if status.get("failed") else None

    outcome = wait_for(finished, timeout=timeout, interval=2, what=f"Job {name}")
    core = kubernetes.client.CoreV1Api(k8s.client)
    (pod,) = core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
    log = core.read_namespaced_pod_log(pod.metadata.name, namespace)
    assert outcome == "succeeded", f"Job {name} failed:\n{log[-4000:]}"
    return {"node": pod.spec.node_name, "result": json.loads(log.strip().splitlines()[-1])}


def wait_condition(
    k8s: Any, api_version: str, kind: str, name: str, namespace: str, condition: str, timeout: float
) -> dict[str, Any]:
    """Wait for a status condition to be True (as `kubectl wait --for=condition=...` does); returns the object."""
    from strata_testsupport.kube import resource, wait_for

    api = resource(k8s, api_version, kind)
    last: dict[str, Any] = {}

    def ready() -> bool:
        nonlocal last
        last = api.get(name=name, namespace=namespace).to_dict()
        conditions = (last.get("status") or {}).get("conditions") or []
        return any(c.get("type") == condition and c.get("status") == "True" for c in conditions)

    try:
        wait_for(ready, timeout=timeout, interval=3, what=f"{kind} {name} {condition}")
    except AssertionError as error:
        raise AssertionError(f"{error}\nstatus: {json.dumps(last.get('status'), indent=1)}") from None
    return last


def wait_gone(
    k8s: Any, api_version: str, kind: str, namespace: str | None, label_selector: str, timeout: float = 180
) -> None:
    from strata_testsupport.kube import resource, wait_for

    api = resource(k8s, api_version, kind)

    def gone() -> bool:
        return not api.get(namespace=namespace, label_selector=label_selector).items

    wait_for(gone, timeout=timeout, interval=2, what=f"no {kind} left matching {label_selector}")


# Helpers handed to the tests as one fixture (the test module cannot import this conftest by name).
@pytest.fixture(scope="session")
def e2e() -> Any:
    class Helpers:
        apply_object = staticmethod(apply_object)
        run_job = staticmethod(run_job)
        runtime_job = staticmethod(runtime_job)
        sample = staticmethod(sample)
        wait_condition = staticmethod(wait_condition)
        wait_gone = staticmethod(wait_gone)
        run = staticmethod(run)
        runtime_image = RUNTIME_IMAGE
        release, release_namespace = RELEASE, RELEASE_NAMESPACE
        e2e_dir = E2E

    return Helpers
