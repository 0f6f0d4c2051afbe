"""Wiring a vLLM engine to its ModelCache's compile cache (`spec.compileCache.enabled`), at admission.

The store lives beside the model's files (`COMPILE_STORE_DIR` in the claim or the node's copy), and only one
container ever writes it: the capture sidecar. In order, the pod gets:

1. `strata-compile-key` (init, the engine's image and interpreter, its env, mounts and resources: vLLM's config
   reads the model's config.json, and the target part needs the engine's GPUs): `strata-loader compile key --out
   KEY_FILE -- <the engine's vLLM args>`. The key reaches the containers after it as a file in a small emptyDir.
2. `strata-compile-restore` (init, the engine's image and user): `compile restore` from the store, mounted
   read-only, into an emptyDir the engine uses as VLLM_CACHE_ROOT; a miss exits 0. Its termination message (a
   `contract.CompileRestoreReport`) is how the operator counts hits and misses and learns of stored keys.
3. `strata-compile-capture` (a native sidecar: an init container with `restartPolicy: Always`, the runtime image
   as the user that owns the model's files): `compile capture --follow --if-missing --stay`, the store mounted
   read-write; it waits for the engine's compile to finish, stores it unless the key is already there, prints
   how that went (the log line the operator reads), then waits for the pod to stop (a sidecar that exits is
   restarted).

The engine gets the emptyDir, VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR in it (what torch compiles before vLLM
points inductor into its own directory), and VLLM_USE_AOT_COMPILE=0 where its vLLM cannot reload its own AOT
artifacts (`contract.AOT_COMPILE_CANNOT_RELOAD`). Engines never mount the store. Pure, like `wiring`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError
from strata_loader import contract
from strata_loader.vllm import support

from strata_operator.api import GROUP
from strata_operator.api.modelcache import CompileCache
from strata_operator.resources.modelcache.compile_cache import CAPTURE_CONTAINER, COMPILE_STORE_DIR, RESTORE_CONTAINER
from strata_operator.resources.runtime_image import RuntimeImage
from strata_operator.resources.security import RUNTIME_UID, container_security_context
from strata_operator.webhook.pod_edits import WiringConflict, add_mount, add_named
from strata_operator.webhook.vllm_command import command_words, engine_python, vllm_form
from strata_operator.webhook.vllm_packages import PACKAGES_VOLUME, VLLM_VERSION_ANNOTATION, check_security

COMPILE_CACHE_ANNOTATION = f"{GROUP}/compile-cache"
"""`"false"`: leave this pod's engine off the compile cache although its ModelCache enables it."""
CACHE_VOLUME, CACHE_PATH = "strata-compile-cache", "/strata/compile-cache"
KEY_VOLUME, KEY_PATH = "strata-compile-key", "/strata/compile-key"
STORE_VOLUME, STORE_PATH = "strata-compile-store", "/strata/compile-store"
KEY_FILE = f"{KEY_PATH}/key.json"
STORE = f"{STORE_PATH}/{COMPILE_STORE_DIR}"
VLLM_CACHE_ROOT = f"{CACHE_PATH}/vllm"
INDUCTOR_CACHE_DIR = f"{CACHE_PATH}/inductor"
KEY_CONTAINER = "strata-compile-key"
SMALL_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
"""Restore and capture copy and hash files one at a time: small, but bounded where a quota wants limits."""


def engine_vllm_args(engine: Mapping[str, Any]) -> list[str]:
    """vLLM's own arguments of the engine's command line, in the module form `compile key` reads (`--model M ...`):
    what follows `serve` (its positional model as `--model`) or the server module."""
    all_words = command_words(engine)
    if vllm_form(engine) == "serve":
        rest = all_words[all_words.index("serve") + 1 :]
        return ["--model", *rest] if rest and not rest[0].startswith("-") else rest
    for i, word in enumerate(all_words):
        if word == "-m" and i + 1 < len(all_words):
            return all_words[i + 2 :]
    return all_words


def aot_compile_off(annotations: Mapping[str, str]) -> bool:
    """VLLM_USE_AOT_COMPILE=0 for a declared vLLM that cannot reload its AOT artifacts; for an undeclared one when
    any vLLM Strata serves cannot (it only loses AOT compile, which would recompile every start anyway)."""
    declared = annotations.get(VLLM_VERSION_ANNOTATION)
    if declared is not None:
        return not contract.aot_compile_reloads(declared)
    return any(not contract.aot_compile_reloads(f"{a}.{b}") for a, b in support.VLLM_VERSIONS)


def store_volume(model_volume: Mapping[str, Any]) -> dict[str, Any]:
    """The model's volume under another name, writable: only the capture sidecar mounts it read-write."""
    volume = copy.deepcopy(dict(model_volume))
    volume["name"] = STORE_VOLUME
    claim = volume.get("persistentVolumeClaim")
    if claim is not None:
        claim.pop("readOnly", None)
    return volume


def key_container(spec: Mapping[str, Any], engine: Mapping[str, Any]) -> dict[str, Any]:
    """`compile key` as the engine would start: its image, interpreter, env, mounts and resources (its GPUs are
    part of the key). The root filesystem is as writable as the engine's: importing vLLM writes caches."""
    security = check_security(spec, engine)
    security["readOnlyRootFilesystem"] = bool((engine.get("securityContext") or {}).get("readOnlyRootFilesystem"))
    image = str(engine.get("image") or "")
    command = [engine_python(engine), "-m", "strata_loader", "compile", "key", "--image", image, "--out", KEY_FILE]
    container: dict[str, Any] = {
        "name": KEY_CONTAINER,
        "image": image,
        "command": [*command, "--", *engine_vllm_args(engine)],
        "securityContext": security,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            *copy.deepcopy(list(engine.get("volumeMounts") or [])),
            {"name": KEY_VOLUME, "mountPath": KEY_PATH},
        ],
    }
    for field in ("imagePullPolicy", "workingDir", "resources", "env", "envFrom"):
        if engine.get(field):
            container[field] = copy.deepcopy(engine[field])
    return container


def restore_container(spec: Mapping[str, Any], engine: Mapping[str, Any]) -> dict[str, Any]:
    """`compile restore` as the engine's user (the engine writes into what it restores); read-only store."""
    command = [engine_python(engine), "-m", "strata_loader", "compile", "restore", *_cache_args()]
    container: dict[str, Any] = {
        "name": RESTORE_CONTAINER,
        "image": engine.get("image"),
        "command": command,
        "resources": copy.deepcopy(SMALL_RESOURCES),
        "securityContext": check_security(spec, engine),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": [e for e in engine.get("env") or [] if e.get("name") == "PYTHONPATH"],
        "volumeMounts": [
            *[m for m in engine.get("volumeMounts") or [] if m.get("name") == PACKAGES_VOLUME],
            {"name": CACHE_VOLUME, "mountPath": CACHE_PATH},
            {"name": KEY_VOLUME, "mountPath": KEY_PATH, "readOnly": True},
            {"name": STORE_VOLUME, "mountPath": STORE_PATH, "readOnly": True},
        ],
    }
    if engine.get("imagePullPolicy"):
        container["imagePullPolicy"] = engine["imagePullPolicy"]
    return container


def capture_container(runtime: RuntimeImage, max_bytes: int) -> dict[str, Any]:
    """The only writer of the store, as the user the preloader wrote the model's files with."""
    args = ["--max-bytes", str(max_bytes), "--if-missing", "--follow", "--stay"]
    return {
        "name": CAPTURE_CONTAINER,
        "image": runtime.image,
        "imagePullPolicy": runtime.pull_policy,
        "restartPolicy": "Always",
        "command": [*contract.COMMAND, "compile", "capture", *_cache_args(), *args],
        "resources": copy.deepcopy(SMALL_RESOURCES),
        "securityContext": {**container_security_context(), "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": CACHE_VOLUME, "mountPath": CACHE_PATH, "readOnly": True},
            {"name": KEY_VOLUME, "mountPath": KEY_PATH, "readOnly": True},
            {"name": STORE_VOLUME, "mountPath": STORE_PATH},
        ],
    }


def _cache_args() -> list[str]:
    return [
        *("--store", STORE, "--key", KEY_FILE),
        *("--vllm-cache-root", VLLM_CACHE_ROOT, "--inductor-cache-dir", INDUCTOR_CACHE_DIR),
    ]


def engine_env(annotations: Mapping[str, str]) -> list[dict[str, str]]:
    env = [
        {"name": "VLLM_CACHE_ROOT", "value": VLLM_CACHE_ROOT},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": INDUCTOR_CACHE_DIR},
    ]
    if aot_compile_off(annotations):
        env.append({"name": "VLLM_USE_AOT_COMPILE", "value": "0"})
    return env


def wire_compile_cache(
    spec: dict[str, Any],
    containers: list[dict[str, Any]],
    cache: Mapping[str, Any],
    annotations: Mapping[str, str],
    runtime: RuntimeImage,
    model_snippet: Callable[[Mapping[str, Any]], Mapping[str, Any]],
) -> None:
    """Give the pod's vLLM engine the compile cache of `cache` when it enables it (see the module's docstring).
    Called after every other edit: the key container copies the engine's env and mounts as the wiring leaves
    them. `model_snippet`: the cache's volume and mount (`wiring.model_volume_snippet`)."""
    raw = (cache.get("spec") or {}).get("compileCache") or {}
    if not raw.get("enabled") or annotations.get(COMPILE_CACHE_ANNOTATION, "").lower() == "false":
        return
    whose = f"ModelCache {cache['metadata']['name']}"
    try:
        settings = CompileCache.model_validate(raw)
    except ValidationError as error:
        raise WiringConflict(f"{whose} has an invalid spec.compileCache: {error}") from None
    engines = [c for c in containers if vllm_form(c) is not None]
    if not engines:
        return
    if len(engines) > 1:
        names = ", ".join(str(c.get("name")) for c in engines)
        raise WiringConflict(
            f"{whose} enables compileCache, which wires one vLLM engine per pod; this pod runs {len(engines)} "
            f"({names}): name one with the annotation {GROUP}/containers, or annotate the pod "
            f'{COMPILE_CACHE_ANNOTATION}: "false"'
        )
    engine = engines[0]
    field = f"spec.containers[{engine.get('name')}]"
    fix = f'remove it, or annotate the pod {COMPILE_CACHE_ANNOTATION}: "false"'
    for volume in (
        {"name": CACHE_VOLUME, "emptyDir": {}},
        {"name": KEY_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}},
        store_volume(model_snippet(cache)["volume"]),
    ):
        add_named(spec, "volumes", volume, "spec.volumes", whose)
    add_mount(engine, {"name": CACHE_VOLUME, "mountPath": CACHE_PATH}, field, whose, fix)
    for entry in engine_env(annotations):
        add_named(engine, "env", entry, f"{field}.env", whose)
    capture = capture_container(runtime, int(settings.max_bytes))
    for init in (key_container(spec, engine), restore_container(spec, engine), capture):
        add_named(spec, "initContainers", init, "spec.initContainers", whose, defaulted=True)
    for secret in runtime.pod_pull_secrets():
        add_named(spec, "imagePullSecrets", secret, "spec.imagePullSecrets", whose)
