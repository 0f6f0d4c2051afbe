"""The chart's pod admission webhook: the rendered configuration, its TLS (Helm-generated or cert-manager), the
Deployment serving it, and the RBAC for lifting scheduling gates, checked by the API server's own authorizer."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError
from strata_operator.resources.core import KV_TIER_LABEL, MODEL_CACHE_LABEL
from strata_operator.settings import Settings
from strata_operator.webhook.admission import MUTATE_PODS_PATH, VALIDATE_DELETION_PATH
from strata_testsupport.helm import CHART
from strata_testsupport.kube import resource, service_account_may, wait_for


def rendered(helm: Any, values: dict[str, Any] | None = None, namespace: str = "strata-system") -> list[dict]:
    return [o for o in helm.template(values or {}, release="strata", namespace=namespace) if o]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def test_only_opted_in_pods_are_sent_and_a_failure_refuses_them(helm):
    objects = rendered(helm)
    configuration = only(objects, "MutatingWebhookConfiguration")
    webhooks = {w["name"]: w for w in configuration["webhooks"]}
    assert set(webhooks) == {"model-cache.pods.strata.dev", "kv-cache-tier.pods.strata.dev"}
    assert webhooks["model-cache.pods.strata.dev"]["objectSelector"] == {
        "matchExpressions": [{"key": MODEL_CACHE_LABEL, "operator": "Exists"}]
    }
    assert webhooks["kv-cache-tier.pods.strata.dev"]["objectSelector"] == {
        "matchExpressions": [
            {"key": KV_TIER_LABEL, "operator": "Exists"},
            {"key": MODEL_CACHE_LABEL, "operator": "DoesNotExist"},  # the model-cache webhook wires both
        ]
    }
    for hook in webhooks.values():
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        assert hook["timeoutSeconds"] <= 10
        assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
        assert hook["clientConfig"]["service"] == {
            "name": "strata-webhook",
            "namespace": "strata-system",
            "path": MUTATE_PODS_PATH,
            "port": 443,
        }
        assert "namespaceSelector" not in hook


def test_deleting_a_cache_in_use_is_checked_but_never_blocked_by_an_outage(helm):
    objects = rendered(helm)
    (hook,) = only(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["rules"][0]["operations"] == ["DELETE"]
    assert hook["rules"][0]["resources"] == ["modelcaches", "kvcachetiers"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["clientConfig"]["service"]["path"] == VALIDATE_DELETION_PATH
    mutating = only(objects, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == mutating["clientConfig"]["caBundle"]
    off = rendered(helm, {"webhook": {"protectInUse": False}})
    assert not [o for o in off if o["kind"] == "ValidatingWebhookConfiguration"]


def test_helm_generated_ca_signs_the_served_certificate(helm):
    objects = rendered(helm)
    configuration = only(objects, "MutatingWebhookConfiguration")
    secret = only(objects, "Secret")
    ca = x509.load_pem_x509_certificate(base64.b64decode(configuration["webhooks"][0]["clientConfig"]["caBundle"]))
    served = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert base64.b64decode(secret["data"]["ca.crt"]) == base64.b64decode(
        configuration["webhooks"][1]["clientConfig"]["caBundle"]
    )
    assert served.issuer == ca.subject
    served.verify_directly_issued_by(ca)
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert "strata-webhook.strata-system.svc" in names


def test_the_operator_serves_the_secret_on_the_services_port(helm):
    objects = rendered(helm)
    deployment = only(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    assert env["STRATA_WEBHOOK_CERT_DIR"] == mount["mountPath"] and mount["readOnly"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == only(objects, "Secret")["metadata"]["name"]
    port = next(p for p in container["ports"] if p["name"] == "webhook")
    assert env["STRATA_WEBHOOK_PORT"] == str(port["containerPort"])
    service = only(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_cert_manager_issues_the_certificate_and_injects_the_ca(helm):
    objects = rendered(helm, {"webhook": {"certManager": {"enabled": True}}})
    assert not [o for o in objects if o["kind"] == "Secret"]
    certificate = only(objects, "Certificate")
    assert certificate["spec"]["secretName"] == "strata-webhook-tls"
    assert certificate["spec"]["issuerRef"] == {"name": "strata-webhook-selfsigned", "kind": "Issuer"}
    configuration = only(objects, "MutatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "strata-system/strata-webhook"
    }
    assert all("caBundle" not in w["clientConfig"] for w in configuration["webhooks"])
    issued = rendered(
        helm, {"webhook": {"certManager": {"enabled": True, "issuerRef": {"name": "corp", "kind": "ClusterIssuer"}}}}
    )
    assert not [o for o in issued if o["kind"] == "Issuer"]
    assert only(issued, "Certificate")["spec"]["issuerRef"] == {"name": "corp", "kind": "ClusterIssuer"}


def test_operator_managed_tls_renders_an_empty_secret_no_ca_bundle_and_env_the_operator_accepts(helm):
    objects = rendered(helm, {"webhook": {"tls": {"managedBy": "operator", "validityDays": 365}}})
    secret = only(objects, "Secret")
    assert secret["type"] == "Opaque" and "data" not in secret, "the operator fills it; Helm never renders a key"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert all("caBundle" not in w["clientConfig"] for w in only(objects, kind)["webhooks"]), kind
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    kept = Settings.from_env(env).webhook_tls
    assert kept is not None and kept.validity_days == 365
    assert kept.secret == ("strata-system", secret["metadata"]["name"])
    assert kept.service == ("strata-system", only(objects, "Service")["metadata"]["name"])
    assert set(kept.configurations) == {
        (kind, only(objects, kind)["metadata"]["name"])
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    }
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert volume["emptyDir"]["medium"] == "Memory", "the operator writes the files; they never touch a disk"
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("webhook-tls"))
    (rule,) = role["rules"]
    assert rule == {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret["metadata"]["name"]],
                    "verbs": ["get", "patch"]}  # fmt: skip
    helm_made = rendered(helm)
    assert "STRATA_WEBHOOK_TLS_SECRET" not in str(only(helm_made, "Deployment")), "Helm-made TLS is the default"


def test_watched_namespaces_limit_the_webhook_too(helm):
    objects = rendered(helm, {"watchNamespaces": ["serving"]})
    for hook in only(objects, "MutatingWebhookConfiguration")["webhooks"]:
        assert hook["namespaceSelector"]["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["serving"]}
        ]


def test_disabled_webhook_renders_none_of_it(helm):
    objects = rendered(helm, {"webhook": {"enabled": False}})
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Service", "Secret"}
    (container,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "STRATA_WEBHOOK_CERT_DIR" not in {e["name"] for e in container["env"]}


# -- RBAC, decided by the API server ----------------------------------------------------------------------------


@contextlib.contextmanager
def applied(k8s: DynamicClient, helm: Any, values: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """The chart's RBAC applied in a fresh namespace; yields (namespace, service account, another namespace)."""
    namespaces = resource(k8s, "v1", "Namespace")
    ns, other = (f"chart-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for name in (ns, other):
        namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    values = {**values, "watchNamespaces": [ns] if values.get("watchNamespaces") else []}
    release = f"r{uuid.uuid4().hex[:6]}"
    objects = [
        o
        for o in helm.template(values, release=release, namespace=ns)
        if o and o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    for obj in objects:
        resource(k8s, obj["apiVersion"], obj["kind"]).create(body=obj, namespace=obj["metadata"].get("namespace"))
    account = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
    try:
        # The authorizer learns new bindings from a watch: wait for them before asking.
        wait_for(lambda: allowed(k8s, ns, account, "patch", "pods", ns), timeout=15, what="the bindings in effect")
        yield ns, account, other
    finally:
        for obj in objects:
            if not obj["metadata"].get("namespace"):
                with contextlib.suppress(NotFoundError):
                    resource(k8s, obj["apiVersion"], obj["kind"]).delete(name=obj["metadata"]["name"])
        for name in (ns, other):
            namespaces.delete(name=name)


def allowed(k8s: DynamicClient, namespace: str, account: str, verb: str, what: str, where: str) -> bool:
    return service_account_may(k8s, namespace, account, verb, what, where=where)


def allowed_named(k8s: DynamicClient, ns: str, account: str, verb: str, group: str, what: str, name: str,
                  where: str | None = None) -> bool:  # fmt: skip
    return service_account_may(k8s, ns, account, verb, what, group=group, name=name, where=where)


@pytest.mark.integration
def test_operator_managed_tls_may_touch_its_secret_and_configurations_only(k8s, helm):
    with applied(k8s, helm, {"webhook": {"tls": {"managedBy": "operator"}}}) as (ns, account, other):
        release = account.removesuffix("-strata")
        secret, admission = f"{release}-strata-webhook-tls", "admissionregistration.k8s.io"
        for verb in ("get", "patch"):
            assert allowed_named(k8s, ns, account, verb, "", "secrets", secret, ns), verb
            for what, name in (
                ("mutatingwebhookconfigurations", f"{release}-strata-pod-wiring"),
                ("validatingwebhookconfigurations", f"{release}-strata-cache-deletion"),
            ):
                assert allowed_named(k8s, ns, account, verb, admission, what, name), (verb, what)
                assert not allowed_named(k8s, ns, account, verb, admission, what, "someone-elses"), (verb, what)
        # (get and create on Secrets come with the KV tiers' token Secrets; patch is this Secret's alone.)
        assert not allowed_named(k8s, ns, account, "patch", "", "secrets", "another-secret", ns)
        assert not allowed_named(k8s, ns, account, "patch", "", "secrets", secret, other)
        for verb in ("delete", "update", "list"):
            assert not allowed_named(k8s, ns, account, verb, "", "secrets", secret, ns), verb
    with applied(k8s, helm, {}) as (ns, account, _):
        release = account.removesuffix("-strata")
        assert not allowed_named(k8s, ns, account, "patch", "", "secrets", f"{release}-strata-webhook-tls", ns)
        assert not allowed_named(
            k8s, ns, account, "patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations",
            f"{release}-strata-pod-wiring",
        ), "Helm-made TLS needs no rights on the configurations"  # fmt: skip


# What lifting gates and explaining them uses (delete: a gated pod wired before its cache's revision was known is
# replaced, webhook/wiring.rewire_revision), and what it must never be able to do.
GATES_NEED = [("patch", "pods"), ("delete", "pods"), ("list", "pods"), ("watch", "pods"), ("create", "events")]
GATES_NEVER = [("get", "pods"), ("create", "pods"), ("update", "pods"), ("deletecollection", "pods")]


@pytest.mark.integration
def test_cluster_wide_install_may_lift_gates_anywhere_and_nothing_more(k8s, helm):
    with applied(k8s, helm, {}) as (ns, account, other):
        for verb, what in GATES_NEED:
            assert allowed(k8s, ns, account, verb, what, other), f"{verb} {what}"
        for verb, what in GATES_NEVER:
            assert not allowed(k8s, ns, account, verb, what, other), f"{verb} {what} should be denied"


@pytest.mark.integration
def test_namespaced_install_lifts_gates_only_where_it_watches(k8s, helm):
    with applied(k8s, helm, {"watchNamespaces": ["placeholder"]}) as (ns, account, other):
        assert allowed(k8s, ns, account, "patch", "pods", ns)
        assert not allowed(k8s, ns, account, "patch", "pods", other)


# -- Helm itself: the CA survives upgrades (until close to expiry), uninstall removes the webhook ----------------

NOT_AFTER_ANNOTATION = "strata.dev/certificate-not-after"


def installable_chart(control_plane: Any, chart: Path, tmp: Path) -> str:
    """As test_helm_lifecycle.py's chart_for: drop kubeVersion when the API server reports no version stamp."""
    status, body = control_plane.api_get("/version")
    assert status == 200, body
    if re.match(r"v1\.\d+\.\d+", json.loads(body)["gitVersion"]):
        return str(chart)
    copy = tmp / "strata"
    shutil.copytree(chart, copy)
    chart_yaml = copy / "Chart.yaml"
    chart_yaml.write_text(re.sub(r"^kubeVersion:.*\n", "", chart_yaml.read_text(), flags=re.M))
    return str(copy)


@pytest.mark.integration
def test_upgrade_keeps_the_ca_until_near_expiry_and_uninstall_removes_the_webhook(
    k8s, control_plane, helm, chart_helpers, tmp_path
):
    namespace, release = f"helm-{uuid.uuid4().hex[:8]}", f"w{uuid.uuid4().hex[:6]}"
    resource(k8s, "v1", "Namespace").create(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    chart = installable_chart(control_plane, chart_helpers.chart, tmp_path)
    base = ["--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig), "--set", "crds.install=false"]
    configurations = resource(k8s, "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")
    secrets = resource(k8s, "v1", "Secret")
    name = f"{release}-strata"

    def ca_bundles() -> tuple[str, set[str]]:
        secret = secrets.get(name=f"{name}-webhook-tls", namespace=namespace).to_dict()
        hooks = configurations.get(name=f"{name}-pod-wiring").to_dict()["webhooks"]
        return secret["data"]["ca.crt"], {h["clientConfig"]["caBundle"] for h in hooks}

    try:
        helm.run("install", release, chart, *base)
        ca, bundles = ca_bundles()
        assert bundles == {ca}
        helm.run("upgrade", release, chart, *base, "--set", "webhook.timeoutSeconds=3")
        assert ca_bundles() == (ca, {ca}), "an upgrade must not replace the CA the API server trusts"

        # Ten days before expiry (inside renewBeforeDays, 90), the next upgrade rotates: a new CA and certificate,
        # and the API server trusts both CAs until the operator has reloaded; the upgrade after keeps them.
        soon = int(time.time()) + 10 * 86400
        secrets.patch(
            name=f"{name}-webhook-tls",
            namespace=namespace,
            body={"metadata": {"annotations": {NOT_AFTER_ANNOTATION: str(soon)}}},
            content_type="application/merge-patch+json",
        )
        helm.run("upgrade", release, chart, *base)
        rotated, bundles = ca_bundles()
        assert bundles == {rotated} and rotated != ca, "an upgrade close to expiry rotates the CA"
        new_ca, old_ca = x509.load_pem_x509_certificates(base64.b64decode(rotated))
        assert old_ca == x509.load_pem_x509_certificate(base64.b64decode(ca)), "the previous CA stays trusted"
        secret = secrets.get(name=f"{name}-webhook-tls", namespace=namespace).to_dict()
        served = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        served.verify_directly_issued_by(new_ca)
        assert int(secret["metadata"]["annotations"][NOT_AFTER_ANNOTATION]) > soon + 3000 * 86400
        assert served.not_valid_after_utc.timestamp() > soon + 3000 * 86400
        helm.run("upgrade", release, chart, *base)
        assert ca_bundles() == (rotated, {rotated}), "a fresh pair is kept by the next upgrade"
        helm.run("uninstall", release, *base[:4])
        for api_version, kind, ns, obj in (
            ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", None, f"{name}-pod-wiring"),
            ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", None, f"{name}-cache-deletion"),
            ("v1", "Service", namespace, f"{name}-webhook"),
            ("v1", "Secret", namespace, f"{name}-webhook-tls"),
            ("rbac.authorization.k8s.io/v1", "ClusterRole", None, f"{name}-pod-gates"),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, f"{name}-pod-gates"),
        ):
            with pytest.raises(NotFoundError):
                resource(k8s, api_version, kind).get(name=obj, namespace=ns)
    finally:
        helm.run("uninstall", release, *base[:4], check=False)
        resource(k8s, "v1", "Namespace").delete(name=namespace)


def env_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    (container,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_by_default_the_webhook_is_bounded_and_open_to_any_caller_with_a_warning(helm, control_plane):
    objects = rendered(helm)
    env = env_of(objects)
    assert env["STRATA_WEBHOOK_MAX_BODY_BYTES"] == "3145728"
    assert (env["STRATA_WEBHOOK_MAX_CONCURRENT"], env["STRATA_WEBHOOK_MAX_QUEUED"]) == ("8", "24")
    assert "STRATA_WEBHOOK_CLIENT_CA" not in env
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    # Helm reads the cluster even for a client-side dry run (nothing is created); the session's cluster may hold
    # the CRDs under another release already, so this render leaves them out.
    kubeconfig = ("--kubeconfig", str(control_plane.kubeconfig), "--set", "crds.install=false")
    notes = helm.run("install", "notes", str(CHART), "--dry-run=client", "--namespace", "strata-notes", *kubeconfig)
    assert "WARNING: the pod admission webhook answers any caller" in notes.stdout


def test_client_auth_serves_only_the_api_servers_certificate(helm):
    values = {"webhook": {"clientAuth": {"caConfigMap": "apiserver-webhook-client-ca", "allowedNames": ["a", "b"]}}}
    objects = rendered(helm, values)
    env = env_of(objects)
    assert env["STRATA_WEBHOOK_CLIENT_CA"] == "/etc/strata/webhook-client/ca.crt"
    assert env["STRATA_WEBHOOK_CLIENT_NAMES"] == "a,b"
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-client-ca")
    assert volume["configMap"] == {
        "name": "apiserver-webhook-client-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    settings = Settings.from_env(env).webhook_access
    assert settings.client_ca == "/etc/strata/webhook-client/ca.crt" and settings.client_names == ("a", "b")
    refused = helm.template_raw({"webhook": {"clientAuth": {"caConfigMap": "apiserver-webhook-client-ca"}}})
    assert refused.returncode != 0 and "webhook.clientAuth.allowedNames" in refused.stderr


def test_the_network_policy_admits_the_api_servers_addresses_to_the_webhook_port_alone(helm):
    values = {"webhook": {"networkPolicy": {"enabled": True, "apiServerCIDRs": ["10.0.0.0/28", "fd00::/64"]}}}
    policy = only(rendered(helm, values), "NetworkPolicy")
    assert (
        policy["spec"]["podSelector"]["matchLabels"]
        == (only(rendered(helm, values), "Deployment")["spec"]["selector"]["matchLabels"])
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    webhook_rule, health_rule = policy["spec"]["ingress"]
    assert webhook_rule == {
        "ports": [{"port": "webhook", "protocol": "TCP"}],
        "from": [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
    }
    # The kubelet's probes and Prometheus (the operator's /metrics) come from anywhere; without metrics, only probes.
    assert health_rule == {"ports": [{"port": "health", "protocol": "TCP"}, {"port": "metrics", "protocol": "TCP"}]}
    no_metrics = only(rendered(helm, {**values, "metrics": {"enabled": False}}), "NetworkPolicy")
    assert no_metrics["spec"]["ingress"][1] == {"ports": [{"port": "health", "protocol": "TCP"}]}
    refused = helm.template_raw({"webhook": {"networkPolicy": {"enabled": True}}})
    assert refused.returncode != 0 and "webhook.networkPolicy.apiServerCIDRs" in refused.stderr
