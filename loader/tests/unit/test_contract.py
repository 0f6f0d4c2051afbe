"""The fetch contract round-trips and its result always fits a Kubernetes termination message."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from strata_loader.contract import (
    TERMINATION_MESSAGE_LIMIT,
    FetchRequest,
    FetchResult,
    ShardOptions,
    VerifyMode,
)


def test_args_round_trip_with_every_option():
    req = FetchRequest(
        source="s3://models/llama-3/8b",
        dest="/models/llama",
        revision="abc123",
        include=["*.safetensors", "*.json"],
        exclude=["original/*"],
        concurrency=32,
        block_size="8Mi",
        memory_limit="2Gi",
        verify=VerifyMode.CHECKSUMS,
        shard=ShardOptions(tensor_parallel_size=4, max_part_bytes="1Gi"),
    )
    args = req.to_args()
    assert args[:3] == ["fetch", "s3://models/llama-3/8b", "/models/llama"]
    assert FetchRequest.parse_args(args) == req
    assert req.block_size == 8 * 2**20


def test_values_that_start_with_a_dash_stay_values():
    """A revision or glob like `-rc1` must not become a flag of its own in the Job's args."""
    req = FetchRequest(source="s3://models/m", dest="/d", revision="-rc1", include=["-x*"], exclude=["-y*"])
    assert FetchRequest.parse_args(req.to_args()) == req


def test_defaults_round_trip():
    req = FetchRequest(source="hf://org/name", dest="/d")
    assert FetchRequest.parse_args(req.to_args()) == req


@pytest.mark.parametrize(
    "source",
    ["ftp://x/y", "relative/path", "s3://", "s3://UPPER/x", "hf://only-org", "pvc://"],
)
def test_bad_sources_are_rejected(source):
    with pytest.raises(ValidationError):
        FetchRequest(source=source, dest="/d")


def test_bad_args_raise_instead_of_exiting():
    with pytest.raises(ValueError, match="invalid fetch arguments"):
        FetchRequest.parse_args(["fetch", "/a"])


@pytest.mark.parametrize("text,expected", [("16Mi", 16 * 2**20), ("1Gi", 2**30), ("500M", 500 * 10**6), (7, 7)])
def test_quantities(text, expected):
    size = ShardOptions(tensor_parallel_size=1, max_part_bytes=text).max_part_bytes
    assert size == expected and size.spelling == text


@pytest.mark.parametrize("bad", ["", "1Xi", "-1", 0, "1.5Gi", True, "500m", "1g", 1.0])
def test_bad_quantities(bad):
    with pytest.raises(ValueError):
        ShardOptions(tensor_parallel_size=1, max_part_bytes=bad)


@given(
    n=st.integers(0, 3000),
    name_len=st.integers(1, 200),
    error=st.one_of(st.none(), st.text(max_size=20000)),
)
def test_termination_message_always_fits_and_parses(n, name_len, error):
    checksums = {("f" * name_len) + str(i): "sha256:" + "0" * 64 for i in range(n)}
    res = FetchResult(
        status="Failed" if error else "Succeeded",
        error=error,
        source="s3://b/p",
        bytes=123,
        files=n,
        checksums=checksums,
        manifest_sha256="sha256:" + "1" * 64,
    )
    text = res.to_termination_message()
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = FetchResult.from_termination_message(text)
    assert back.files == n and back.bytes == 123
    assert len(back.checksums) + back.checksums_omitted == n
    if back.checksums:
        assert back.checksums == checksums


def test_garbage_termination_message_is_a_failure():
    res = FetchResult.from_termination_message("Traceback (most recent call last): ...")
    assert not res.succeeded
    assert "Traceback" in (res.error or "")


@pytest.mark.parametrize("glob", ["../*", "a/../b", "/etc/*", "//x", "a\\*", "*\x00", "./x", "a//b", ""])
@pytest.mark.parametrize("field", ["include", "exclude"])
def test_globs_that_break_the_path_rule_are_refused(field, glob):
    with pytest.raises(ValidationError, match="glob"):
        FetchRequest(source="s3://bucket/p", dest="/d", **{field: ["*.json", glob]})
    with pytest.raises(ValueError, match="glob"):
        FetchRequest.parse_args(["fetch", "s3://bucket/p", "/d", f"--{field}", glob])


@pytest.mark.parametrize("glob", ["*.safetensors", "original/*", "model-0000?-of-*.safetensors", "[!.]*", "**/x"])
def test_ordinary_globs_are_accepted(glob):
    assert FetchRequest(source="s3://bucket/p", dest="/d", include=[glob], exclude=[glob]).include == [glob]


@pytest.mark.parametrize(
    "source",
    ["pvc://claim/../other-claim", "pvc://claim/a/../../x", "pvc://claim//abs", "pvc://claim/./x", "pvc://claim/a\\b"],
)
def test_pvc_paths_that_climb_out_of_the_claim_are_refused(source):
    with pytest.raises(ValidationError, match="inside the claim"):
        FetchRequest(source=source, dest="/d")


@pytest.mark.parametrize("source", ["pvc://claim", "pvc://claim/", "pvc://claim/llama", "pvc://claim/a/b/"])
def test_plain_pvc_paths_are_accepted(source):
    assert FetchRequest(source=source, dest="/d").source == source


@pytest.mark.parametrize("subdir", ["../out", "/abs", "a/./b", "a//b", "", "a\\b"])
def test_shard_output_subdir_follows_the_path_rule(subdir):
    with pytest.raises(ValidationError, match="output_subdir"):
        ShardOptions(tensor_parallel_size=2, output_subdir=subdir)
