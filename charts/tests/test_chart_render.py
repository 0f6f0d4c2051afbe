"""The chart rendered by the real Helm CLI: lint, defaults, edge values, and the CRDs' single source."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

EDGE_VALUES: dict[str, Any] = {
    "replicaCount": 3,
    "watchNamespaces": ["team-a", "team-b"],
    "verbose": True,
    "image": {
        "repository": "registry.example/strata/operator",
        "tag": "1.2.3",
        "digest": "sha256:" + "a" * 64,
    },
    "runtimeImage": {"repository": "registry.example/strata/runtime", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}],
    "serviceAccount": {"create": True, "name": "strata-op", "annotations": {"iam.example/role": "loader"}},
    "crds": {"install": False},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
    "podAnnotations": {"example/annotation": "x"},
    "extraEnv": [{"name": "STRATA_MODELCACHE_RESYNC_SECONDS", "value": "30"}],
}


def test_lint_passes_strictly_with_default_and_edge_values(helm, chart_helpers):
    chart = str(chart_helpers.chart)
    helm.run("lint", "--strict", chart)
    helm.run("lint", "--strict", chart, "--values", str(helm.values_file(EDGE_VALUES)))


def test_default_install_renders_operator_rbac_and_crds(helm, chart_helpers):
    objects = helm.template()
    assert chart_helpers.kinds(objects) == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Deployment",
        ]
        + ["CustomResourceDefinition"] * 3  # ModelCache, KVCacheTier, NodeCachePolicy
        # The admission webhooks (templates/webhook.yaml): TLS Secret, Service, pod wiring and deletion
        # configurations, and the pod-gate role and binding.
        + ["Secret", "Service", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
        + ["ClusterRole", "ClusterRoleBinding"]
    )
    for obj in objects:
        if obj["kind"] not in (
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            assert obj["metadata"]["namespace"] == "strata-system", obj["kind"]


def test_rendered_crds_are_exactly_the_generated_ones(helm, chart_helpers):
    """One source: the chart renders crds/ as it is (whether crds/ matches the API models is
    `make crds-check`'s job), and every kind the operator serves is there."""
    from strata_operator.api.kinds import all_crds, crd_file_name

    names = {crd["metadata"]["name"]: crd_file_name(crd) for crd in all_crds()}
    on_disk = {}
    for name, file_name in names.items():
        path = chart_helpers.repo / "crds" / file_name
        assert path.exists(), f"{path} missing: run `make crds`"
        on_disk[name] = yaml.safe_load(path.read_text())
    rendered = {o["metadata"]["name"]: o for o in helm.template() if o["kind"] == "CustomResourceDefinition"}
    assert rendered.keys() == on_disk.keys()
    for name, crd in rendered.items():
        meta = crd["metadata"]
        assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
        labels = meta.pop("labels")
        assert labels["app.kubernetes.io/instance"] == "strata"
        expected = on_disk[name]
        assert labels.items() >= expected["metadata"].get("labels", {}).items()
        assert crd == {**expected, "metadata": {k: v for k, v in expected["metadata"].items() if k != "labels"}}


def test_crds_can_be_left_out_or_deleted_on_uninstall(helm):
    assert not [o for o in helm.template({"crds": {"install": False}}) if o["kind"] == "CustomResourceDefinition"]
    for crd in (o for o in helm.template({"crds": {"keep": False}}) if o["kind"] == "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def operator_container(objects, chart_helpers) -> dict[str, Any]:
    deployment = chart_helpers.find(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def kopf_argv_for(container_args: list[str], monkeypatch) -> list[str]:
    """What `strata-operator <args>` hands to kopf: the Deployment's args through the real CLI."""
    import kopf.cli
    from strata_operator import cli

    seen: list[list[str]] = []
    monkeypatch.setattr(kopf.cli, "main", lambda args, **_: seen.append(list(args)))
    assert cli.main(container_args) == 0
    return seen[0]


def test_single_replica_runs_standalone_and_is_recreated_not_rolled(helm, chart_helpers, monkeypatch):
    objects = helm.template()
    deployment = chart_helpers.find(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    argv = kopf_argv_for(operator_container(objects, chart_helpers)["args"], monkeypatch)
    assert "--standalone" in argv and "--all-namespaces" in argv
    assert "--liveness=http://0.0.0.0:8080/healthz" in argv
    assert not [o for o in objects if o["kind"].endswith("KopfPeering")]


def test_replicas_run_with_a_cluster_peering_object(helm, chart_helpers, monkeypatch):
    objects = helm.template({"replicaCount": 2})
    assert chart_helpers.find(objects, "ClusterKopfPeering", "strata")
    assert "strategy" not in chart_helpers.find(objects, "Deployment")["spec"]
    argv = kopf_argv_for(operator_container(objects, chart_helpers)["args"], monkeypatch)
    assert "--peering=strata" in argv and "--standalone" not in argv
    cluster_role = chart_helpers.find(objects, "ClusterRole", "strata-cluster")
    assert {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings"],
        "verbs": ["list", "watch", "patch"],
    } in cluster_role["rules"]
    # The health probe reads that one object (to tell a standby from a tie that pauses every replica).
    assert {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings"],
        "resourceNames": ["strata"],
        "verbs": ["get"],
    } in cluster_role["rules"]


def test_peering_crds_ship_in_the_charts_crds_directory(helm):
    crds = [o for o in helm.template(include_crds=True) if o["kind"] == "CustomResourceDefinition"]
    names = {c["metadata"]["name"] for c in crds}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= names


def test_edge_values_watch_only_listed_namespaces(helm, chart_helpers, monkeypatch):
    objects = helm.template(EDGE_VALUES, release="edge", namespace="ops")
    assert not [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    container = operator_container(objects, chart_helpers)
    argv = kopf_argv_for(container["args"], monkeypatch)
    assert {"--namespace=team-a", "--namespace=team-b", "--peering=strata", "--verbose"} <= set(argv)
    assert "--all-namespaces" not in argv
    assert container["image"] == "registry.example/strata/operator:1.2.3@sha256:" + "a" * 64
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STRATA_RUNTIME_IMAGE"] == "registry.example/strata/runtime:1.2.3"
    assert env["STRATA_RUNTIME_IMAGE_PULL_POLICY"] == "Always"
    assert env["STRATA_IMAGE_PULL_SECRETS"] == "regcred,mirror"
    assert env["STRATA_MODELCACHE_RESYNC_SECONDS"] == "30"
    pod = chart_helpers.find(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert pod["serviceAccountName"] == "strata-op"
    # Namespaced permissions only where the operator watches; one peering object in each.
    # (The pod-gate bindings of templates/webhook.yaml follow the same namespaces: test_chart_webhook.py.)
    bindings = [o for o in objects if o["kind"] == "RoleBinding" and not o["metadata"]["name"].endswith("-pod-gates")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(b["roleRef"]["name"] == "edge-strata-namespaced" for b in bindings)
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRoleBinding"] == ["edge-strata-cluster"]
    assert sorted(o["metadata"]["namespace"] for o in objects if o["kind"] == "KopfPeering") == [
        "team-a",
        "team-b",
    ]
    cluster_rules = chart_helpers.find(objects, "ClusterRole", "edge-strata-cluster")["rules"]
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in cluster_rules
    monitor = chart_helpers.find(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_operator_pod_is_restricted_by_default(helm, chart_helpers):
    pod = chart_helpers.find(helm.template(), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["limits"]["memory"] == "512Mi"


def test_service_monitor_is_off_by_default(helm):
    assert "ServiceMonitor" not in {o["kind"] for o in helm.template()}


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicaCount": "two"}, "replicaCount"),
        ({"replicaCount": -1}, "replicaCount"),
        ({"replicas": 2}, "additional properties 'replicas'"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"image": {"repository": ""}}, "repository"),
        ({"runtimeImage": {"digest": "md5:abc"}}, "digest"),
        ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
        ({"watchNamespaces": "team-a"}, "watchNamespaces"),
        ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets"),
        ({"resources": {"limits": {"memory": "lots"}}}, "memory"),
        ({"health": {"port": 80}}, "port"),
        ({"serviceMonitor": {"interval": "often"}}, "interval"),
        ({"crds": {"install": "yes"}}, "install"),
        ({"peering": {"name": "Not A Name"}}, "peering"),
        ({"extraEnv": [{"value": "x"}]}, "extraEnv"),
    ],
)
def test_schema_rejects_wrong_values(helm, values, complaint):
    result = helm.template_raw(values)
    assert result.returncode != 0, f"{values} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr


def test_existing_service_account_needs_a_name(helm):
    result = helm.template_raw({"serviceAccount": {"create": False}})
    assert result.returncode != 0
    assert "serviceAccount.name is required" in result.stderr
    objects = helm.template({"serviceAccount": {"create": False, "name": "mine"}})
    assert "ServiceAccount" not in {o["kind"] for o in objects}


def test_packaged_chart_carries_the_crds_not_the_link(helm, chart_helpers, tmp_path):
    """`helm package` resolves files/crds, so the released .tgz renders the same CRDs without the repo."""
    helm.run("package", str(chart_helpers.chart), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("strata-*.tgz")
    result = helm.run("template", "strata", str(archive), "--namespace", "strata-system")
    packaged = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "CustomResourceDefinition"]
    from_repo = [o for o in helm.template() if o["kind"] == "CustomResourceDefinition"]
    assert packaged and packaged == from_repo
