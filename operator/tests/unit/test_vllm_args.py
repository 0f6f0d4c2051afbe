"""The flags the webhook adds to a container that runs vLLM: each command form, user flags that win or are
refused, the opt-out annotation, and containers that are not vLLM (left alone)."""

from __future__ import annotations

from typing import Any

import pytest
from strata_operator.webhook.vllm_command import requests_gpu, vllm_form
from strata_operator.webhook.wiring import (
    KV_ARGS_ANNOTATION,
    KV_ENGINE_ANNOTATION,
    VLLM_ARGS_ANNOTATION,
    WiringConflict,
    build_pod_patch,
)

from .test_serving_wiring import apply_patch, cache, tier

MODEL = "$(STRATA_MODEL_DIR)"
STRATA = ["--load-format", "strata"]
KV_CPU = [
    "--kv-transfer-config",
    "$(KV_TRANSFER_CONFIG_CPU)",
    "--prefix-caching-hash-algo",
    "$(PREFIX_CACHING_HASH_ALGO)",
]
KV_GPU = [
    "--kv-transfer-config",
    "$(KV_TRANSFER_CONFIG_GPU)",
    "--prefix-caching-hash-algo",
    "$(PREFIX_CACHING_HASH_ALGO)",
]


def pod(container: dict[str, Any], annotations: dict[str, str] | None = None, tier_too: bool = False) -> dict[str, Any]:
    labels = {"strata.dev/model-cache": "llama"}
    if tier_too:
        labels["strata.dev/kv-cache-tier"] = "kv"
    return {
        "metadata": {"name": "p", "labels": labels, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm", **container}]},
    }


def wired_container(p: dict[str, Any], **objects: Any) -> dict[str, Any]:
    objects.setdefault("model_cache", cache())
    out: dict[str, Any] = apply_patch(p, build_pod_patch(p, **objects))
    return out["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("container", "form"),
    [
        ({"command": ["vllm", "serve"]}, "serve"),
        ({"command": ["/opt/venv/bin/vllm"], "args": ["serve", "--dtype", "float32"]}, "serve"),
        ({"args": ["vllm", "serve"]}, "serve"),
        ({"command": ["python", "-m", "vllm.entrypoints.openai.api_server"]}, "module"),
        ({"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--port", "8000"]}, "module"),
        ({"command": ["python3.12"], "args": ["-m", "vllm.entrypoints.openai.api_server"]}, "module"),
        ({"command": ["nginx"]}, None),
        ({"command": ["python3", "-m", "http.server"]}, None),
        ({"command": ["sh", "-c", "vllm serve x"]}, None),
        ({}, None),
    ],
)
def test_vllm_form_is_read_from_command_and_args(container: dict[str, Any], form: str | None) -> None:
    assert vllm_form(container) == form


def test_vllm_serve_gets_its_positional_model_and_load_format() -> None:
    out = wired_container(pod({"command": ["vllm", "serve"], "args": ["--enforce-eager"]}))
    assert out["args"] == [MODEL, "--enforce-eager", *STRATA]


def test_vllm_serve_in_args_gets_the_model_right_after_serve() -> None:
    out = wired_container(pod({"command": ["vllm"], "args": ["serve", "--dtype", "float32"]}))
    assert out["args"] == ["serve", MODEL, "--dtype", "float32", *STRATA]


def test_api_server_module_gets_the_model_flag() -> None:
    out = wired_container(pod({"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"]}))
    assert out["args"] == ["--model", MODEL, *STRATA]


def test_flags_the_user_wrote_the_same_are_kept_once() -> None:
    args = ["--model", MODEL, "--load-format=strata"]
    out = wired_container(pod({"command": ["python", "-m", "vllm.entrypoints.openai.api_server"], "args": args}))
    assert out["args"] == args


@pytest.mark.parametrize(
    ("container", "named"),
    [
        ({"command": ["vllm", "serve"], "args": ["facebook/opt-125m"]}, "'facebook/opt-125m'"),
        ({"command": ["python", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--model=/m"]}, "'/m'"),
        ({"command": ["vllm", "serve"], "args": ["--load-format", "auto"]}, "--load-format 'auto'"),
    ],
)
def test_a_different_model_or_format_is_refused_with_the_field_named(container: dict[str, Any], named: str) -> None:
    with pytest.raises(WiringConflict, match=r"spec\.containers\[vllm\].*" + named.replace("(", r"\(")):
        build_pod_patch(pod(container), model_cache=cache())


def test_opt_out_annotation_leaves_the_command_line_alone() -> None:
    container = {"command": ["vllm", "serve"], "args": ["facebook/opt-125m"]}
    p = pod(container, {VLLM_ARGS_ANNOTATION: "false"}, tier_too=True)
    out = wired_container(p, kv_tier=tier({"connector": {"type": "vllm", "engine": "cpu"}}))
    assert out["args"] == ["facebook/opt-125m"]
    assert any(e["name"] == "STRATA_MODEL_DIR" for e in out["env"])  # still mounted and named


def test_other_containers_are_left_alone() -> None:
    p = pod({"command": ["python3", "-m", "http.server"], "args": ["8080"]}, tier_too=True)
    out = wired_container(p, kv_tier=tier({"connector": {"type": "vllm", "engine": "cpu"}}))
    assert out["args"] == ["8080"]


KV_TIER = ["--kv-transfer-config", "$(KV_TRANSFER_CONFIG)", *KV_CPU[2:]]


@pytest.mark.parametrize(
    ("engine", "resources", "kv"),
    [
        ("cpu", {}, KV_TIER),
        ("gpu", {}, KV_TIER),
        ("cpu", {"limits": {"nvidia.com/gpu": "1"}}, KV_GPU),
        ("gpu", {"requests": {"nvidia.com/gpu": 1}}, KV_GPU),
    ],
)
def test_a_gpu_request_picks_the_gpu_config_else_the_tiers_engine_decides(
    engine: str, resources: dict[str, Any], kv: list[str]
) -> None:
    p = pod({"command": ["vllm", "serve"], "resources": resources}, tier_too=True)
    out = wired_container(p, kv_tier=tier({"connector": {"type": "vllm", "engine": engine}}))
    assert out["args"] == [MODEL, *STRATA, *kv]


def test_engine_annotation_wins_over_resources() -> None:
    container = {"command": ["vllm", "serve"], "resources": {"requests": {"nvidia.com/gpu": 1}}}
    p = pod(container, {KV_ENGINE_ANNOTATION: "cpu"}, tier_too=True)
    assert wired_container(p, kv_tier=tier({}))["args"] == [MODEL, *STRATA, *KV_CPU]


def test_kv_args_annotation_false_opts_out_of_kv_flags_only() -> None:
    p = pod({"command": ["vllm", "serve"]}, {KV_ARGS_ANNOTATION: "false"}, tier_too=True)
    assert wired_container(p, kv_tier=tier({}))["args"] == [MODEL, *STRATA]


def test_user_kv_flag_that_differs_is_refused() -> None:
    p = pod({"command": ["vllm", "serve"], "args": ["--kv-transfer-config", "{}"]}, tier_too=True)
    with pytest.raises(WiringConflict, match=r"spec\.containers\[vllm\]\.args already passes --kv-transfer-config"):
        build_pod_patch(p, model_cache=cache(), kv_tier=tier({}))


def test_wiring_twice_changes_nothing() -> None:
    p = pod({"command": ["vllm", "serve"]}, tier_too=True)
    once = apply_patch(p, build_pod_patch(p, model_cache=cache(), kv_tier=tier({})))
    assert build_pod_patch(once, model_cache=cache(), kv_tier=tier({})) == []


def test_requests_gpu_reads_requests_and_limits() -> None:
    assert requests_gpu({"resources": {"requests": {"nvidia.com/gpu": "2"}}})
    assert not requests_gpu({"resources": {"limits": {"cpu": "2"}}})
