"""The header parser accepts what safetensors writes, rejects hostile files with a named error, and never fails
any other way (fuzzed with hypothesis, differential against the reference implementation)."""

import contextlib
import json
import struct
from pathlib import Path

import pytest
import safetensors
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save
from strata_loader.core.format import DTYPE_BITS, SafetensorsError, parse_file_bytes

CORPUS = Path(__file__).parent.parent / "corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_corpus_file_is_rejected_with_named_problem(name):
    with pytest.raises(SafetensorsError) as err:
        parse_file_bytes((CORPUS / name).read_bytes())
    assert EXPECTED[name] in str(err.value)


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - {"duplicate_tensor.safetensors"}))
def test_reference_rejects_the_corpus_too(name):
    """Every corpus case is invalid for the reference as well: we are never stricter by accident."""
    with pytest.raises(Exception):  # noqa: B017 -- the reference raises its own error types
        safetensors.deserialize((CORPUS / name).read_bytes())


def test_duplicates_are_the_one_deliberate_extra_strictness():
    """The reference lets the last duplicate win, silently dropping a tensor; we refuse the file."""
    blob = (CORPUS / "duplicate_tensor.safetensors").read_bytes()
    assert len(safetensors.deserialize(blob)) == 1
    with pytest.raises(SafetensorsError, match="duplicate"):
        parse_file_bytes(blob)


def test_written_file_round_trips_with_metadata_order_and_padding():
    blob = save(
        {"b": torch.zeros(3, dtype=torch.bfloat16), "a": torch.ones(2, 2), "e": torch.zeros(0, 4)},
        metadata={"format": "pt"},
    )
    h = parse_file_bytes(blob)
    assert h.metadata == {"format": "pt"}
    assert {t.name: t.shape for t in h.tensors} == {"a": (2, 2), "b": (3,), "e": (0, 4)}
    assert [t.start for t in h.tensors] == sorted(t.start for t in h.tensors)
    assert h.data_offset + h.tensors[-1].end == len(blob)


tensor_entries = st.dictionaries(
    st.text(min_size=1, max_size=8).filter(lambda s: s != "__metadata__"),
    st.tuples(st.sampled_from(sorted(DTYPE_BITS)), st.lists(st.integers(0, 6), max_size=3)),
    max_size=5,
)


def _layout(entries, shuffle, jitter):
    header, pos = {}, 0
    for name, (dtype, shape) in entries.items():
        n = 1
        for d in shape:
            n *= d
        nbytes = (n * DTYPE_BITS[dtype] + 7) // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    if shuffle:
        header = dict(reversed(list(header.items())))
    return header, pos + jitter


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(entries=tensor_entries, shuffle=st.booleans(), jitter=st.sampled_from([0, 0, 0, -1, 1]), pad=st.integers(0, 7))
def test_agrees_with_reference_on_structured_headers(entries, shuffle, jitter, pad):
    header, data_len = _layout(entries, shuffle, jitter)
    h = json.dumps(header).encode() + b" " * pad
    blob = struct.pack("<Q", len(h)) + h + b"\x00" * max(0, data_len)
    try:
        safetensors.deserialize(blob)
        ref_ok = True
    except Exception:
        ref_ok = False
    try:
        parse_file_bytes(blob)
        ours_ok = True
    except SafetensorsError:
        ours_ok = False
    assert ours_ok == ref_ok, (header, data_len)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_fail_only_with_safetensors_error(blob):
    with contextlib.suppress(SafetensorsError):
        parse_file_bytes(blob)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pos=st.integers(0, 10_000), byte=st.integers(0, 255), cut=st.integers(0, 10_000))
def test_mutated_real_file_fails_only_with_safetensors_error(pos, byte, cut):
    blob = bytearray(save({"w": torch.arange(6, dtype=torch.float16).reshape(2, 3), "s": torch.tensor(1)}))
    blob[pos % len(blob)] = byte
    blob = blob[: len(blob) - cut % 16]
    with contextlib.suppress(SafetensorsError):
        parse_file_bytes(bytes(blob))


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=12,
    )
)
def test_arbitrary_json_headers_fail_only_with_safetensors_error(value):
    h = json.dumps(value).encode()
    with contextlib.suppress(SafetensorsError):
        parse_file_bytes(struct.pack("<Q", len(h)) + h)
