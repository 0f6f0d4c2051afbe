"""`kvSocketDriver.admissionPolicy`: the ValidatingAdmissionPolicy that keeps a tier's socket directory writable
for the tier's own KV server pods only. The plugin sees nothing but the pod's name, which any pod author in the
namespace chooses; the API server sees who creates the pod. Rendered by the real Helm CLI, then applied to the
real API server, where a pod author's hand-made pods and a real DaemonSet controller's pods meet it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException, NotFoundError
from strata_testsupport.kube import create_fake_node, delete_quietly, new_dynamic_client, resource, wait_for
from strata_testsupport.pods import admission_refusal

ON = {"kvSocketDriver": {"enabled": True}}
DRIVER = "kv.strata.dev"
AUTHOR = "tenant-author"  # may create pods in the tier's namespace (ClusterRole `edit`), nothing more
NOT_READ_ONLY = "set readOnly: true on the csi volume"
SA_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"
CM_USER = "system:kube-controller-manager"


def _policy_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")]


def _expressions(policy: dict[str, Any]) -> str:
    return "\n".join(v["expression"] for v in policy["spec"]["variables"] + policy["spec"]["validations"])


# -- rendering -------------------------------------------------------------------------------------------------


def test_installed_with_the_driver_by_default(helm, chart_helpers):
    objects = helm.template(ON)
    policy = chart_helpers.find(objects, "ValidatingAdmissionPolicy", "strata-kv-socket-writers")
    binding = chart_helpers.find(objects, "ValidatingAdmissionPolicyBinding", "strata-kv-socket-writers")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    # Pods' volumes never change after creation: CREATE is where a writable volume comes in.
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    assert binding["spec"] == {"policyName": "strata-kv-socket-writers", "validationActions": ["Deny"]}
    assert f"request.userInfo.username in {_json_list([SA_CONTROLLER, CM_USER])}" in _expressions(policy)
    assert f"v.csi.driver == '{DRIVER}'" in _expressions(policy)


def _json_list(items: list[str]) -> str:
    return "[" + ",".join(f'"{i}"' for i in items) + "]"


def test_not_installed_without_the_driver_or_when_turned_off(helm):
    assert not _policy_objects(helm.template())
    off = {"kvSocketDriver": {"enabled": True, "admissionPolicy": {"enabled": False}}}
    assert not _policy_objects(helm.template(off))


def test_the_trusted_users_come_from_the_values(helm, chart_helpers):
    values = {"kvSocketDriver": {"enabled": True, "admissionPolicy": {"daemonSetControllerUsers": ["ds-ctl"]}}}
    policy = chart_helpers.find(helm.template(values), "ValidatingAdmissionPolicy")
    assert 'request.userInfo.username in ["ds-ctl"]' in _expressions(policy)
    assert SA_CONTROLLER not in _expressions(policy)


@pytest.mark.parametrize("users", [[], ['x" || true || "'], ["two words"], "system:kube-controller-manager"])
def test_schema_rejects_users_that_are_not_names(helm, users):
    result = helm.template_raw(
        {"kvSocketDriver": {"enabled": True, "admissionPolicy": {"daemonSetControllerUsers": users}}}
    )
    assert result.returncode != 0, f"{users!r} was accepted"
    assert "daemonSetControllerUsers" in result.stderr


def test_a_cluster_without_the_api_is_told_what_to_change(helm):
    result = helm.template_raw(ON, extra=["--kube-version", "1.29.4"])
    assert result.returncode != 0
    assert "Kubernetes 1.30 or later" in result.stderr and "admissionPolicy.enabled=false" in result.stderr


# -- on the real API server --------------------------------------------------------------------------------------


def _csi_volume(read_only: bool | None, tier: str = "kv") -> dict[str, Any]:
    """`read_only` None leaves it out, as the operator renders its servers' volumes (the plugin's default is
    writable)."""
    csi: dict[str, Any] = {"driver": DRIVER, "volumeAttributes": {"tier": tier}}
    if read_only is not None:
        csi["readOnly"] = read_only
    return {"name": "kv-socket", "csi": csi}


def _pod(name: str, read_only: bool | None, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": [_csi_volume(read_only)]},
    }


@contextlib.contextmanager
def policy_in_effect(
    client: DynamicClient, helm: Any, namespace: str, users: list[str] | None = None
) -> Iterator[None]:
    """The chart's rendered policy and binding applied as they are, until the API server enforces them (a
    hand-made writable pod, tried with dryRun, is refused); removed afterwards, until it no longer does."""
    values: dict[str, Any] = {"kvSocketDriver": {"enabled": True}}
    if users is not None:
        values["kvSocketDriver"]["admissionPolicy"] = {"daemonSetControllerUsers": users}
    objects = _policy_objects(helm.template(values, release=f"p{uuid.uuid4().hex[:6]}"))
    for obj in objects:
        resource(client, obj["apiVersion"], obj["kind"]).create(body=obj)
    probe = _pod("kv-probe", None)
    try:
        wait_for(
            lambda: admission_refusal(client, namespace, probe, dry_run=True), timeout=30, what="the policy enforced"
        )
        policy = resource(client, "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")
        name = objects[0]["metadata"]["name"]
        checked = wait_for(
            lambda: (s := policy.get(name=name).to_dict().get("status") or {}).get("observedGeneration") and s,
            timeout=30,
            what="the policy's expressions type-checked",
        )
        assert not (checked.get("typeChecking") or {}).get("expressionWarnings"), checked
        yield
    finally:
        for obj in objects:
            with contextlib.suppress(NotFoundError):
                resource(client, obj["apiVersion"], obj["kind"]).delete(name=obj["metadata"]["name"])
        wait_for(
            lambda: not admission_refusal(client, namespace, probe, dry_run=True), timeout=30, what="the policy gone"
        )


def _namespace(client: DynamicClient) -> str:
    name = f"kvp-{uuid.uuid4().hex[:8]}"
    resource(client, "v1", "Namespace").create(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    return name


@pytest.fixture
def author(control_plane: Any, k8s: DynamicClient, namespace: str) -> DynamicClient:
    """A client acting as AUTHOR, who holds `edit` in `namespace` (creates pods and DaemonSets there)."""
    resource(k8s, "rbac.authorization.k8s.io/v1", "RoleBinding").create(
        namespace=namespace,
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "author-edits"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": AUTHOR}],
        },
    )
    api_client = kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    api_client.set_default_header("Impersonate-User", AUTHOR)
    client = DynamicClient(api_client)
    # The authorizer learns the binding from a watch: wait until a harmless pod passes (dryRun: nothing stays).
    wait_for(
        lambda: _try(lambda: admission_refusal(client, namespace, _pod("kv-ready", True), dry_run=True) == ""),
        timeout=30,
        what=f"{AUTHOR} may create pods in {namespace}",
    )
    return client


def _try(check: Any) -> bool:
    try:
        return bool(check())
    except ApiException:
        return False


@pytest.mark.integration
def test_a_pod_author_cannot_name_a_pod_into_the_servers_socket_directory(k8s, helm, namespace, author):
    """Named as DaemonSet `kv` names its pods, which is all the plugin checks: refused writable whether readOnly is
    false or left out, and with a forged ownerReference to the DaemonSet; admitted read-only."""
    with policy_in_effect(k8s, helm, namespace):
        for read_only in (None, False):
            refusal = admission_refusal(author, namespace, _pod("kv-x2b4c", read_only))
            assert "pod kv-x2b4c: volume kv-socket (csi driver kv.strata.dev) is writable" in refusal, refusal
            assert NOT_READ_ONLY in refusal, refusal
        forged = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "kv",
            "uid": str(uuid.uuid4()),
            "controller": True,
        }
        refusal = admission_refusal(author, namespace, _pod("kv-x2b4d", None, ownerReferences=[forged]))
        assert NOT_READ_ONLY in refusal, refusal
        refusal = admission_refusal(author, namespace, _pod("", None, generateName="kv-"))
        assert NOT_READ_ONLY in refusal, refusal
        assert admission_refusal(author, namespace, _pod("kv-x2b4c", True)) == ""
    stored = resource(k8s, "v1", "Pod").get(namespace=namespace, name="kv-x2b4c")
    assert stored.spec.volumes[0].csi.readOnly is True


# -- the DaemonSet controller's pods, with either identity it may have ------------------------------------------


def _server_daemonset(name: str, node: str, tier: str | None = None) -> dict[str, Any]:
    """What the operator renders for a tier's server, reduced to what the policy looks at."""
    labels = {"app": name}
    pod_spec = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "kvserver", "image": "busybox"}],
        "volumes": [_csi_volume(None, tier or name)],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }


def _daemonset_pods(client: DynamicClient, namespace: str, name: str) -> list[Any]:
    pods = resource(client, "v1", "Pod").get(namespace=namespace, label_selector=f"app={name}").items
    return [p for p in pods if any(r.kind == "DaemonSet" and r.name == name for r in p.metadata.ownerReferences or [])]


def _refused_create(client: DynamicClient, namespace: str, name: str) -> str:
    """The DaemonSet controller's FailedCreate event for DaemonSet `name` (its message is the API's refusal)."""
    events = resource(client, "v1", "Event").get(
        namespace=namespace, field_selector=f"involvedObject.kind=DaemonSet,involvedObject.name={name}"
    )
    return next((e.message for e in events.items if e.reason == "FailedCreate"), "")


class Cluster:
    def __init__(self, client: DynamicClient, controller_user: str) -> None:
        self.client = client
        self.controller_user = controller_user


@pytest.fixture(scope="module")
def service_account_cluster(require_tool: Any) -> Iterator[Cluster]:
    """A control plane whose controller manager runs with --use-service-account-credentials (kubeadm's way)."""
    from strata_testsupport.localcluster import BinariesNotFound, LocalCluster

    try:
        cluster = LocalCluster(service_account_credentials=True, scheduler=False)
    except BinariesNotFound as error:
        require_tool(str(error))
    if not cluster.want_controller_manager or not cluster.want_kwok:
        require_tool("kube-controller-manager and kwok are needed: build them with `make setup`")
    with cluster:
        yield Cluster(new_dynamic_client(str(cluster.kubeconfig)), cluster.controller_user("daemon-set-controller"))


@pytest.fixture(params=["own credentials", "service-account credentials"])
def cluster(request: pytest.FixtureRequest) -> Cluster:
    if request.param == "own credentials":
        control_plane = request.getfixturevalue("control_plane")
        return Cluster(request.getfixturevalue("k8s"), control_plane.controller_user("daemon-set-controller"))
    return request.getfixturevalue("service_account_cluster")


@contextlib.contextmanager
def _fake_node_and_namespace(client: DynamicClient) -> Iterator[tuple[str, str]]:
    node, namespace = f"kvp-{uuid.uuid4().hex[:8]}", _namespace(client)
    create_fake_node(client, node)
    try:
        yield node, namespace
    finally:
        resource(client, "v1", "Namespace").delete(name=namespace)
        delete_quietly(client, "v1", "Node", node, None)


@pytest.mark.integration
def test_the_daemonset_controller_creates_the_tiers_server_pods_writable(cluster, helm):
    """A real DaemonSet controller's pods for DaemonSet `kv` (and one with a name long enough to be cut) get their
    own tier's directory writable; a DaemonSet whose pods would write another tier's directory gets none."""
    client = cluster.client
    long_name = "kv-" + "l" * 57  # 60 characters: its pods are named <first 57>-<5 generated>
    with _fake_node_and_namespace(client) as (node, namespace), policy_in_effect(client, helm, namespace):
        daemonsets = resource(client, "apps/v1", "DaemonSet")
        for name in ("kv", long_name):
            daemonsets.create(namespace=namespace, body=_server_daemonset(name, node))
        daemonsets.create(namespace=namespace, body=_server_daemonset("kv-other", node, tier="kv"))
        for name in ("kv", long_name):
            (pod,) = wait_for(lambda n=name: _daemonset_pods(client, namespace, n), timeout=60, what=f"{name}'s pod")
            assert pod.metadata.name.startswith(f"{name}-"[:58]) and len(pod.metadata.name) == len(f"{name}-"[:58]) + 5
            assert not pod.spec.volumes[0].csi.readOnly
        refusal = wait_for(lambda: _refused_create(client, namespace, "kv-other"), timeout=60, what="FailedCreate")
        assert "DaemonSet kv-other's pods may write only tier kv-other's socket directory" in refusal, refusal
        assert "set volumeAttributes.tier: kv-other or readOnly: true" in refusal, refusal
        assert not _daemonset_pods(client, namespace, "kv-other")


@pytest.mark.integration
def test_only_the_users_named_in_the_values_create_writable_pods(service_account_cluster, helm):
    """With only the controller manager's own user trusted, a controller acting as its service account is
    refused like any pod author: whom to trust is the values' choice, not the ownerReference's."""
    client = service_account_cluster.client
    assert service_account_cluster.controller_user == SA_CONTROLLER
    with _fake_node_and_namespace(client) as (node, namespace), policy_in_effect(client, helm, namespace, [CM_USER]):
        resource(client, "apps/v1", "DaemonSet").create(namespace=namespace, body=_server_daemonset("kv", node))
        refusal = wait_for(lambda: _refused_create(client, namespace, "kv"), timeout=60, what="FailedCreate")
        assert NOT_READ_ONLY in refusal, refusal
        assert not _daemonset_pods(client, namespace, "kv")
