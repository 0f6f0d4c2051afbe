"""Wiring a serving pod to the ModelCache and KVCacheTier its labels name: a pure function from the pod and those
objects to a JSON Patch, or a denial that names the field in the way.

The admission webhook (`admission.py`) calls `build_pod_patch`; nothing here talks to the API server, so every
rule is unit-tested on plain dicts. A pod already wired gets an empty patch (mutating twice changes nothing), and
nothing the user set under the names Strata uses is overwritten: a difference is a `WiringConflict`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from strata_operator.api import GROUP
from strata_operator.api.kvcachetier import ConnectorType, EngineDevice, KVCacheTierSpec
from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.resources.core import KV_TIER_LABEL, MODEL_CACHE_LABEL
from strata_operator.resources.kvcachetier.auth import token_secret
from strata_operator.resources.kvcachetier.connection import TOKEN_ENV, TRANSFER_CONFIG_ENV, client_shm_size
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.namespaces import (
    KV_MODEL_ANNOTATION,
    MODEL_CACHE_ANNOTATION,
    REVISION_ANNOTATION,
    REVISION_ENV,
    engine_model_path,
    layout_digest,
    wiring_revision,
)
from strata_operator.resources.kvcachetier.node_socket import SOCKET_GROUP, node_socket_mount, node_socket_volume
from strata_operator.resources.modelcache.names import NODE_LABEL_READY, node_label_key
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import MODES
from strata_operator.resources.modelcache.status import PHASE_NODE_NOT_READY
from strata_operator.resources.runtime_image import RuntimeImage, default_runtime
from strata_operator.webhook.compile_cache import wire_compile_cache
from strata_operator.webhook.pod_edits import WiringConflict, add_mount, add_named, spec_patch
from strata_operator.webhook.vllm_command import (
    LOAD_FORMAT_FLAG,
    LOAD_FORMAT_VALUE,
    MODEL_FLAG,
    flag_value,
    requests_gpu,
    serve_positional,
    vllm_form,
)
from strata_operator.webhook.vllm_packages import inject_packages

MOUNT_PATH_ANNOTATION = f"{GROUP}/model-mount-path"
CONTAINERS_ANNOTATION = f"{GROUP}/containers"
"""Comma-separated container names to wire; all of `spec.containers` when absent."""
KV_ARGS_ANNOTATION = f"{GROUP}/kv-transfer-config-args"
"""`"true"`: append `--kv-transfer-config $(KV_TRANSFER_CONFIG)` and `--prefix-caching-hash-algo
$(PREFIX_CACHING_HASH_ALGO)` to every wired container's args, vLLM or not; `"false"`: to none. Absent: to the
containers that run vLLM (`vllm_command.vllm_form`)."""
VLLM_ARGS_ANNOTATION = f"{GROUP}/vllm-args"
"""`"false"`: opt out of every flag Strata adds to vLLM's command line (model path, `--load-format strata`, KV
transfer flags); the pod still gets its volumes, env and ConfigMap."""
KV_ENGINE_ANNOTATION = f"{GROUP}/kv-engine"
"""`cpu` or `gpu`: the `--kv-transfer-config` appended is the connection ConfigMap's variant for engines there
(vLLM's own offloading refuses the CPU platform; Strata's CPU spec serves it); absent: the tier's
`connector.engine`."""
SHM_SIZE_ANNOTATION = f"{GROUP}/shm-size"
"""A size (e.g. `8Gi`): mount a memory-backed /dev/shm of that size limit, which vLLM's CPU KV tier needs;
overrides the tier's `spec.clientShmSize`."""
MODEL_READY_GATE = f"{GROUP}/model-ready"
MODEL_DIR_ENV = "STRATA_MODEL_DIR"
KV_TRANSFER_FLAG = "--kv-transfer-config"
KV_TRANSFER_VALUE = "$(KV_TRANSFER_CONFIG)"
HASH_ALGO_FLAG = "--prefix-caching-hash-algo"
HASH_ALGO_VALUE = "$(PREFIX_CACHING_HASH_ALGO)"
KV_ARGS = ((KV_TRANSFER_FLAG, KV_TRANSFER_VALUE), (HASH_ALGO_FLAG, HASH_ALGO_VALUE))
"""The flags vLLM needs to share the tier's chunks, valued from the connection ConfigMap."""
SHM_VOLUME = "strata-shm"
SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class WiringRequest:
    """What a pod's labels ask for: at least one of a ModelCache and a KVCacheTier, by name."""

    model_cache: str | None
    kv_tier: str | None

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> WiringRequest | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        request = cls(labels.get(MODEL_CACHE_LABEL) or None, labels.get(KV_TIER_LABEL) or None)
        return request if request.model_cache or request.kv_tier else None


def cache_is_ready(cache: Mapping[str, Any]) -> bool:
    """Ready, or for NodeLocal a copy verified on at least one node (a pod can schedule there)."""
    status = cache.get("status") or {}
    if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return True
    mode = ((cache.get("spec") or {}).get("storage") or {}).get("mode")
    return mode == StorageMode.NODE_LOCAL and (status.get("readyNodes") or 0) >= 1


REPLACEABLE_OWNERS = frozenset({"ReplicaSet", "StatefulSet"})
"""Controllers that create a deleted pod again at once, through this webhook (a Job would count it as failed)."""


def rewire_revision(pod: Mapping[str, Any], cache: Mapping[str, Any]) -> str | None:
    """The revision a gated pod should be wired with instead of its request's, when its controller can replace it.

    A pod admitted while its cache was preloading is wired with the request's KV namespace (`req-...`): its model
    path is fixed at admission. Once the cache has resolved its revision, every later pod gets `rev-...`, so the
    first engine's KV would never be shared with the next. A pod still at the gate has never run: deleting it costs
    nothing, and its ReplicaSet or StatefulSet creates it again, wired with the revision. None: lift the gate."""
    wired = ((pod.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION)
    if not wired or not wired.startswith("req-"):
        return None
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if not any(o.get("controller") and o.get("kind") in REPLACEABLE_OWNERS for o in owners):
        return None
    revision = wiring_revision(cache)
    return revision if revision is not None and revision != wired and not revision.startswith("req-") else None


def cache_failure(cache: Mapping[str, Any]) -> str | None:
    """Why a cache that is not Ready will not become so by itself (its Degraded or Stalled message), if it won't.
    Copies on nodes that are not Ready (reason NodeNotReady) come back with their nodes: not a failure."""
    if cache_is_ready(cache):
        return None
    for condition in (cache.get("status") or {}).get("conditions") or []:
        if condition.get("reason") == PHASE_NODE_NOT_READY:
            continue
        if condition.get("type") in ("Degraded", "Stalled") and condition.get("status") == "True":
            return str(condition.get("message") or condition.get("reason") or condition["type"])
    return None


def model_volume_snippet(cache: Mapping[str, Any]) -> dict[str, Any]:
    """The cache's `status.volume` (the consumption contract) or, before the operator wrote it, the same built
    from the spec. An ImageVolume has none until its tag is resolved to a digest: a pod wired to the tag could
    mount another image than the rest, so it is refused until then (a Deployment's ReplicaSet retries)."""
    snippet = (cache.get("status") or {}).get("volume")
    if snippet:
        return copy.deepcopy(dict(snippet))
    meta = cache["metadata"]
    if _mode(cache) == StorageMode.IMAGE_VOLUME:
        image = (cache.get("status") or {}).get("image") or {}
        why = f": {image['message']}" if image.get("message") else ""
        raise WiringConflict(
            f"ModelCache {meta['name']} has not resolved its image to a digest yet{why}; "
            "create the pod once status.volume is set (kubectl wait --for=condition=Ready)"
        )
    try:
        spec = ModelCacheSpec.model_validate(cache.get("spec") or {})
    except ValidationError as error:
        raise WiringConflict(f"ModelCache {meta['name']} has an invalid spec: {error}") from None
    owner = CacheRef(meta["name"], meta["namespace"], meta.get("uid", ""))
    return MODES[spec.storage.mode].volume(owner, spec)


def build_pod_patch(
    pod: Mapping[str, Any],
    *,
    model_cache: Mapping[str, Any] | None = None,
    kv_tier: Mapping[str, Any] | None = None,
    creating: bool = True,
    runtime: RuntimeImage | None = None,
) -> list[dict[str, Any]]:
    """JSON Patch operations that wire `pod` to the objects its labels name (pass each one the labels name), and
    give its vLLM containers Strata's vLLM packages from `runtime` (the operator's runtime image; default: the
    release's).

    Raises `WiringConflict` when the pod's own settings stand in the way. `creating` allows a scheduling gate
    (the API server accepts new gates only at creation).
    """
    wired = copy.deepcopy(dict(pod))
    spec = wired.setdefault("spec", {})
    annotations = (wired.get("metadata") or {}).get("annotations") or {}
    containers = _chosen_containers(spec, annotations.get(CONTAINERS_ANNOTATION))
    link: dict[str, str] = {}
    if model_cache is not None:
        link = _wire_model(spec, containers, model_cache, annotations, creating, kv_linked=kv_tier is not None)
    if kv_tier is not None:
        _wire_kv_tier(spec, containers, kv_tier, annotations)
    # Last: the version check copies the engine's envFrom as the wiring leaves it (a re-admission then matches),
    # and the compile key's container the engine's env and mounts.
    inject_packages(spec, containers, annotations, runtime or default_runtime())
    if model_cache is not None:
        runtime = runtime or default_runtime()
        wire_compile_cache(spec, containers, model_cache, annotations, runtime, model_volume_snippet)
    ops = spec_patch(pod.get("spec") or {}, spec)
    if any(annotations.get(k) != v for k, v in link.items()):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {**annotations, **link}})
    return ops


def _chosen_containers(spec: dict[str, Any], names: str | None) -> list[dict[str, Any]]:
    containers = spec.get("containers") or []
    if not names:
        return list(containers)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    by_name = {c.get("name"): c for c in containers}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise WiringConflict(
            f"annotation {CONTAINERS_ANNOTATION} names {', '.join(unknown)}, which the pod does not have "
            f"(its containers: {', '.join(str(n) for n in by_name)})"
        )
    return [by_name[n] for n in wanted]


def _wire_model(
    spec: dict[str, Any],
    containers: list[dict[str, Any]],
    cache: Mapping[str, Any],
    annotations: Mapping[str, str],
    creating: bool,
    kv_linked: bool,
) -> dict[str, str]:
    """Mount the model; with a KV tier too, at a path that carries the cache's revision (the engine keys its KV
    by that path: `resources/kvcachetier/namespaces.py`). Returns the annotations that record that link."""
    name = cache["metadata"]["name"]
    snippet = model_volume_snippet(cache)
    mount = dict(snippet["volumeMount"])
    mount_path = annotations.get(MOUNT_PATH_ANNOTATION)
    if mount_path:
        if not mount_path.startswith("/"):
            raise WiringConflict(f"annotation {MOUNT_PATH_ANNOTATION} must be an absolute path, not {mount_path!r}")
        mount["mountPath"] = mount_path
    whose = f"ModelCache {name}"
    link: dict[str, str] = {}
    if kv_linked:
        # A pod wired before keeps the revision it was wired with (the cache may have moved on since).
        revision = annotations.get(REVISION_ANNOTATION) or wiring_revision(cache)
        if revision is None:
            raise WiringConflict(
                f"{whose} has no source to name its revision by, and the pod's KV namespace must carry it (KV "
                "computed with other weights must never be served)"
            )
        mount["mountPath"] = engine_model_path(mount["mountPath"], revision, layout_digest(containers))
        link = {MODEL_CACHE_ANNOTATION: name, REVISION_ANNOTATION: revision, KV_MODEL_ANNOTATION: mount["mountPath"]}
    add_named(spec, "volumes", snippet["volume"], "spec.volumes", whose)
    for container in containers:
        field = f"spec.containers[{container.get('name')}]"
        _add_mount(container, mount, field, whose)
        add_named(container, "env", {"name": MODEL_DIR_ENV, "value": mount["mountPath"]}, f"{field}.env", whose)
        if kv_linked:
            revision_env = {"name": REVISION_ENV, "value": link[REVISION_ANNOTATION]}
            add_named(container, "env", revision_env, f"{field}.env", whose)
    if annotations.get(VLLM_ARGS_ANNOTATION, "").lower() != "false":
        for container in containers:
            _add_model_args(container, f"spec.containers[{container.get('name')}]", whose)
    for secret in snippet.get("imagePullSecrets") or []:  # ImageVolume: the registry's pull Secret
        add_named(spec, "imagePullSecrets", dict(secret), "spec.imagePullSecrets", whose)
    if _mode(cache) == StorageMode.NODE_LOCAL:
        meta = cache["metadata"]
        _require_node_label(spec, node_label_key(meta["namespace"], name), NODE_LABEL_READY)
    if creating and not cache_is_ready(cache):
        gates = spec.setdefault("schedulingGates", [])
        if not any(g.get("name") == MODEL_READY_GATE for g in gates):
            gates.append({"name": MODEL_READY_GATE})
    return link


def _wire_kv_tier(
    spec: dict[str, Any], containers: list[dict[str, Any]], tier: Mapping[str, Any], annotations: Mapping[str, str]
) -> None:
    meta = tier["metadata"]
    whose = f"KVCacheTier {meta['name']}"
    ref = TierRef(meta["name"], meta["namespace"], meta.get("uid", ""))
    try:
        tier_spec = KVCacheTierSpec.model_validate(tier.get("spec") or {})
    except ValidationError as error:
        raise WiringConflict(f"{whose} has an invalid spec: {error}") from None
    config_map = (tier.get("status") or {}).get("connectionConfigMap") or ref.connection_config_map
    shm_size = annotations.get(SHM_SIZE_ANNOTATION) or client_shm_size(tier_spec)
    token = token_secret(tier_spec, ref)
    if shm_size:
        shm = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}}
        add_named(spec, "volumes", shm, "spec.volumes", f"annotation {SHM_SIZE_ANNOTATION}")
    if tier_spec.node_socket.enabled:
        add_named(spec, "volumes", node_socket_volume(tier_spec, ref, read_only=True), "spec.volumes", whose)
        _add_supplemental_group(spec, SOCKET_GROUP)
    for container in containers:
        field = f"spec.containers[{container.get('name')}]"
        sources = container.setdefault("envFrom", [])
        if not any((s.get("configMapRef") or {}).get("name") == config_map for s in sources):
            sources.append({"configMapRef": {"name": config_map}})
        if shm_size:
            _add_mount(container, {"name": SHM_VOLUME, "mountPath": SHM_PATH}, field, "the /dev/shm for the KV tier")
        if tier_spec.node_socket.enabled:
            _add_mount(container, node_socket_mount(read_only=True), field, f"{whose}'s node socket")
        if token is not None:
            # The tier's AUTH token, for Strata's vLLM tier (it reads TOKEN_ENV); the value never enters the spec.
            secret_env = {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}}
            add_named(container, "env", secret_env, f"{field}.env", whose)
        if _wants_kv_args(container, annotations):
            engine = annotations.get(KV_ENGINE_ANNOTATION)
            if engine is None and KV_ARGS_ANNOTATION not in annotations:
                engine = _engine_for(container, tier)
            for flag, value in _kv_args(tier_spec, engine, whose):
                _append_flag(container, flag, value, field, whose)


def _wants_kv_args(container: Mapping[str, Any], annotations: Mapping[str, str]) -> bool:
    """The explicit annotation decides; without it, every container that runs vLLM (unless opted out)."""
    explicit = annotations.get(KV_ARGS_ANNOTATION, "").lower()
    if explicit in ("true", "false"):
        return explicit == "true"
    return annotations.get(VLLM_ARGS_ANNOTATION, "").lower() != "false" and vllm_form(container) is not None


def _engine_for(container: Mapping[str, Any], tier: Mapping[str, Any]) -> str | None:
    """Without either annotation: GPU when the container requests `nvidia.com/gpu` (it computes there, whatever
    the tier's default), else None: KV_TRANSFER_CONFIG, which follows the tier's `connector.engine` (a tier for
    CPU engines says `cpu`; one whose pods get GPUs another way keeps `gpu`). Another connector: None."""
    connector = (tier.get("spec") or {}).get("connector") or {}
    if connector.get("type", "vllm") != "vllm":
        return None
    return "gpu" if requests_gpu(container) else None


def _add_model_args(container: dict[str, Any], field: str, whose: str) -> None:
    """A vLLM container gets the mounted model and Strata's load format; a model or format the user wrote that
    differs is refused with the field named (the engine would otherwise load something else than the cache)."""
    form = vllm_form(container)
    if form is None:
        return
    model = f"$({MODEL_DIR_ENV})"
    given_flag, given_model = flag_value(container, MODEL_FLAG)
    positional = serve_positional(container) if form == "serve" else None
    if positional is not None and positional[1] is not None:
        given_flag, given_model = True, positional[1]
    if given_flag and given_model != model:
        raise WiringConflict(
            f"{field} runs vLLM with model {given_model!r}; {whose} mounts it at {model}: remove the model from "
            f'the args (Strata adds it), or the annotation {VLLM_ARGS_ANNOTATION}: "false"'
        )
    args = container.setdefault("args", [])
    if not given_flag:
        if positional is not None:
            args.insert(positional[0], model)
        else:
            args.extend([MODEL_FLAG, model])
    given_flag, given_format = flag_value(container, LOAD_FORMAT_FLAG)
    if given_flag and given_format != LOAD_FORMAT_VALUE:
        raise WiringConflict(
            f"{field}.args passes {LOAD_FORMAT_FLAG} {given_format!r}; {whose} loads with {LOAD_FORMAT_VALUE!r}: "
            f'remove it, or the annotation {VLLM_ARGS_ANNOTATION}: "false"'
        )
    if not given_flag:
        args.extend([LOAD_FORMAT_FLAG, LOAD_FORMAT_VALUE])


def _kv_args(tier_spec: KVCacheTierSpec, engine: str | None, whose: str) -> tuple[tuple[str, str], ...]:
    """KV_ARGS, with the transfer config of the engine the pod names (`strata.dev/kv-engine`)."""
    if engine is None:
        return KV_ARGS
    try:
        device = EngineDevice(engine.lower())
    except ValueError:
        raise WiringConflict(
            f"annotation {KV_ENGINE_ANNOTATION} is {engine!r}: use one of {', '.join(d.value for d in EngineDevice)}"
        ) from None
    if tier_spec.connector.type != ConnectorType.VLLM:
        raise WiringConflict(
            f"annotation {KV_ENGINE_ANNOTATION} picks a vLLM offloading spec, but {whose} uses the "
            f"{tier_spec.connector.type.value} connector: remove the annotation"
        )
    return ((KV_TRANSFER_FLAG, f"$({TRANSFER_CONFIG_ENV[device]})"), (HASH_ALGO_FLAG, HASH_ALGO_VALUE))


def _append_flag(container: dict[str, Any], flag: str, value: str, field: str, whose: str) -> None:
    args = container.setdefault("args", [])
    for i, arg in enumerate(args):
        if arg == flag:
            given = args[i + 1] if i + 1 < len(args) else None
            if given != value:
                raise WiringConflict(
                    f"{field}.args already passes {flag} {given!r}; {whose} would pass "
                    f"{value!r}: remove one, or the annotation {KV_ARGS_ANNOTATION}"
                )
            return
        if arg.startswith(f"{flag}="):
            if arg != f"{flag}={value}":
                raise WiringConflict(
                    f"{field}.args already passes {arg!r}; remove it or the annotation {KV_ARGS_ANNOTATION}"
                )
            return
    args.extend([flag, value])


def _mode(cache: Mapping[str, Any]) -> str | None:
    return ((cache.get("spec") or {}).get("storage") or {}).get("mode")


def _add_mount(container: dict[str, Any], mount: dict[str, Any], field: str, whose: str) -> None:
    add_mount(
        container,
        mount,
        field,
        whose,
        f"set another path with the annotation {MOUNT_PATH_ANNOTATION}, or remove the mount",
    )


def _add_supplemental_group(spec: dict[str, Any], gid: int) -> None:
    """The socket is the server's (mode 0660, its group): the pod's processes join that group to connect. A
    pod-level supplemental group is allowed under `restricted` and adds to, never replaces, what the pod set."""
    groups = spec.setdefault("securityContext", {}).setdefault("supplementalGroups", [])
    if gid not in groups:
        groups.append(gid)


def _require_node_label(spec: dict[str, Any], key: str, value: str) -> None:
    """Add `key In [value]` to every required node selector term (terms are ORed, so each must carry it)."""
    requirement = {"key": key, "operator": "In", "values": [value]}
    node_affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        expressions = term.setdefault("matchExpressions", [])
        if requirement not in expressions:
            expressions.append(requirement)
