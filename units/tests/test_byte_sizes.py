"""The one byte-size parser: what it reads, what it refuses (and says), and that it agrees with the CRD pattern
and with Kubernetes' own reading of a quantity wherever both accept a value."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity
from strata_units import BYTE_SIZE_PATTERN, MAX_BYTES, ByteSizeError, format_bytes, parse_bytes
from strata_units import KUBERNETES_UNITS as UNITS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16Mi", 16 * 2**20),
        ("1Gi", 2**30),
        ("500M", 500 * 10**6),
        ("1k", 1000),
        ("2Pi", 2 * 2**50),
        ("1Ei", 2**60),
        ("3E", 3 * 10**18),
        ("016Mi", 16 * 2**20),
        ("4096", 4096),
        (4096, 4096),
        ("7Ei", 7 * 2**60),
    ],
)
def test_kubernetes_spellings_are_read_strictly_and_leniently(text: str | int, expected: int) -> None:
    assert parse_bytes(text, strict=True) == expected
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1GiB", 2**30), ("64MiB", 64 * 2**20), ("512KiB", 512 * 1024), ("2GB", 2 * 10**9), ("1kB", 1000),
     ("3MB", 3 * 10**6), ("512B", 512), (" 2 KiB ", 2048), ("16 Mi", 16 * 2**20), ("16Mi\n", 16 * 2**20)],
)  # fmt: skip
def test_config_and_command_line_spellings_are_read_only_when_not_strict(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected
    with pytest.raises(ByteSizeError, match="as Kubernetes writes a quantity"):
        parse_bytes(text, strict=True)


HOSTILE: list[object] = [
    "1.5Gi", "500m", "0.5", ".5Gi", "1.Gi", "1e3", "1E3x", "-1", "-1Gi", "+5", "1_000", "0x10", "1,000", "Mi", "",
    " ", "1K", "1g", "16mi", "1Gib", "1 gigabyte", "1Gi1", "1GiGi", "Gi1", "\x00", "1\x00", "16Mi\x00",
    "\u0661\u0662", "\uff11\uff16Mi", "1\u200bGi", "1Gi;rm -rf /", "9" * 100_000, "1" * 41 + "Ei",
    True, False, 1.0, float("nan"), float("inf"), None, b"16Mi", ["16Mi"], {"size": 1}, Decimal("1"), -1, -(2**70),
]  # fmt: skip


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:40])
def test_hostile_values_are_refused_with_the_value_and_what_to_write(value: object) -> None:
    for strict in (True, False):
        with pytest.raises(ByteSizeError) as info:
            parse_bytes(value, strict=strict)
        message = str(info.value)
        assert repr(value)[:30] in message
        assert "write" in message or "at most" in message


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("1.5Gi", "not a fraction (write 1536Mi)"),
        ("1.5T", "not a fraction (write 1500G)"),
        ("0.5Ki", "not a fraction (write 512)"),
        ("500m", "'m' means milli"),
        ("1K", "did you mean k?"),
        ("1gb", "did you mean G?"),
        ("-3", "not a negative number"),
        (-3, "not a negative number"),
        (0, "above 0, not 0"),
        ("0Gi", "above 0, not 0"),
        (True, "not bool"),
        (1.0, "not float"),
    ],
)
def test_errors_say_what_to_write_instead(value: object, hint: str) -> None:
    with pytest.raises(ByteSizeError, match=re.escape(hint)):
        parse_bytes(value, strict=True)


def test_zero_is_a_size_where_the_minimum_allows_it() -> None:
    assert parse_bytes("0", minimum=0) == parse_bytes(0, minimum=0) == parse_bytes("0Gi", minimum=0) == 0
    with pytest.raises(ByteSizeError, match="not a negative number"):
        parse_bytes(-1, minimum=0)


def test_sizes_beyond_what_an_int64_holds_are_refused() -> None:
    assert parse_bytes(MAX_BYTES) == MAX_BYTES
    for value in ("8Ei", "9223372036854775808", MAX_BYTES + 1, "99999E"):
        with pytest.raises(ByteSizeError, match="at most 9223372036854775807"):
            parse_bytes(value)


def test_a_size_error_is_a_value_error() -> None:
    """pydantic turns a ValueError raised in a validator into a ValidationError naming the field."""
    assert issubclass(ByteSizeError, ValueError)


@given(st.integers(0, 2**20), st.sampled_from(sorted(UNITS)))
def test_every_kubernetes_suffix_multiplies_like_kubernetes_reads_it(count: int, unit: str) -> None:
    text = f"{count}{unit}"
    expected = int(parse_quantity(text))
    assert count * UNITS[unit] == expected
    if expected <= MAX_BYTES:
        assert parse_bytes(text, minimum=0, strict=True) == expected


@given(st.text(alphabet="0123456789.-+ eEKMGTPikmgB\n\t", max_size=12))
def test_strict_reading_accepts_exactly_what_the_crd_pattern_accepts(text: str) -> None:
    try:
        count = parse_bytes(text, minimum=0, strict=True)
    except ByteSizeError:
        count = None
    matches = re.fullmatch(BYTE_SIZE_PATTERN, text) is not None
    assert (count is not None) == (matches and int(parse_quantity(text)) <= MAX_BYTES)
    if count is not None:
        assert count == parse_quantity(text)


@given(st.text(max_size=30) | st.binary(max_size=10) | st.integers() | st.floats() | st.none())
def test_nothing_escapes_but_a_size_error(value: object) -> None:
    try:
        count = parse_bytes(value, minimum=0)
    except ByteSizeError:
        return
    assert isinstance(count, int) and 0 <= count <= MAX_BYTES


@given(st.integers(0, MAX_BYTES))
def test_what_format_writes_parse_reads_back(count: int) -> None:
    assert parse_bytes(format_bytes(count), minimum=0) == count
