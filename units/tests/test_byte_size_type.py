"""`ByteSize`: parsed once where a size enters a model, an int from then on, and written back as it came in."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Annotated

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from strata_units import MAX_BYTES, ByteSize, ByteSizeError, SizeField, format_bytes, parse_bytes


class Spec(BaseModel):
    """A field of each kind the project has: the API's (as given), a config file's (formatted), a contract's."""

    api: Annotated[ByteSize, SizeField(minimum=1, strict=True, text_only=True)] = ByteSize("4Gi")
    either: Annotated[ByteSize, SizeField(strict=True)] = ByteSize(0)
    config: Annotated[ByteSize, SizeField(written="formatted")] = ByteSize(2**30)
    contract: Annotated[ByteSize, SizeField(minimum=1, written="count")] = ByteSize(16 * 2**20)


def test_a_size_is_an_int_that_keeps_its_spelling() -> None:
    size = ByteSize("4Gi")
    assert size == 4 * 2**30 and isinstance(size, int) and size.spelling == "4Gi"
    assert str(size) == f"{size}" == "4294967296" and json.dumps(size) == "4294967296"
    assert size + 1 == 4 * 2**30 + 1 and type(size + 1) is int
    assert ByteSize(4096).spelling == 4096 and ByteSize(size).spelling == "4Gi"
    for again in (copy.deepcopy(size), pickle.loads(pickle.dumps(size))):
        assert again == size and again.spelling == "4Gi"


def test_each_field_writes_the_size_its_way() -> None:
    spec = Spec.model_validate({"api": "8Gi", "either": 4096, "config": "64Mi", "contract": "1GiB"})
    assert spec.model_dump() == {"api": "8Gi", "either": 4096, "config": "64MiB", "contract": 2**30}
    assert Spec.model_validate(spec.model_dump()) == spec
    assert all(isinstance(v, ByteSize) for v in (spec.api, spec.either, spec.config, spec.contract))
    assert all(isinstance(v, ByteSize) for v in Spec().__dict__.values())


def test_a_parsed_size_passes_into_another_model_without_being_read_again() -> None:
    parsed = Spec.model_validate({"api": "8Gi"}).api
    again = Spec(config=parsed, contract=parsed)
    assert again.config is parsed and again.contract is parsed
    assert again.model_dump()["config"] == "8GiB" and again.model_dump()["contract"] == 8 * 2**30


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("api", 4096, "written as a string"),
        ("api", "0", "above 0"),
        ("api", "4GiB", "as Kubernetes writes a quantity"),
        ("either", "1.5Gi", "not a fraction"),
        ("contract", 0, "above 0"),
        ("contract", ByteSize(0), "above 0"),
        ("config", "lots", "whole number of bytes"),
    ],
)
def test_a_field_refuses_what_it_cannot_read_and_says_why(field: str, value: object, why: str) -> None:
    with pytest.raises(ValidationError, match=why) as info:
        Spec.model_validate({field: value})
    assert info.value.errors()[0]["loc"] == (field,)


def test_a_strict_field_reads_again_a_size_spelled_for_a_config_file() -> None:
    """The API writes its fields back as given: a spelling the CRD refuses must not slip in through a ByteSize."""
    with pytest.raises(ValidationError, match="as Kubernetes writes a quantity"):
        Spec(api=ByteSize("4GiB"))


@pytest.mark.parametrize(
    ("count", "config", "quantity", "people"),
    [
        (0, "0", "0", "0B"),
        (512, "512", "1Mi", "512B"),
        (1536, "1536", "1Mi", "1.5KiB"),
        (2**30, "1GiB", "1Gi", "1.0GiB"),
        (4097 * 2**20, "4097MiB", "4097Mi", "4.0GiB"),
        (3 * 2**40, "3TiB", "3Ti", "3.0TiB"),
        (2**50, "1024TiB", "1024Ti", "1024.0TiB"),
    ],
)
def test_one_formatter_writes_configs_quantities_and_status_columns(
    count: int, config: str, quantity: str, people: str
) -> None:
    assert format_bytes(count) == config
    assert format_bytes(count, quantity=True, round_up_to=2**20) == quantity
    assert format_bytes(count, approximate=True) == people


@given(st.integers(0, MAX_BYTES - 2**20), st.sampled_from([1, 2**20]))
def test_a_quantity_reads_back_as_at_least_the_count(count: int, granule: int) -> None:
    text = format_bytes(count, quantity=True, round_up_to=granule)
    assert count <= parse_bytes(text, minimum=0, strict=True) < count + granule


def test_a_size_error_names_the_value() -> None:
    with pytest.raises(ByteSizeError, match="'4 gigs'"):
        ByteSize("4 gigs")
