"""Strata's vLLM packages for an engine whose image has vLLM but not Strata, added at admission.

The way OpenTelemetry's operator instruments Python: an init container from the runtime image copies the directory
that image carries (`strata_loader.vllm.packages`: the loader plugin, the KV tier, a dist-info with vLLM's entry
point) into an emptyDir, and each engine container mounts it read-only, first on its PYTHONPATH. Pure: a pod
spec (a plain dict) is edited in place; `wiring.build_pod_patch` turns the edit into the patch.

When the image has a Strata of its own, the injected one wins, modules and dist-info alike (PYTHONPATH comes before
site-packages, and `importlib.metadata` keeps the first distribution of a name): it is the release of the operator
that wired the pod, so the engine speaks the protocol of the KV servers that operator runs, and never a mix of two
releases. An image that must keep its own says `strata.dev/inject-packages: "false"`.

Versions: admission cannot look inside an image. A pod that declares them (`strata.dev/vllm-version`,
`strata.dev/python-version`) is refused at once when one is not served; for what is not declared, a second init
container runs the directory's check (`strata_loader.vllm.support`) with the engine's own image and interpreter
before the engine starts, and a mismatch stops the pod with both versions in that container's termination message.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from strata_loader.vllm import support
from strata_loader.vllm.packages import CHECK_SCRIPT

from strata_operator.api import GROUP
from strata_operator.resources.runtime_image import RuntimeImage
from strata_operator.resources.security import RUNTIME_UID, container_security_context
from strata_operator.webhook.pod_edits import WiringConflict, add_mount, add_named
from strata_operator.webhook.vllm_command import engine_python, vllm_form

INJECT_ANNOTATION = f"{GROUP}/inject-packages"
"""`"false"`: no container gets the packages (the image brings its own Strata); `"true"`: every wired container
(an image whose entrypoint runs vLLM, which the pod's command does not show); absent: the containers that run
vLLM (`vllm_command.vllm_form`)."""
VLLM_VERSION_ANNOTATION = f"{GROUP}/vllm-version"
PYTHON_VERSION_ANNOTATION = f"{GROUP}/python-version"
"""The image's vLLM and Python, declared: one that is not served is refused at admission; with both declared no
check runs at start."""
RUNTIME_PACKAGES_DIR = "/opt/strata/vllm-packages"
"""Where the runtime image holds the directory (images/runtime/Dockerfile builds it)."""
PACKAGES_VOLUME = "strata-vllm-packages"
PACKAGES_PATH = "/strata/vllm-packages"
"""Where the engine sees the packages: first on its PYTHONPATH."""
PYTHONPATH = "PYTHONPATH"
COPY_CONTAINER = "strata-vllm-packages"
CHECK_PREFIX = "strata-check-"
INIT_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
"""A copy of ~1 MB and a Python that reads distribution metadata: small, but bounded where a quota wants limits."""
VOLUME_SIZE = "64Mi"
WHOSE = "Strata's vLLM packages"
OPT_OUT = f'annotate the pod {INJECT_ANNOTATION}: "false" if the image brings a Strata of its own'


def engines(containers: list[dict[str, Any]], annotations: Mapping[str, str]) -> list[dict[str, Any]]:
    """The wired containers that get the packages (see `INJECT_ANNOTATION`)."""
    value = annotations.get(INJECT_ANNOTATION)
    if value is None:
        return [c for c in containers if vllm_form(c) is not None]
    if value.lower() in ("true", "false"):
        return list(containers) if value.lower() == "true" else []
    raise WiringConflict(
        f'annotation {INJECT_ANNOTATION} is {value!r}: use "true" (every wired container) or "false" (none); '
        "without it, the containers that run vLLM get Strata's vLLM packages"
    )


def declared_versions(annotations: Mapping[str, str]) -> bool:
    """Refuse a declared version the packages do not serve; True when both are declared (no check at start)."""
    checks: tuple[tuple[str, Callable[[str], str | None]], ...] = (
        (VLLM_VERSION_ANNOTATION, support.vllm_problem),
        (PYTHON_VERSION_ANNOTATION, support.python_problem),
    )
    for annotation, problem in checks:
        value = annotations.get(annotation)
        why = problem(value.strip()) if value is not None else None
        if why:
            raise WiringConflict(f"annotation {annotation}: {why}: use an image with one of them, or {OPT_OUT}")
    return all(annotation in annotations for annotation, _ in checks)


def copy_container(runtime: RuntimeImage) -> dict[str, Any]:
    """Copies the runtime image's package directory into the pod's volume (again on a restart: the same files)."""
    return {
        "name": COPY_CONTAINER,
        "image": runtime.image,
        "imagePullPolicy": runtime.pull_policy,
        "command": ["cp", "-R", f"{RUNTIME_PACKAGES_DIR}/.", PACKAGES_PATH],
        "resources": copy.deepcopy(INIT_RESOURCES),
        "securityContext": {**container_security_context(), "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": PACKAGES_VOLUME, "mountPath": PACKAGES_PATH}],
    }


def check_name(engine: str) -> str:
    """`strata-check-<engine>`, or with a digest of the engine's name where that would pass 63 characters."""
    name = f"{CHECK_PREFIX}{engine}"
    return name if len(name) <= 63 else f"{CHECK_PREFIX}{hashlib.sha256(engine.encode()).hexdigest()[:12]}"


def check_container(pod_spec: Mapping[str, Any], engine: Mapping[str, Any], engine_path: str | None) -> dict[str, Any]:
    """The version check in the engine's own image, with the interpreter that runs vLLM there (`python -I`: the
    image's own path, not the packages'). `engine_path`: the PYTHONPATH the webhook gave an engine that had none,
    so the check can say when the image's own PYTHONPATH (or one from the engine's envFrom) would be lost."""
    container: dict[str, Any] = {
        "name": check_name(str(engine.get("name"))),
        "image": engine.get("image"),
        "command": [engine_python(engine), "-I", f"{PACKAGES_PATH}/{CHECK_SCRIPT}"],
        "resources": copy.deepcopy(INIT_RESOURCES),
        "securityContext": check_security(pod_spec, engine),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": PACKAGES_VOLUME, "mountPath": PACKAGES_PATH, "readOnly": True}],
    }
    if engine.get("imagePullPolicy"):
        container["imagePullPolicy"] = engine["imagePullPolicy"]
    if engine_path is not None:
        container["env"] = [{"name": support.PACKAGES_PYTHONPATH_ENV, "value": engine_path}]
        if engine.get("envFrom"):
            container["envFrom"] = copy.deepcopy(list(engine["envFrom"]))
    return container


def check_security(pod_spec: Mapping[str, Any], engine: Mapping[str, Any]) -> dict[str, Any]:
    """Restricted, as the engine's user where it names one (to read what the engine reads); else the pod's, or
    Strata's non-root user when neither names one (the image's may be root: the check only reads). A user 0 is
    never taken: the check runs non-root wherever the engine may run."""
    context = container_security_context()
    own = engine.get("securityContext") or {}
    if own.get("runAsUser"):
        context["runAsUser"] = own["runAsUser"]
        if own.get("runAsGroup") is not None:
            context["runAsGroup"] = own["runAsGroup"]
    elif not (pod_spec.get("securityContext") or {}).get("runAsUser"):
        context["runAsUser"] = RUNTIME_UID
    return context


def put_first_on_pythonpath(container: dict[str, Any], field: str) -> str | None:
    """PACKAGES_PATH in front of the container's PYTHONPATH (added when it has none). Returns the value when the
    pod set none of its own (it replaces the image's), else None. A PYTHONPATH from `valueFrom` cannot be merged."""
    env = container.setdefault("env", [])
    for entry in env:
        if entry.get("name") != PYTHONPATH:
            continue
        if "valueFrom" in entry:
            source = ", ".join(entry["valueFrom"] or {}) or "nothing"
            raise WiringConflict(
                f"{field}.env[{PYTHONPATH}] is set from valueFrom ({source}), which the webhook cannot put Strata's "
                f"vLLM packages in front of: give it as a value, or {OPT_OUT} and put the packages on the path "
                "yourself"
            )
        value = str(entry.get("value") or "")
        own = [e for e in value.split(":") if e != PACKAGES_PATH] if value else []
        entry["value"] = ":".join([PACKAGES_PATH, *own])
        return None if own else entry["value"]
    env.append({"name": PYTHONPATH, "value": PACKAGES_PATH})
    return PACKAGES_PATH


def inject_packages(
    spec: dict[str, Any], containers: list[dict[str, Any]], annotations: Mapping[str, str], runtime: RuntimeImage
) -> None:
    """Give the chosen containers Strata's vLLM packages: the volume, the copy, the mount and PYTHONPATH, and the
    version check for what the pod does not declare."""
    chosen = engines(containers, annotations)
    if not chosen:
        return
    checked_at_start = not declared_versions(annotations)
    add_named(spec, "volumes", {"name": PACKAGES_VOLUME, "emptyDir": {"sizeLimit": VOLUME_SIZE}}, "spec.volumes", WHOSE)
    add_named(spec, "initContainers", copy_container(runtime), "spec.initContainers", WHOSE, defaulted=True)
    for secret in runtime.pod_pull_secrets():
        add_named(spec, "imagePullSecrets", secret, "spec.imagePullSecrets", WHOSE)
    for engine in chosen:
        field = f"spec.containers[{engine.get('name')}]"
        mount = {"name": PACKAGES_VOLUME, "mountPath": PACKAGES_PATH, "readOnly": True}
        add_mount(engine, mount, field, WHOSE, f"remove it, or {OPT_OUT}")
        replaced = put_first_on_pythonpath(engine, field)
        if checked_at_start:
            check = check_container(spec, engine, replaced)
            add_named(spec, "initContainers", check, "spec.initContainers", WHOSE, defaulted=True)
