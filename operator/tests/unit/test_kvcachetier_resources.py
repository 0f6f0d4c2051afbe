"""KVCacheTier builders: each child object asserted on as returned, without a cluster."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field
from strata_kv.config import CONFIG_FILE_NAME, KVServerConfig
from strata_kv.csi.identity import check_server
from strata_kv.csi.volume import NodeDirectory
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.children import build_children
from strata_operator.resources.kvcachetier.config import build_config_map, hash_seed
from strata_operator.resources.kvcachetier.connection import build_connection_config_map
from strata_operator.resources.kvcachetier.daemonset import build_resources, memory_request_bytes
from strata_operator.resources.kvcachetier.names import CONFIG_HASH_ANNOTATION, TierRef
from strata_operator.resources.kvcachetier.status import endpoints
from strata_operator.resources.runtime_image import RuntimeImage

TIER = TierRef("kv", "serving", "0000-uid", 3)
KVSERVER_PACKAGE = Path(__file__).resolve().parents[3] / "kvserver" / "strata_kv"
RUNTIME = RuntimeImage("registry.local/strata-runtime:test")
GiB = 1024**3


def spec_of(**fields: Any) -> KVCacheTierSpec:
    return KVCacheTierSpec.model_validate(fields)


def pod_spec(spec: KVCacheTierSpec) -> dict[str, Any]:
    return dict(build_children(spec, TIER, RUNTIME).daemonset["spec"]["template"]["spec"])


def test_every_child_is_owned_and_labelled() -> None:
    children = build_children(spec_of(l2={"fs": {"pvc": {"create": {"size": "1Ti"}}}}), TIER, RUNTIME)
    for child in children.in_apply_order():
        meta = child["metadata"]
        assert meta["namespace"] == "serving"
        assert meta["ownerReferences"][0]["uid"] == "0000-uid"
        assert meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "strata"
        assert meta["labels"]["app.kubernetes.io/instance"] == "kv"
    kinds = [c["kind"] for c in children.in_apply_order()]
    assert kinds == ["PersistentVolumeClaim", "ConfigMap", "ConfigMap", "Service", "DaemonSet"]


def test_pod_runs_under_restricted_pod_security() -> None:
    pod = pod_spec(spec_of())
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostIPC") and not pod.get("hostNetwork") and not pod.get("hostPID")
    container = pod["containers"][0]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["privileged"] is False
    assert container["readOnlyRootFilesystem"] is True
    assert container["capabilities"] == {"drop": ["ALL"]}


def test_probes_hit_the_health_endpoints() -> None:
    container = pod_spec(spec_of())["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"resp": 6379, "metrics": 9121}


def test_server_listens_on_the_pod_ip_only() -> None:
    """Every pod on the node can reach the pod network: the server binds its own address, not 0.0.0.0."""
    container = pod_spec(spec_of())["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    args = container["args"]
    assert args[args.index("--bind") + 1] == "$(POD_IP)" and args[args.index("--metrics-bind") + 1] == "$(POD_IP)"
    config = yaml.safe_load(build_children(spec_of(), TIER, RUNTIME).config_map["data"][CONFIG_FILE_NAME])
    assert "0.0.0.0" not in (config["listen"].get("bind"), config["metrics"].get("bind"))


def test_memory_request_is_l1_plus_headroom() -> None:
    spec = spec_of(l1={"size": "8Gi"}, memoryHeadroom="1Gi")
    resources = build_resources(spec)
    assert resources["requests"]["memory"] == "9Gi"
    assert resources["limits"]["memory"] == "11520Mi"
    assert memory_request_bytes(spec) == 9 * GiB


def test_shared_memory_budgets_reach_the_server_and_its_memory_request() -> None:
    """What clients may hold of handed-over memory is charged to the server's cgroup: the budget is part of the
    derived request; both budgets go to the server's config, and a client share above the total is refused."""
    socket = {"enabled": True, "sharedMemory": True, "sharedMemoryBudget": "512Mi", "sharedMemoryClientBudget": "32Mi"}
    spec = spec_of(l1={"size": "8Gi"}, memoryHeadroom="1Gi", nodeSocket=socket)
    assert memory_request_bytes(spec) == 9 * GiB + 512 * 2**20
    config = KVServerConfig.model_validate(yaml.safe_load(build_config_map(spec, TIER)["data"][CONFIG_FILE_NAME]))
    assert (config.listen.shared_memory_budget, config.listen.shared_memory_client_budget) == (512 * 2**20, 32 * 2**20)
    defaults = spec_of(nodeSocket={"enabled": True, "sharedMemory": True})
    assert memory_request_bytes(defaults) == memory_request_bytes(spec_of()) + 256 * 2**20
    with pytest.raises(ValueError, match="sharedMemoryClientBudget must not exceed"):
        spec_of(nodeSocket={**socket, "sharedMemoryClientBudget": "1Gi"})


def test_resources_override_wins_and_derived_memory_fills_the_gap() -> None:
    spec = spec_of(resources={"requests": {"cpu": "2"}, "limits": {"memory": "20Gi"}})
    resources = build_resources(spec)
    assert resources["requests"] == {"cpu": "2", "memory": "20Gi"}
    assert resources["limits"] == {"memory": "20Gi"}
    assert spec.resources == {"requests": {"cpu": "2"}, "limits": {"memory": "20Gi"}}  # not mutated


def test_sender_threads_reach_the_server_and_its_cpu_request() -> None:
    """Each sender thread is a core's worth of copying: the pod asks for one per thread beside the loop's."""
    assert build_resources(spec_of())["requests"]["cpu"] == "250m"
    spec = spec_of(senderThreads=3)
    assert build_resources(spec)["requests"]["cpu"] == "4"
    assert build_resources(spec_of(senderThreads=3, resources={"requests": {"cpu": "2"}}))["requests"]["cpu"] == "2"
    for node_socket in ({}, {"enabled": True}):
        spec = spec_of(senderThreads=3, nodeSocket=node_socket)
        config = KVServerConfig.from_yaml(build_config_map(spec, TIER)["data"][CONFIG_FILE_NAME])
        assert config.listen.sender_threads == 3
    default = KVServerConfig.from_yaml(build_config_map(spec_of(), TIER)["data"][CONFIG_FILE_NAME])
    assert default.listen.sender_threads == 0


def test_node_selection_and_priority_reach_the_pod() -> None:
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    affinity: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    }
    pod = pod_spec(
        spec_of(nodeSelector={"gpu": "h100"}, tolerations=tolerations, affinity=affinity, priorityClassName="hi")
    )
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["tolerations"] == tolerations
    assert pod["affinity"] == affinity
    assert pod["priorityClassName"] == "hi"


def test_config_change_changes_the_pod_template_hash() -> None:
    before = build_children(spec_of(l1={"size": "4Gi"}), TIER, RUNTIME).daemonset
    after = build_children(spec_of(l1={"size": "6Gi"}), TIER, RUNTIME).daemonset
    same = build_children(spec_of(l1={"size": "4Gi"}), TIER, RUNTIME).daemonset
    annotation = lambda ds: ds["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]  # noqa: E731
    assert annotation(before) != annotation(after)
    assert annotation(before) == annotation(same)


def test_config_map_parses_back_with_the_servers_own_model() -> None:
    spec = spec_of(
        l1={"size": "2Gi", "evictionPolicy": "lru"},
        l2={
            "fs": {"pvc": {"claimName": "shared"}, "capacity": "500Gi", "highWatermarkPercent": 95},
            "s3": {"bucket": "kv-cache", "endpoint": "http://minio:9000", "secretRef": {"name": "s3"}},
        },
        chunkTokens=512,
        hash={"algorithm": "xxhash", "seed": "42"},
        tenancy={"requireSalt": True},
        connector={"type": "lmcache"},  # the server's salt check reads LMCache's keys
        auth={"secretRef": {"name": "kv-token"}},
        port=7000,
    )
    text = build_config_map(spec, TIER)["data"][CONFIG_FILE_NAME]
    config = KVServerConfig.from_yaml(text)
    assert config.l1.size == 2 * GiB and config.l1.eviction_policy == "lru"
    assert config.l2.fs is not None and config.l2.fs.capacity == 500 * GiB
    assert config.l2.fs.high_watermark == 0.95 and config.l2.fs.low_watermark == 0.80
    assert config.l2.fs.root_dir == "/var/lib/strata-kv/l2"
    assert config.l2.s3 is not None and config.l2.s3.endpoint_url == "http://minio:9000"
    assert config.l2.s3.addressing_style == "path"
    assert config.chunk_tokens == 512
    assert (config.namespace.hash_algorithm, config.namespace.hash_seed) == ("xxhash", "42")
    assert config.tenancy.require_salt is True
    assert config.auth.token_file == "/var/run/secrets/strata-kv/token"
    assert config.listen.port == 7000 and config.metrics.port == 9121
    assert "AWS_SECRET_ACCESS_KEY" not in text


def test_hash_seed_defaults_to_a_stable_value_per_resource() -> None:
    seed = hash_seed(spec_of(), TIER)
    assert seed == hash_seed(spec_of(), TierRef("kv", "serving", "other-uid"))
    assert seed != hash_seed(spec_of(), TierRef("kv2", "serving", "0000-uid"))
    assert 0 <= int(seed) <= 4294967295
    assert hash_seed(spec_of(hash={"seed": "7"}), TIER) == "7"


@pytest.mark.parametrize(
    ("l2", "volume"),
    [
        ({"fs": {"pvc": {"claimName": "nfs"}}}, {"persistentVolumeClaim": {"claimName": "nfs"}}),
        ({"fs": {"pvc": {"create": {"size": "1Ti"}}}}, {"persistentVolumeClaim": {"claimName": "kv-l2"}}),
        (
            {"fs": {"hostPath": {"path": "/mnt/nvme"}}},
            {"hostPath": {"path": "/mnt/nvme", "type": "Directory"}},
        ),
    ],
)
def test_l2_filesystem_is_mounted(l2: dict[str, Any], volume: dict[str, Any]) -> None:
    pod = pod_spec(spec_of(l2=l2))
    l2_volume = next(v for v in pod["volumes"] if v["name"] == "l2")
    assert {k: v for k, v in l2_volume.items() if k != "name"} == volume
    assert {"name": "l2", "mountPath": "/var/lib/strata-kv/l2"} in pod["containers"][0]["volumeMounts"]


def test_created_claim_is_read_write_many() -> None:
    spec = spec_of(l2={"fs": {"pvc": {"create": {"size": "1Ti", "storageClassName": "nfs"}}}})
    children = build_children(spec, TIER, RUNTIME)
    assert children.pvc is not None
    assert children.pvc["metadata"]["name"] == "kv-l2"
    assert children.pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert children.pvc["spec"]["storageClassName"] == "nfs"
    assert build_children(spec_of(l2={"fs": {"pvc": {"claimName": "x"}}}), TIER, RUNTIME).pvc is None


def test_s3_credentials_come_from_the_secret_as_environment() -> None:
    spec = spec_of(l2={"s3": {"bucket": "kv-cache", "secretRef": {"name": "s3-creds"}}})
    container = pod_spec(spec)["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]


def test_auth_token_is_mounted_from_its_secret_key() -> None:
    pod = pod_spec(spec_of(auth={"secretRef": {"name": "kv-token", "key": "password"}}))
    auth = next(v for v in pod["volumes"] if v["name"] == "auth")
    assert auth["secret"]["secretName"] == "kv-token"
    assert auth["secret"]["items"] == [{"key": "password", "path": "token"}]


def test_service_keeps_traffic_on_the_node() -> None:
    service = build_children(spec_of(), TIER, RUNTIME).service
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    daemonset = build_children(spec_of(), TIER, RUNTIME).daemonset
    assert service["spec"]["selector"] == daemonset["spec"]["selector"]["matchLabels"]


def test_update_strategy() -> None:
    assert build_children(spec_of(), TIER, RUNTIME).daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    on_delete = spec_of(updateStrategy={"type": "OnDelete"})
    assert build_children(on_delete, TIER, RUNTIME).daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    percent = spec_of(updateStrategy={"maxUnavailable": "25%"})
    assert build_children(percent, TIER, RUNTIME).daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxUnavailable": "25%"
    }


def test_builders_emit_no_shared_objects() -> None:
    """Shared dicts would come out of yaml.safe_dump as anchors (&id001), which kubectl users trip over."""
    for child in build_children(spec_of(), TIER, RUNTIME).in_apply_order():
        assert "&id" not in yaml.safe_dump(child)


class VllmKVTransferConfig(BaseModel):
    """The fields of vLLM 0.33's `KVTransferConfig` (vllm/config/kv_transfer.py), nothing else accepted. The
    vLLM tests (kvserver/tests/vllm) hand the same JSON to vLLM's own EngineArgs."""

    model_config = ConfigDict(extra="forbid")
    kv_connector: str | None = None
    engine_id: str | None = None
    kv_buffer_device: str = "cuda"
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] | None = None
    kv_port: int = 14579
    kv_connector_extra_config: dict[str, Any] = Field(default_factory=dict)
    kv_connector_module_path: str | None = None
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"


LMCACHE_FIELDS = {"chunk_size", "remote_url", "remote_serde"}


def test_lmcache_connection_config_map_is_what_vllm_accepts() -> None:
    spec = spec_of(
        connector={"type": "lmcache"},
        chunkTokens=512,
        hash={"algorithm": "xxhash", "seed": "123"},
        tenancy={"cacheSalt": "team-a"},
    )
    data = build_connection_config_map(spec, TIER)["data"]
    raw = json.loads(data["KV_TRANSFER_CONFIG"])
    config = VllmKVTransferConfig.model_validate(raw)
    assert set(raw) == {"kv_connector", "kv_role", "kv_connector_extra_config"}
    assert config.kv_connector == "LMCacheConnectorV1"
    assert config.kv_role == "kv_both"
    extra = config.kv_connector_extra_config
    assert {k.removeprefix("lmcache.") for k in extra} == LMCACHE_FIELDS
    assert all(k.startswith("lmcache.") for k in extra)
    assert extra["lmcache.remote_url"] == "redis://kv.serving.svc:6379"
    assert extra["lmcache.chunk_size"] == 512
    assert data["PYTHONHASHSEED"] == "123"
    assert data["PREFIX_CACHING_HASH_ALGO"] == "xxhash"
    assert "STRATA_KV_HASH_ALGORITHM" not in data
    assert data["STRATA_KV_CACHE_SALT"] == "team-a"
    assert data["LMCACHE_REMOTE_URL"] == extra["lmcache.remote_url"]
    assert "STRATA_KV_SHM_SIZE" not in data


def test_lmcache_always_gets_a_shared_hash_seed() -> None:
    """LMCache hashes chunks with Python's hash() by default: engines need one PYTHONHASHSEED whatever vLLM uses."""
    data = build_connection_config_map(spec_of(connector={"type": "lmcache"}), TIER)["data"]
    assert data["PYTHONHASHSEED"].isdigit()


def test_vllm_connection_is_the_offloading_connector_with_the_strata_tier() -> None:
    spec = spec_of(chunkTokens=512, connector={"cpuBytes": "6Gi", "offloadPromptOnly": False})
    data = build_connection_config_map(spec, TIER)["data"]
    raw = json.loads(data["KV_TRANSFER_CONFIG"])
    config = VllmKVTransferConfig.model_validate(raw)
    assert config.kv_connector == "OffloadingConnector" and config.kv_role == "kv_both"
    assert config.kv_load_failure_policy == "recompute"
    assert config.kv_connector_extra_config == {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 6 * 1024**3,
        "block_size": 512,
        "offload_prompt_only": False,
        "secondary_tiers": [
            {
                "type": "StrataTier",
                "module_path": "strata_kv.vllm_tier",
                "url": "redis://kv.serving.svc:6379",
                "token_env": "STRATA_KV_TOKEN",
            }
        ],
    }
    assert data["PREFIX_CACHING_HASH_ALGO"] == "sha256_cbor"
    assert data["STRATA_KV_SHM_SIZE"] == "7Gi"
    assert not any(key.startswith("LMCACHE_") for key in data)


def test_a_cpu_engine_gets_strata_cpu_offloading_spec_and_both_variants_are_rendered() -> None:
    """vLLM's own spec refuses the CPU platform: a tier for CPU engines names Strata's spec by module path, and the
    ConfigMap carries each engine's variant so a pod can pick its own (strata.dev/kv-engine)."""
    cpu = build_connection_config_map(spec_of(connector={"engine": "cpu"}), TIER)["data"]
    gpu = build_connection_config_map(spec_of(), TIER)["data"]
    cpu_extra = VllmKVTransferConfig.model_validate_json(cpu["KV_TRANSFER_CONFIG"]).kv_connector_extra_config
    assert cpu_extra["spec_name"] == "StrataCPUOffloadingSpec"
    assert cpu_extra["spec_module_path"] == "strata_kv.vllm_cpu_offload"
    assert "spec_module_path" not in json.loads(gpu["KV_TRANSFER_CONFIG"])["kv_connector_extra_config"]
    for data in (cpu, gpu):
        assert data["KV_TRANSFER_CONFIG_CPU"] == cpu["KV_TRANSFER_CONFIG"]
        assert data["KV_TRANSFER_CONFIG_GPU"] == gpu["KV_TRANSFER_CONFIG"]
    lmcache = build_connection_config_map(spec_of(connector={"type": "lmcache"}), TIER)["data"]
    assert "KV_TRANSFER_CONFIG_CPU" not in lmcache


def class_defined_behind(module: str, name: str) -> ast.ClassDef:
    """The class `name` that importing strata_kv's `module` gives, following the relative re-exports of entry
    modules (`strata_kv.vllm_tier` names `StrataTier` from `strata_kv.vllm.tier`), read from source: the operator's
    environment has no vLLM to import it with."""
    parts = module.split(".")
    assert parts[0] == "strata_kv", module
    tree = ast.parse(KVSERVER_PACKAGE.joinpath(*parts[1:]).with_suffix(".py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.ImportFrom) and node.level and any(a.name == name for a in node.names):
            base = parts[: len(parts) - node.level] + (node.module.split(".") if node.module else [])
            return class_defined_behind(".".join(base), name)
    raise AssertionError(f"{module} gives no class {name}")


def test_the_cpu_spec_class_vllm_is_told_to_load_exists() -> None:
    data = build_connection_config_map(spec_of(connector={"engine": "cpu"}), TIER)["data"]
    extra = json.loads(data["KV_TRANSFER_CONFIG"])["kv_connector_extra_config"]
    spec = class_defined_behind(extra["spec_module_path"], extra["spec_name"])
    assert [ast.unparse(b) for b in spec.bases] == ["TieringOffloadingSpec"]


def test_vllm_gets_pythonhashseed_only_where_the_hash_needs_one() -> None:
    """sha256 variants seed from vLLM's fixed default unless PYTHONHASHSEED is set: leaving it unset lets
    engines Strata did not wire share chunks too. xxhash variants seed at random per process without it."""
    assert "PYTHONHASHSEED" not in build_connection_config_map(spec_of(), TIER)["data"]
    xxhash = build_connection_config_map(spec_of(hash={"algorithm": "xxhash_cbor"}), TIER)["data"]
    assert xxhash["PYTHONHASHSEED"].isdigit()
    chosen = build_connection_config_map(spec_of(hash={"seed": "77"}), TIER)["data"]
    assert chosen["PYTHONHASHSEED"] == "77"


def test_vllm_tier_without_auth_names_no_token() -> None:
    data = build_connection_config_map(spec_of(auth={"disabled": True}), TIER)["data"]
    (tier,) = json.loads(data["KV_TRANSFER_CONFIG"])["kv_connector_extra_config"]["secondary_tiers"]
    assert "token_env" not in tier


def test_the_tier_class_vllm_is_told_to_load_exists() -> None:
    """vLLM imports `module_path` and takes `type` from it; the operator cannot import it (it needs vLLM), so
    the name is checked in the source here and the vLLM tests load it for real."""
    data = build_connection_config_map(spec_of(), TIER)["data"]
    (tier,) = json.loads(data["KV_TRANSFER_CONFIG"])["kv_connector_extra_config"]["secondary_tiers"]
    assert [ast.unparse(b) for b in class_defined_behind(tier["module_path"], tier["type"]).bases] == [
        "SecondaryTierManager"
    ]


def test_connection_keys_are_environment_variable_names() -> None:
    """The ConfigMap is consumed with envFrom: every key must be a valid variable name."""
    data = build_connection_config_map(spec_of(auth={"secretRef": {"name": "t"}}), TIER)["data"]
    assert all(key.replace("_", "a").isalnum() and not key[0].isdigit() for key in data)
    assert all(isinstance(v, str) for v in data.values())


def test_rendered_servers_never_close_idle_lmcache_connections() -> None:
    """LMCache's RESP workers connect once and never reconnect: a 300 s idle close broke them for good."""
    config = yaml.safe_load(build_children(spec_of(), TIER, RUNTIME).config_map["data"][CONFIG_FILE_NAME])
    assert KVServerConfig.model_validate(config).limits.idle_timeout_seconds == 0


def test_kv_events_are_off_by_default_and_render_nothing() -> None:
    spec = spec_of()
    children = build_children(spec, TIER, RUNTIME)
    config = KVServerConfig.from_yaml(build_config_map(spec, TIER)["data"][CONFIG_FILE_NAME])
    assert config.events.publish is None
    (container,) = children.daemonset["spec"]["template"]["spec"]["containers"]
    assert [p["name"] for p in container["ports"]] == ["resp", "metrics"]
    assert [p["name"] for p in children.service["spec"]["ports"]] == ["resp", "metrics"]
    assert "STRATA_KV_EVENTS_URL" not in build_connection_config_map(spec, TIER)["data"]


def test_kv_events_render_the_publisher_its_ports_and_the_endpoint() -> None:
    spec = spec_of(events={"enabled": True, "port": 6000})
    children = build_children(spec, TIER, RUNTIME)
    config = KVServerConfig.from_yaml(build_config_map(spec, TIER)["data"][CONFIG_FILE_NAME])
    assert config.events.publish == "tcp://*:6000"
    assert (config.events.medium.l1, config.events.medium.l2, config.events.topic) == ("CPU", "STORAGE", "")
    one = KVServerConfig.from_yaml(
        build_config_map(spec_of(events={"enabled": True, "singleMedium": "STORAGE"}), TIER)["data"][CONFIG_FILE_NAME]
    )
    assert (one.events.medium.l1, one.events.medium.l2) == ("STORAGE", "STORAGE")
    (container,) = children.daemonset["spec"]["template"]["spec"]["containers"]
    assert {"name": "kv-events", "containerPort": 6000, "protocol": "TCP"} in container["ports"]
    assert {"name": "kv-events", "port": 6000, "targetPort": "kv-events", "protocol": "TCP"} in children.service[
        "spec"
    ]["ports"]
    connection = build_connection_config_map(spec, TIER)["data"]
    assert connection["STRATA_KV_EVENTS_URL"] == "tcp://kv.serving.svc:6000"
    assert build_config_map(spec, TIER)["data"] != build_config_map(spec_of(), TIER)["data"]  # rolls the pods


def test_status_names_each_servers_event_endpoint() -> None:
    pods = [
        {"metadata": {"name": "kv-a"}, "spec": {"nodeName": "n1"}, "status": {"podIP": "10.0.0.7"}},
        {"metadata": {"name": "kv-b"}, "spec": {"nodeName": "n2"}, "status": {}},  # no IP yet
    ]
    with_events = endpoints(pods, 6379, 5557)
    assert [e.get("events") for e in with_events] == ["tcp://10.0.0.7:5557", None]
    assert all("events" not in e for e in endpoints(pods, 6379))


@pytest.mark.parametrize("port", [6379, 9121])
def test_an_events_port_clashing_with_another_port_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match=r"events\.port must differ"):
        spec_of(events={"enabled": True, "port": port})
    spec_of(events={"enabled": False, "port": port})  # off: the port is never opened


def test_the_node_socket_is_off_by_default() -> None:
    spec = spec_of()
    pod = pod_spec(spec)
    assert all("csi" not in volume for volume in pod["volumes"])
    config = KVServerConfig.model_validate(yaml.safe_load(build_config_map(spec, TIER)["data"][CONFIG_FILE_NAME]))
    assert config.listen.unix_socket is None and config.listen.shared_memory is False
    assert "STRATA_KV_SOCKET" not in build_connection_config_map(spec, TIER)["data"]


def test_the_node_socket_reaches_the_server_its_config_and_the_clients_connection() -> None:
    """The server mounts the driver's directory read-write and listens there, mode 0660; the vLLM tier and
    RESP clients are told the path (the tier uses it when mounted, else the Service)."""
    spec = spec_of(nodeSocket={"enabled": True, "sharedMemory": True})
    pod = pod_spec(spec)
    (volume,) = [v for v in pod["volumes"] if v["name"] == "strata-kv-socket"]
    assert volume["csi"] == {"driver": "kv.strata.dev", "volumeAttributes": {"tier": "kv"}}
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "strata-kv-socket", "mountPath": "/run/strata-kv"} in mounts
    config = KVServerConfig.model_validate(yaml.safe_load(build_config_map(spec, TIER)["data"][CONFIG_FILE_NAME]))
    assert (config.listen.unix_socket, config.listen.unix_socket_mode) == ("/run/strata-kv/kv.sock", 0o660)
    assert config.listen.shared_memory is True
    data = build_connection_config_map(spec, TIER)["data"]
    assert data["STRATA_KV_SOCKET"] == "/run/strata-kv/kv.sock"
    (strata_tier,) = json.loads(data["KV_TRANSFER_CONFIG"])["kv_connector_extra_config"]["secondary_tiers"]
    assert strata_tier["unix_socket"] == "/run/strata-kv/kv.sock"
    assert strata_tier["url"].startswith("redis://")


@pytest.mark.parametrize("name", ["kv", "t" * 57, "t" * 63])
def test_the_driver_takes_the_daemonsets_pods_for_the_tiers_server(name: str) -> None:
    """kv.strata.dev gives the directory writable only to a pod its DaemonSet made, the DaemonSet controlled by
    the tier and named after it (strata_kv.csi.identity): the rendered DaemonSet must pass that check."""
    tier = TierRef(name, "serving", "0000-uid", 3)
    daemonset = build_children(spec_of(nodeSocket={"enabled": True}), tier, RUNTIME).daemonset
    (volume,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "strata-kv-socket"]
    assert "readOnly" not in volume["csi"], "the server's own volume is writable"
    live = {**daemonset, "metadata": {**daemonset["metadata"], "uid": "ds-uid"}}
    template = daemonset["spec"]["template"]
    pod = {
        "metadata": {
            "name": f"{name}-"[:58] + "x2b4c",
            "labels": template["metadata"]["labels"],
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": "ds-uid", "controller": True}
            ],
        },
        "spec": template["spec"],
    }
    wanted = NodeDirectory("serving", volume["csi"]["volumeAttributes"]["tier"], pod=pod["metadata"]["name"])
    check_server(pod, live, {"metadata": {"uid": "0000-uid"}}, wanted)


def test_a_node_socket_driver_of_the_users_choice_is_rendered() -> None:
    pod = pod_spec(spec_of(nodeSocket={"enabled": True, "driver": "sockets.example.com"}))
    (volume,) = [v for v in pod["volumes"] if v["name"] == "strata-kv-socket"]
    assert volume["csi"]["driver"] == "sockets.example.com"


def test_a_vllm_engine_keeps_one_core_for_its_scheduler_as_without_a_connector() -> None:
    """vLLM reserves a second core for any KV connector (its NIXL case), and on 2 cores none at all; Strata's
    connector needs none beyond the scheduler's, so the ConfigMap sets the reservation back to one."""
    data = build_connection_config_map(spec_of(connector={"engine": "cpu"}), TIER)["data"]
    assert data["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    lmcache = build_connection_config_map(spec_of(connector={"type": "lmcache"}), TIER)["data"]
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in lmcache
