"""Byte sizes, one way everywhere: the CRDs' pattern, the operator's models, the loader's contract and the KV
server's config all read `16Mi` through this module, so no two of them can disagree on what a size means.

One parser (`parse_bytes`), one formatter (`format_bytes`) and one type (`ByteSize`): a size is parsed once, where
it enters a pydantic model, into a `ByteSize` (an int that remembers how it was written), and code downstream
does arithmetic on it and never reads the text again. `SizeField` says, per field, what a model accepts and how
it writes the size back out.

Standard library only at import time: the operator, the preloader and the KV server each import it without pulling
in the others (pydantic's hooks import pydantic-core when a model is built, and only then).

A size is a whole number of bytes. Kubernetes' binary (Ki Mi Gi Ti Pi Ei) and decimal (k M G T P E) suffixes are
the spelling the CRDs accept; configuration files and command lines may also write KiB, MiB, GB, ... and B.
Fractions (`1.5Gi`) are refused rather than rounded, and so is `m`: to Kubernetes it means milli, to a human mega.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ALIASES",
    "BYTE_SIZE_PATTERN",
    "BYTE_SIZE_SPELLING",
    "KUBERNETES_UNITS",
    "MAX_BYTES",
    "ByteSize",
    "ByteSizeError",
    "SizeField",
    "format_bytes",
    "parse_bytes",
]

KUBERNETES_UNITS: dict[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
"""The suffixes a Kubernetes quantity allows on a byte count (case matters: `K` and `g` are not among them)."""

ALIASES: dict[str, int] = {"B": 1, **{f"{unit}B": factor for unit, factor in KUBERNETES_UNITS.items()}}
"""Also read in config files and on command lines: B, KiB ... EiB, kB, MB ... EB (never in a CRD)."""

BYTE_SIZE_PATTERN = r"^([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
"""The one pattern every byte-size field of every CRD carries: digits with an optional Kubernetes suffix."""

BYTE_SIZE_SPELLING = (
    "an integer, or an integer followed by Ki, Mi, Gi, Ti, Pi or Ei (powers of 1024) or k, M, G, T, P or E "
    "(powers of 1000), e.g. 16Mi"
)
"""How to write a size, in words: the end of every error message, and of the CRD rules' messages."""

MAX_BYTES = 2**63 - 1
"""The largest count a Kubernetes quantity or an int64 field can hold (8Ei less one byte)."""

_STRICT = re.compile(BYTE_SIZE_PATTERN)
_LENIENT = re.compile(r"\s*([0-9]+)\s*([A-Za-z]*)\s*")
_FRACTION = re.compile(r"\s*([0-9]*)[.]([0-9]+)\s*([A-Za-z]*)\s*")
_MAX_DIGITS = 40
"""Longer digit strings are refused before `int()` reads them (which is slow on huge strings, and bounded)."""


class ByteSizeError(ValueError):
    """A value that is not a usable byte size; the message names it and says what to write instead."""


def parse_bytes(value: object, *, minimum: int = 1, strict: bool = False) -> int:
    """The number of bytes `value` means: an int, or a string such as `16Mi`, `500M` or `4096`.

    `minimum` is the smallest count allowed (1 for sizes that must be positive, 0 where 0 means "no limit" or
    "all of it"). `strict` reads only the CRD's spelling (BYTE_SIZE_PATTERN); otherwise KiB/MB/B aliases and
    spaces around the number and unit are accepted as well.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ByteSizeError(_message(value, minimum, f", not {type(value).__name__}"))
    count = value if isinstance(value, int) else _parse_text(value, minimum, strict)
    if count < minimum:
        raise ByteSizeError(_message(value, minimum, f", not {count}" if count >= 0 else ", not a negative number"))
    if count > MAX_BYTES:
        raise ByteSizeError(_too_large(value))
    return count


def format_bytes(count: int, *, quantity: bool = False, round_up_to: int = 1, approximate: bool = False) -> str:
    """`count` in the largest binary unit that divides it exactly (`1GiB`, `1536KiB`), else as plain bytes; the
    one way a size is written, and `parse_bytes` reads every exact string it returns.

    `quantity` writes Kubernetes' suffix (`1Gi`, for resource requests) instead of a config file's (`1GiB`);
    `round_up_to` first rounds `count` up to a multiple of it (a memory request in whole MiB stays the same text
    when a byte changes); `approximate` writes one decimal in the largest unit below `count` (`1.5GiB`, for
    people: a status column), never read back.
    """
    suffix = "" if quantity else "B"
    if approximate:
        value, unit = float(count), ""
        for unit in _BINARY:
            if value < 1024 or unit == _BINARY[-1]:
                break
            value /= 1024
        return f"{value:.0f}{unit or 'B'}" if unit == "" else f"{value:.1f}{unit}{suffix}"
    count = -(-count // round_up_to) * round_up_to
    for unit in reversed(_BINARY[1:]):
        factor = KUBERNETES_UNITS[unit]
        if count >= factor and count % factor == 0:
            return f"{count // factor}{unit}{suffix}"
    return str(count)


_BINARY = ("", "Ki", "Mi", "Gi", "Ti")
"""The units `format_bytes` writes, smallest first (Pi and Ei never: sizes that large are written in Ti)."""


class ByteSize(int):
    """A whole number of bytes, parsed once, that remembers how it was written.

    It is an `int` in every way code downstream uses one (arithmetic, comparison, `str`, JSON), so nothing after
    the model that made it reads the text again; `spelling` is the value as given (`"4Gi"`, or the int itself),
    so an API object written back, or a message quoting the user, says what the user wrote.
    """

    spelling: int | str

    def __new__(cls, value: object, *, minimum: int = 0, strict: bool = False) -> ByteSize:
        count = parse_bytes(value, minimum=minimum, strict=strict)
        size = super().__new__(cls, count)
        size.spelling = value.spelling if isinstance(value, ByteSize) else value if isinstance(value, str) else count
        return size

    def __repr__(self) -> str:
        return f"ByteSize({self.spelling!r})"

    __str__ = int.__repr__
    """Digits, as an int prints: `str(size)` is what a command line or a JSON number carries."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_byte_size, (self.spelling,))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """A bare `ByteSize` field: read leniently, 0 allowed, written back as given."""
        return SizeField().__get_pydantic_core_schema__(source, handler)


def _byte_size(spelling: int | str) -> ByteSize:
    return ByteSize(spelling, minimum=0)


@dataclass(frozen=True)
class SizeField:
    """How one model's field takes a size: `Annotated[ByteSize, SizeField(minimum=1)]`.

    The field's value is always a `ByteSize`. `strict` reads only the CRD's spelling; `text_only` takes a string
    and never a number (a CRD field of type string); `written` is what serialising writes: `as_given` (the user's
    spelling: an API object round-trips), `formatted` (`format_bytes`: a config file people read) or `count`
    (the int: a machine contract).
    """

    minimum: int = 0
    strict: bool = False
    text_only: bool = False
    written: Literal["as_given", "formatted", "count"] = "as_given"

    def size(self, value: object) -> ByteSize:
        """`value` as this field reads it (an error says what to write). A `ByteSize` is taken as it is unless
        the field is stricter about spelling than whatever made it: then its spelling is read again."""
        if isinstance(value, ByteSize):
            if not (self.strict or self.text_only):
                return value if value >= self.minimum else ByteSize(value, minimum=self.minimum)
            value = value.spelling
        if self.text_only and not isinstance(value, str):
            raise ByteSizeError(_message(value, self.minimum, f" written as a string (e.g. '16Mi'), not {value!r}"))
        return ByteSize(value, minimum=self.minimum, strict=self.strict)

    def write(self, size: int) -> int | str:
        if self.written == "formatted":
            return format_bytes(size)
        if self.written == "as_given" and isinstance(size, ByteSize):
            return size.spelling
        return int(size)

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            self.size,
            serialization=core_schema.plain_serializer_function_ser_schema(self.write, when_used="always"),
        )

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        """A string, or int-or-string: what the field takes (the CRD generator adds its rules to this)."""
        text = {"type": "string", "pattern": BYTE_SIZE_PATTERN if self.strict else None}
        text = {k: v for k, v in text.items() if v is not None}
        return text if self.text_only else {"anyOf": [{"type": "integer", "minimum": self.minimum}, text]}


def _parse_text(text: str, minimum: int, strict: bool) -> int:
    match = (_STRICT if strict else _LENIENT).fullmatch(text)
    factor = _factor(match.group(2) or "") if match else None
    if match is None or factor is None:
        raise ByteSizeError(_why_not(text, minimum))
    digits = match.group(1)
    if len(digits.lstrip("0")) > _MAX_DIGITS:
        raise ByteSizeError(_too_large(text))
    return int(digits) * factor


def _factor(unit: str) -> int | None:
    if unit == "":
        return 1
    return KUBERNETES_UNITS.get(unit) or ALIASES.get(unit)


def _why_not(text: str, minimum: int) -> str:
    """The error for a string that is no size, with the likeliest fix where one can be told."""
    fraction = _FRACTION.fullmatch(text)
    if fraction and _factor(fraction.group(3)):
        return _message(text, minimum, ", not a fraction" + _as_whole(*fraction.groups()))
    lenient = _LENIENT.fullmatch(text)
    unit = lenient.group(2) if lenient else ""
    if unit == "m":
        return _message(text, minimum, " ('m' means milli, a thousandth: for megabytes write M, for mebibytes Mi)")
    if lenient and _factor(unit):
        return _message(text, minimum, " written as Kubernetes writes a quantity (no spaces, no 'B' suffix)")
    if lenient and (similar := [u for u in KUBERNETES_UNITS if u.lower() == unit.lower().removesuffix("b")]):
        return _message(text, minimum, f" (suffixes are case-sensitive: did you mean {' or '.join(similar)}?)")
    if text.strip().startswith("-"):
        return _message(text, minimum, ", not a negative number")
    return _message(text, minimum, "")


def _as_whole(whole: str, decimals: str, unit: str) -> str:
    """`1.5Gi` -> ` (write 1536Mi)`: the same amount in the largest smaller unit of its kind that makes it whole."""
    factor = _factor(unit) or 1
    if len(whole) + len(decimals) > _MAX_DIGITS:
        return ""
    numerator, denominator = int((whole or "0") + decimals) * factor, 10 ** len(decimals)
    if numerator % denominator:
        return ""
    count = numerator // denominator
    binary = factor & (factor - 1) == 0
    for name, size in sorted(KUBERNETES_UNITS.items(), key=lambda item: -item[1]):
        if ("i" in name) == binary and size < factor and count % size == 0:
            return f" (write {count // size}{name})"
    return f" (write {count})"


def _message(value: object, minimum: int, why: str) -> str:
    floor = "" if minimum <= 0 else " above 0" if minimum == 1 else f" of at least {minimum}"
    return f"{_shown(value)} must be a whole number of bytes{floor}{why}: write {BYTE_SIZE_SPELLING}"


def _too_large(value: object) -> str:
    return f"{_shown(value)} is more bytes than a size can hold: at most {MAX_BYTES} (8Ei less one byte)"


def _shown(value: object) -> str:
    """The value as the error names it, cut short: a hostile spec must not make a megabyte of message."""
    text = repr(value)
    return text if len(text) <= 64 else f"{text[:48]}... ({len(text)} characters)"
