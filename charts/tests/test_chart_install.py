"""The rendered chart applied for real to the local control plane: the API server validates every object,
RBAC is checked by the API server's own authorizer, and the operator runs with the chart's service account."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError
from strata_testsupport.cluster import install_crds
from strata_testsupport.kube import resource, service_account_may, wait_for
from strata_testsupport.processes import free_port, stop_process
from strata_testsupport.webhook import write_webhook_tls

pytestmark = pytest.mark.integration
FIELD_MANAGER = "strata-chart-tests"


def apply_all(k8s: DynamicClient, objects: list[dict[str, Any]]) -> None:
    """CRDs first (and wait until served), then everything else, by server-side apply as Helm 4 does."""
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    if crds:
        install_crds(k8s, crds)
    for obj in objects:
        if obj["kind"] == "CustomResourceDefinition":
            continue
        meta = obj["metadata"]
        resource(k8s, obj["apiVersion"], obj["kind"]).server_side_apply(
            body=obj,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )


def delete_cluster_scoped(k8s: DynamicClient, objects: list[dict[str, Any]]) -> None:
    """Cluster-scoped objects a release made (its namespace goes with the namespace); CRDs are shared: kept."""
    for obj in objects:
        if obj["metadata"].get("namespace") or obj["kind"] == "CustomResourceDefinition":
            continue
        with contextlib.suppress(NotFoundError):
            resource(k8s, obj["apiVersion"], obj["kind"]).delete(name=obj["metadata"]["name"])


def new_namespace(k8s: DynamicClient, labels: dict[str, str] | None = None) -> str:
    name = f"chart-{uuid.uuid4().hex[:8]}"
    resource(k8s, "v1", "Namespace").create(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    )
    return name


class Release:
    """One rendering of the chart, applied to its own namespace under a unique release name."""

    def __init__(self, k8s: DynamicClient, helm: Any, values: dict[str, Any], namespace: str) -> None:
        self.name = f"r{uuid.uuid4().hex[:6]}"
        self.namespace = namespace
        self.objects = helm.template(values, release=self.name, namespace=namespace, include_crds=True)
        apply_all(k8s, self.objects)

    def find(self, kind: str) -> dict[str, Any]:
        (found,) = [o for o in self.objects if o["kind"] == kind]
        return found

    @property
    def service_account(self) -> str:
        return self.find("ServiceAccount")["metadata"]["name"]


@pytest.fixture(scope="module")
def cluster_wide(k8s: DynamicClient, helm: Any) -> Iterator[Release]:
    """The default install: one replica watching all namespaces."""
    namespace = new_namespace(k8s)
    release = Release(k8s, helm, {}, namespace)
    yield release
    delete_cluster_scoped(k8s, release.objects)
    resource(k8s, "v1", "Namespace").delete(name=namespace)


@pytest.fixture(scope="module")
def namespaced(k8s: DynamicClient, helm: Any) -> Iterator[Release]:
    """Two replicas (kopf peering) watching only their own namespace."""
    namespace = new_namespace(k8s)
    values = {"replicaCount": 2, "watchNamespaces": [namespace], "peering": {"name": "strata-test"}}
    release = Release(k8s, helm, values, namespace)
    yield release
    delete_cluster_scoped(k8s, release.objects)
    resource(k8s, "v1", "Namespace").delete(name=namespace)


def can(
    k8s: DynamicClient,
    release: Release,
    verb: str,
    resource_name: str,
    *,
    group: str = "",
    namespace: str | None = None,
    subresource: str = "",
) -> bool:
    """The API server's own RBAC decision for the chart's service account."""
    return service_account_may(
        k8s, release.namespace, release.service_account, verb, resource_name,
        group=group, where=namespace, subresource=subresource,
    )  # fmt: skip


# What the operator needs is not listed here by hand: the integration tier records every API request the in-process
# operator makes and fails the session when the chart, installed for all namespaces or for one, refuses one
# (strata_testsupport.apirequests; docs/testing.md). Only what that tier never makes is kept here, each with why.
# (verb, group, resource, subresource) in a watched namespace:
NEEDED_IN_NAMESPACE = [
    # ModelCache spec.source.credentials.serviceAccountName is checked to exist (by name) before the preloader Job
    # names it; no integration test sets one.
    ("get", "", "serviceaccounts", ""),
]
NEEDED_CLUSTER_WIDE = [
    # KVCacheTier reads the Node of a KV server that is not ready, to say why; the integration tier's servers run
    # on kwok's nodes, which make every pod ready (the kind suite's lost node exercises it).
    ("get", "", "nodes", ""),
]
# Never: what a compromised operator must not be able to do.
FORBIDDEN_IN_NAMESPACE = [
    ("list", "", "secrets", ""),
    ("watch", "", "secrets", ""),
    ("patch", "", "secrets", ""),
    ("update", "", "secrets", ""),
    ("delete", "", "secrets", ""),
    ("create", "", "pods", ""),
    ("create", "", "pods", "exec"),
    ("update", "strata.dev", "modelcaches", ""),
    ("delete", "", "persistentvolumeclaims", ""),
    ("create", "rbac.authorization.k8s.io", "rolebindings", ""),
    ("create", "", "serviceaccounts", ""),
    ("delete", "apps", "daemonsets", ""),
    ("delete", "", "configmaps", ""),
    ("delete", "", "services", ""),
    ("delete", "networking.k8s.io", "networkpolicies", ""),
    ("get", "", "pods", ""),
    ("patch", "", "events", ""),
]
FORBIDDEN_CLUSTER_WIDE = [
    ("create", "strata.dev", "nodecachepolicies", ""),  # a platform team's setting: the operator only reads it
    ("patch", "strata.dev", "nodecachepolicies", ""),
    ("delete", "strata.dev", "nodecachepolicies", ""),
    ("delete", "", "nodes", ""),
    ("update", "", "nodes", ""),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
]


def namespaced_rules(release: Release) -> list[tuple[str, str, str, str]]:
    """(verb, group, resource, subresource) of every rule the chart binds in each watched namespace (the ClusterRoles
    its RoleBindings name; rules limited to named objects left out), read from the rendered chart."""
    bound = {
        o["roleRef"]["name"]
        for o in release.objects
        if o["kind"] == "RoleBinding" and o["roleRef"]["kind"] == "ClusterRole"
    }
    rules = [
        rule
        for o in release.objects
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] in bound
        for rule in o["rules"]
        if not rule.get("resourceNames")
    ]
    return [
        (verb, group, *resource_name.partition("/")[::2])
        for rule in rules
        for group in rule["apiGroups"]
        for resource_name in rule["resources"]
        for verb in rule["verbs"]
    ]


def test_cluster_wide_install_grants_the_unrecorded_calls_and_nothing_forbidden(k8s, cluster_wide):
    anywhere = new_namespace(k8s)
    try:
        for verb, group, name, sub in NEEDED_IN_NAMESPACE:
            assert can(k8s, cluster_wide, verb, name, group=group, namespace=anywhere, subresource=sub), (
                f"{verb} {group}/{name}/{sub}"
            )
        for verb, group, name, sub in NEEDED_CLUSTER_WIDE:
            assert can(k8s, cluster_wide, verb, name, group=group, subresource=sub), f"{verb} {group}/{name}"
        for verb, group, name, sub in FORBIDDEN_IN_NAMESPACE:
            assert not can(k8s, cluster_wide, verb, name, group=group, namespace=anywhere, subresource=sub), (
                f"{verb} {group}/{name}/{sub} should be denied"
            )
        for verb, group, name, sub in FORBIDDEN_CLUSTER_WIDE:
            assert not can(k8s, cluster_wide, verb, name, group=group, subresource=sub), f"{verb} {name}"
    finally:
        resource(k8s, "v1", "Namespace").delete(name=anywhere)


def test_namespaced_install_grants_nothing_outside_its_namespaces(k8s, namespaced):
    """Every rule the chart binds per namespace holds in the watched namespace and not in another one."""
    other = "default"
    rules = namespaced_rules(namespaced)
    assert ("patch", "strata.dev", "modelcaches", "status") in rules and ("create", "", "events", "") in rules
    for verb, group, name, sub in rules + NEEDED_IN_NAMESPACE:
        assert can(k8s, namespaced, verb, name, group=group, namespace=namespaced.namespace, subresource=sub)
        assert not can(k8s, namespaced, verb, name, group=group, namespace=other, subresource=sub), (
            f"{verb} {group}/{name} granted outside the watched namespace"
        )
    for verb, group, name, sub in NEEDED_CLUSTER_WIDE:
        assert can(k8s, namespaced, verb, name, group=group, subresource=sub), f"{verb} {group}/{name}"
    # By hand, as the in-process operator runs standalone over all namespaces: kopf's peering in the namespace...
    assert can(k8s, namespaced, "patch", "kopfpeerings", group="kopf.dev", namespace=namespaced.namespace)
    # ...and kopf matches its --namespace names against the namespaces it lists.
    assert can(k8s, namespaced, "watch", "namespaces")


def service_account_kubeconfig(k8s: DynamicClient, control_plane: Any, release: Release, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's service account (a bound token from TokenRequest)."""
    import kubernetes

    token = (
        kubernetes.client.CoreV1Api(k8s.client)
        .create_namespaced_service_account_token(
            release.service_account, release.namespace, body={"spec": {"expirationSeconds": 3600}}
        )
        .status.token
    )
    admin = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [{"name": "operator", "context": {"cluster": cluster["name"], "user": "operator"}}],
                "current-context": "operator",
            }
        )
    )
    return path


class OperatorProcess:
    def __init__(self, process: subprocess.Popen[bytes], log: Path, port: int) -> None:
        self.process, self.log, self.port = process, log, port

    def output(self) -> str:
        return self.log.read_text()

    def healthy(self) -> bool:
        assert self.process.poll() is None, f"operator exited:\n{self.output()[-4000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def assert_never_forbidden(self) -> None:
        refused = refused_calls(self.output())
        assert not refused, "\n".join(refused[:20]) + "\n...\n" + self.output()[-4000:]


def refused_calls(log: str) -> list[str]:
    """The log lines that report a call the API server refused. Every refusal carries the word "forbidden" (the
    client's `Reason: Forbidden`, kopf's `APIForbiddenError`, the server's "... is forbidden: User ..."), whereas the
    digits 403 also turn up in ports (46403) and timestamps (`19:22:19,403`), which once failed CI twice."""
    return [line for line in log.splitlines() if re.search(r"forbidden", line, re.IGNORECASE)]


@contextlib.contextmanager
def operator_from_chart(
    k8s: DynamicClient, control_plane: Any, release: Release, tmp: Path, pod_id: str
) -> Iterator[OperatorProcess]:
    """The operator as the chart's Deployment runs it: its args and env, its service account's token."""
    (container,) = release.find("Deployment")["spec"]["template"]["spec"]["containers"]
    port = free_port()
    args = [a.replace("http://0.0.0.0:8080", f"http://127.0.0.1:{port}") for a in container["args"]]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(POD_ID=pod_id, POD_NAMESPACE=release.namespace)
    if "STRATA_METRICS_PORT" in env:  # the chart's fixed port is the pod's own; here, a free one on this machine
        env["STRATA_METRICS_PORT"] = str(free_port())
    if "STRATA_WEBHOOK_CERT_DIR" in env:  # the chart's Secret is a file here, the port a free one
        env["STRATA_WEBHOOK_CERT_DIR"] = str(tmp / f"{pod_id}-webhook")
        if "STRATA_WEBHOOK_TLS_SECRET" not in env:  # else the operator writes the files itself
            write_webhook_tls(tmp / f"{pod_id}-webhook")
        env["STRATA_WEBHOOK_PORT"] = str(free_port())
    env["KUBECONFIG"] = str(service_account_kubeconfig(k8s, control_plane, release, tmp / f"{pod_id}.kubeconfig"))
    log = tmp / f"{pod_id}.log"
    # The image's entrypoint, `strata-operator`, is this module's main().
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "strata_operator.cli", *args],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    operator = OperatorProcess(process, log, port)
    try:
        wait_for(operator.healthy, timeout=60, what=f"{pod_id}'s /healthz")
        yield operator
    finally:
        stop_process(process, grace=20)


@pytest.fixture(scope="module")
def chart_operator(k8s, control_plane, namespaced, tmp_path_factory) -> Iterator[OperatorProcess]:
    with operator_from_chart(
        k8s, control_plane, namespaced, tmp_path_factory.mktemp("chart-operator"), "chart-test-peer"
    ) as operator:
        yield operator


def watched_resources() -> set[str]:
    """Every resource the operator's handlers and indexes watch (as kopf's registry holds them after
    `strata_operator.routes` registered them), and kopf's own peering object."""
    import kopf
    import strata_operator.routes  # noqa: F401 -- registers the handlers

    registry = kopf.get_default_registry()
    kinds = (registry._indexing, registry._watching, registry._spawning, registry._changing)
    plurals = {s.plural or s.any_name for kind in kinds for s in kind.get_all_selectors()}
    assert None not in plurals, "every route names its resource (by its plural)"
    return {str(p) for p in plurals} | {"kopfpeerings"}


def test_operator_runs_with_the_charts_args_env_and_service_account(k8s, control_plane, namespaced, chart_operator):
    """The operator starts, passes its health probe, joins the chart's peering object, starts a watch on every
    resource it watches (the API server's audit log shows each one answered), and never hits a 403."""
    peering = resource(k8s, "kopf.dev/v1", "KopfPeering")
    user = f"system:serviceaccount:{namespaced.namespace}:{namespaced.service_account}"
    wanted = watched_resources()

    def watching() -> bool:
        events = control_plane.audit_events(user)
        refused = [e for e in events if (e.get("responseStatus") or {}).get("code") == 403]
        assert not refused, f"the API server refused the operator's lists or watches: {refused[:5]}"
        started = {
            e["objectRef"]["resource"]
            for e in events
            if e["verb"] == "watch" and e["stage"] == "ResponseStarted" and e["responseStatus"].get("code") == 200
        }
        missing.clear()
        missing.update(wanted - started)
        return not missing

    missing: set[str] = set()

    def joined() -> bool:
        status = peering.get(name="strata-test", namespace=namespaced.namespace).to_dict().get("status") or {}
        return "chart-test-peer" in status

    try:
        wait_for(joined, timeout=30, what="the operator in the KopfPeering's status")
        # A watch starts only after its list was answered: once every one has, every first call was made.
        wait_for(watching, timeout=60, what="a watch of every resource the operator watches")
    except AssertionError as error:
        raise AssertionError(
            f"{error}\nnot watched: {sorted(missing)}\noperator log:\n{chart_operator.output()[-4000:]}"
        ) from None
    chart_operator.assert_never_forbidden()


def test_the_log_check_finds_a_real_refusal_and_not_403_in_ports_or_timestamps(control_plane):
    """The API server's own refusal of a call (made as an account that holds no Role) is found; a port and a
    millisecond timestamp that contain 403 are not."""
    import kubernetes

    client = kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    client.set_default_header("Impersonate-User", "system:serviceaccount:default:no-role")
    with pytest.raises(kubernetes.client.ApiException) as refusal:
        kubernetes.client.CoreV1Api(client).list_namespaced_secret("default")
    assert refusal.value.status == 403
    harmless = "[2026-12-01 19:22:19,403] kopf.objects [INFO] Handler 'x' succeeded.\nwebhook listening on :46403"
    assert refused_calls(harmless) == []
    assert refused_calls(f"{harmless}\n[ERROR] Request failed: {refusal.value}") != []


def test_operator_reconciles_samples_with_only_the_charts_permissions(k8s, namespaced, chart_operator):
    """A KVCacheTier and a ModelCache in the watched namespace get their children and a status, and the
    operator's log shows no 403: the handlers' real calls fit the chart's RBAC."""
    ns = namespaced.namespace
    tier = {"apiVersion": "strata.dev/v1alpha1", "kind": "KVCacheTier", "metadata": {"name": "rbac-kv"}, "spec": {}}
    cache = {
        "apiVersion": "strata.dev/v1alpha1",
        "kind": "ModelCache",
        "metadata": {"name": "rbac-model"},
        "spec": {
            "source": {"uri": "s3://models/tiny", "credentials": {"secretRef": {"name": "s3-credentials"}}},
            "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}},
        },
    }
    for body in (tier, cache):
        resource(k8s, body["apiVersion"], body["kind"]).create(body=body, namespace=ns)

    def reconciled(kind: str, name: str) -> bool:
        status = resource(k8s, "strata.dev/v1alpha1", kind).get(name=name, namespace=ns).to_dict().get("status")
        return bool(status and status.get("observedGeneration") == 1 and status.get("conditions"))

    try:
        wait_for(lambda: reconciled("KVCacheTier", "rbac-kv"), timeout=60, what="KVCacheTier status")
        wait_for(lambda: reconciled("ModelCache", "rbac-model"), timeout=60, what="ModelCache status")
        daemonsets = resource(k8s, "apps/v1", "DaemonSet")
        wait_for(lambda: daemonsets.get(name="rbac-kv", namespace=ns), timeout=30, what="the KV DaemonSet")
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{chart_operator.output()[-6000:]}") from None
    chart_operator.assert_never_forbidden()


def test_an_operator_keeping_its_own_webhook_certificate_needs_only_the_charts_permissions(
    k8s, control_plane, helm, tmp_path
):
    """webhook.tls.managedBy=operator: from the chart's env and RBAC alone, the operator fills the chart's empty
    Secret, writes the files it serves, and sets both configurations' caBundle to the Secret's CA, with no 403."""
    namespace = new_namespace(k8s)
    values = {"watchNamespaces": [namespace], "webhook": {"tls": {"managedBy": "operator", "validityDays": 365}}}
    release = Release(k8s, helm, values, namespace)
    secret_name = f"{release.name}-strata-webhook-tls"
    secrets = resource(k8s, "v1", "Secret")
    try:
        with operator_from_chart(k8s, control_plane, release, tmp_path, "tls-keeper") as operator:
            data = wait_for(
                lambda: secrets.get(name=secret_name, namespace=namespace).to_dict().get("data"),
                timeout=60,
                what="the operator to fill the webhook Secret",
            )
            for kind, suffix in (
                ("MutatingWebhookConfiguration", "pod-wiring"),
                ("ValidatingWebhookConfiguration", "cache-deletion"),
            ):
                configurations = resource(k8s, "admissionregistration.k8s.io/v1", kind)

                def bundles(configurations: Any = configurations, suffix: str = suffix) -> set[str]:
                    hooks = configurations.get(name=f"{release.name}-strata-{suffix}").webhooks
                    return {h.clientConfig.caBundle for h in hooks}

                wait_for(lambda: bundles() == {data["ca.crt"]}, timeout=30, what=f"{kind}'s caBundle")
            served = tmp_path / "tls-keeper-webhook" / "tls.crt"
            assert served.read_bytes() == base64.b64decode(data["tls.crt"])
            operator.assert_never_forbidden()
    finally:
        delete_cluster_scoped(k8s, release.objects)
        resource(k8s, "v1", "Namespace").delete(name=namespace)


def test_two_replicas_leave_exactly_one_active(k8s, control_plane, helm, tmp_path):
    """replicaCount: 2 as the chart renders it: one replica reconciles, the other stands by."""
    namespace = new_namespace(k8s)
    values = {"replicaCount": 2, "watchNamespaces": [namespace], "peering": {"name": "ha"}}
    release = Release(k8s, helm, values, namespace)
    try:
        with (
            operator_from_chart(k8s, control_plane, release, tmp_path, "replica-a") as first,
            operator_from_chart(k8s, control_plane, release, tmp_path, "replica-b") as second,
        ):
            peering = resource(k8s, "kopf.dev/v1", "KopfPeering")

            def both_joined() -> bool:
                status = peering.get(name="ha", namespace=namespace).to_dict().get("status") or {}
                return {"replica-a", "replica-b"} <= set(status)

            wait_for(both_joined, timeout=30, what="both replicas in the KopfPeering")
            # The replica with the lower priority says when it stands by; only then is exactly one active.
            wait_for(
                lambda: [op for op in (first, second) if "Pausing operations in favour of" in op.output()],
                timeout=60,
                what="one replica standing by",
            )
            tier = {"apiVersion": "strata.dev/v1alpha1", "kind": "KVCacheTier", "metadata": {"name": "ha-kv"}}
            tiers = resource(k8s, "strata.dev/v1alpha1", "KVCacheTier")
            tiers.create(body={**tier, "spec": {}}, namespace=namespace)

            def reconciled() -> bool:
                status = tiers.get(name="ha-kv", namespace=namespace).to_dict().get("status") or {}
                return status.get("observedGeneration") == 1

            wait_for(reconciled, timeout=20, what="the KVCacheTier reconciled by the active replica")
            handled = [op for op in (first, second) if "[" + namespace + "/ha-kv] Handler" in op.output()]
            assert len(handled) == 1, f"{len(handled)} of 2 replicas reconciled"
    finally:
        delete_cluster_scoped(k8s, release.objects)
        resource(k8s, "v1", "Namespace").delete(name=namespace)
