"""Preloader, pre-pull and clean-up Jobs: the pods that move a model's bytes, with restricted pod security.

The preloader's arguments come from `strata_loader.contract.FetchRequest` (the loader parses the same
model), so what the operator renders and what `strata-loader fetch` reads cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel
from strata_loader import contract

from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.core import stable_hash
from strata_operator.resources.modelcache.names import PRELOAD_HASH_LABEL
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.status import SpecError
from strata_operator.resources.runtime_image import RuntimeImage
from strata_operator.resources.security import container_security_context, pod_security_context

CONTAINER = "fetch"
MODEL_MOUNT = "/strata/model"
NODE_ROOT_MOUNT = "/strata/node"
NODE_ANNOTATION = "strata.dev/node"
MIN_TTL_SECONDS = 60
"""A finished Job must outlive the operator's reading of its result (a watch event, then a reconcile): with a
TTL of 0 it vanished first, and was created again at once, again and again."""
HF_HOME = "/tmp/hf"


def runtime_image(spec: ModelCacheSpec, runtime: RuntimeImage) -> str:
    """The spec's image, else the operator's configured runtime image."""
    return spec.preload.image or runtime.image


_REQUEST_FIELDS = {
    "source": "source.uri",
    "revision": "source.revision",
    "include": "source.include",
    "exclude": "source.exclude",
    "concurrency": "preload.concurrency",
    "block_size": "preload.blockSize",
    "memory_limit": "preload.memoryLimit",
    "verify": "preload.verify",
    "shard": "preload.shard",
}
"""The spec field each FetchRequest field comes from, to say which one the loader's contract refused."""


def _spec_field(loc: tuple[int | str, ...]) -> str:
    parts = [str(part) for part in loc] or [""]
    field = _REQUEST_FIELDS.get(parts[0], parts[0])
    if parts[0] == "shard" and len(parts) > 1:
        field += f".{to_camel(parts[1])}"
    return field


def fetch_request(spec: ModelCacheSpec, dest: str) -> contract.FetchRequest:
    """The preloader's one run, as the loader's own contract model (validated on construction).

    Sizes arrive as the spec's `ByteSize` values and pass through unparsed; `model_validate` checks the rest. A value
    the CRD let through but the contract refuses is a `SpecError` naming the spec field, not a crash.
    """
    preload = spec.preload
    shard = None
    if preload.shard:
        shard = {
            "tensor_parallel_size": preload.shard.tensor_parallel_size,
            "max_part_bytes": preload.shard.max_part_bytes,
        }
    try:
        return contract.FetchRequest.model_validate(
            {
                "source": spec.source.uri,
                "dest": dest,
                "revision": spec.source.revision,
                "include": list(spec.source.include),
                "exclude": list(spec.source.exclude),
                "concurrency": preload.concurrency,
                "block_size": preload.block_size,
                "memory_limit": preload.memory_limit,
                "verify": preload.verify,
                "shard": shard,
            }
        )
    except ValidationError as error:
        errors = error.errors()
        message = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in errors)
        raise SpecError(_spec_field(tuple(errors[0]["loc"])), f"the preloader would refuse it: {message}") from None


def request_hash(spec: ModelCacheSpec, request: contract.FetchRequest, *extra: str, runtime: RuntimeImage) -> str:
    """Changes whenever what the Job would do changes: a new hash means a new Job (and a new preload)."""
    # allowLinkLocal only widens what the API accepts; the Job it leads to is the same, so it is not hashed.
    s3 = spec.source.s3.to_k8s() if spec.source.s3 else {}
    s3.pop("allowLinkLocal", None)
    return stable_hash([request.to_args(), s3, runtime_image(spec, runtime), *extra])


@dataclass
class PodMounts:
    """Volumes and mounts a Job's pod needs besides the scratch space."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, source: dict[str, Any], path: str, *, read_only: bool = False) -> None:
        self.volumes.append({"name": name, **source})
        mount: dict[str, Any] = {"name": name, "mountPath": path}
        if read_only:
            mount["readOnly"] = True
        self.mounts.append(mount)


def source_mounts(spec: ModelCacheSpec) -> PodMounts:
    """A pvc:// source is read from its claim, mounted read-only where the loader expects it."""
    mounts = PodMounts()
    if pvc := contract.pvc_source(spec.source.uri):
        claim = pvc[0]
        mounts.add(
            "source",
            {"persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
            f"{contract.DEFAULT_PVC_MOUNT_ROOT}/{claim}",
            read_only=True,
        )
    return mounts


def loader_env(spec: ModelCacheSpec, request: contract.FetchRequest | None) -> list[dict[str, Any]]:
    env = dict(request.to_env()) if request else {}
    env[contract.ENV_HF_HOME] = HF_HOME
    if spec.source.s3 and spec.source.s3.endpoint:
        env[contract.ENV_AWS_ENDPOINT_URL] = spec.source.s3.endpoint
    if spec.source.s3 and spec.source.s3.region:
        env[contract.ENV_AWS_REGION] = spec.source.s3.region
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def node_affinity(node: str) -> dict[str, Any]:
    """Pin to one node by name (matchFields, as the DaemonSet controller does), through the scheduler."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


@dataclass(frozen=True)
class JobShape:
    """Everything that differs between the Strata Jobs; the rest of the pod is the same hardened template."""

    name: str
    role: str
    command: list[str]
    args: list[str]
    mounts: PodMounts
    preload_hash: str
    node: str | None = None
    tolerations: tuple[dict[str, Any], ...] = ()


def build_job(
    owner: CacheRef, spec: ModelCacheSpec, shape: JobShape, request: Any = None, *, runtime: RuntimeImage
) -> dict[str, Any]:
    """A Job running one container from the runtime image, restricted pod security, result in the
    termination message (with the log tail as fallback when the process dies before writing it)."""
    labels = {**owner.labels(shape.role), PRELOAD_HASH_LABEL: shape.preload_hash}
    annotations = {NODE_ANNOTATION: shape.node} if shape.node else {}
    preload = spec.preload
    credentials = spec.source.credentials
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": runtime_image(spec, runtime),
        "imagePullPolicy": preload.image_pull_policy.value,
        "command": shape.command,
        "args": shape.args,
        "env": loader_env(spec, request),
        "resources": preload.resources.to_k8s(),
        "securityContext": container_security_context(),
        "terminationMessagePath": contract.DEFAULT_TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [*shape.mounts.mounts, {"name": "tmp", "mountPath": "/tmp"}],
    }
    if credentials and credentials.secret_ref:
        container["envFrom"] = [{"secretRef": {"name": credentials.secret_ref.name}}]
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [*shape.mounts.volumes, {"name": "tmp", "emptyDir": {}}],
    }
    if pull_secrets := runtime.pod_pull_secrets():
        pod["imagePullSecrets"] = pull_secrets
    if credentials and credentials.service_account_name:
        pod["serviceAccountName"] = credentials.service_account_name
    else:
        pod["automountServiceAccountToken"] = False
    if shape.node:
        pod["affinity"] = node_affinity(shape.node)
    if shape.tolerations:
        pod["tolerations"] = list(shape.tolerations)
    job_spec: dict[str, Any] = {
        "backoffLimit": preload.backoff_limit,
        "ttlSecondsAfterFinished": max(preload.ttl_seconds_after_finished, MIN_TTL_SECONDS),
        "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod},
    }
    if preload.active_deadline_seconds:
        job_spec["activeDeadlineSeconds"] = preload.active_deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": shape.name,
            "namespace": owner.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner.reference()],
        },
        "spec": job_spec,
    }


def job_node(job: dict[str, Any]) -> str | None:
    return (job.get("metadata", {}).get("annotations") or {}).get(NODE_ANNOTATION)
