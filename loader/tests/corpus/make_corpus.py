"""Regenerates the hostile-header corpus: `python loader/tests/corpus/make_corpus.py`.

Each case is a whole file (`<name>.safetensors`) and `expected.json` maps it to a fragment of the error the
parser must give. Cases found by fuzzing are added here so they stay fixed.
"""

import json
import struct
from pathlib import Path

HERE = Path(__file__).parent


def file(header: object, data: bytes = b"", raw_header: bytes | None = None, length: int | None = None) -> bytes:
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
CASES: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "too small"),
    "short_prefix": (b"\x01\x00\x00", "too small"),
    "header_len_huge": (struct.pack("<Q", 2**63) + b"{}", "exceeds the 100000000-byte limit"),
    "header_len_past_eof": (file({}, length=1000), "exceeds the file"),
    "header_not_utf8": (file(None, raw_header=b'{"\xff\xfe": 1}'), "not valid UTF-8"),
    "header_not_object": (file([1, 2]), "does not start with '{'"),
    "header_bad_json": (file(None, raw_header=b'{"a": '), "not valid JSON"),
    "header_nan": (file(None, raw_header=b'{"a": NaN}'), "non-JSON number"),
    "duplicate_tensor": (
        file(
            None,
            raw_header=json.dumps(T).join([b'{"a": '.decode(), ', "a": ' + json.dumps(T) + "}"]).encode(),
            data=b"\0" * 8,
        ),
        "duplicate key",
    ),
    "metadata_not_strings": (file({"__metadata__": {"k": 1}}), "must be a string"),
    "metadata_not_object": (file({"__metadata__": [1]}), "must be an object"),
    "unknown_dtype": (file({"a": {**T, "dtype": "F128"}}, b"\0" * 8), "unknown dtype"),
    "negative_shape": (file({"a": {**T, "shape": [-2]}}, b"\0" * 8), "non-negative integers"),
    "float_shape": (file({"a": {**T, "shape": [2.0]}}, b"\0" * 8), "non-negative integers"),
    "bool_offsets": (file({"a": {**T, "data_offsets": [False, 8]}}, b"\0" * 8), "two non-negative integers"),
    "three_offsets": (file({"a": {**T, "data_offsets": [0, 8, 9]}}, b"\0" * 8), "two non-negative integers"),
    "missing_dtype": (file({"a": {"shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8), "missing 'dtype'"),
    "end_before_start": (file({"a": {**T, "data_offsets": [8, 0]}}, b"\0" * 8), "before start"),
    "size_mismatch": (file({"a": {**T, "shape": [3]}}, b"\0" * 8), "needs 12 bytes"),
    "gap_at_start": (file({"a": {**T, "data_offsets": [4, 12]}}, b"\0" * 12), "leaves a gap"),
    "overlap": (file({"a": T, "b": {**T, "data_offsets": [4, 12]}}, b"\0" * 12), "overlaps"),
    "truncated_data": (file({"a": T}, b"\0" * 4), "truncated"),
    "trailing_bytes": (file({"a": T}, b"\0" * 9), "trailing bytes"),
    "huge_shape_product": (
        file({"a": {"dtype": "U8", "shape": [2**32, 2**32, 2**32], "data_offsets": [0, 0]}}),
        "more than 2**64 elements",
    ),
    "offset_past_u64": (file({"a": {**T, "data_offsets": [2**64, 2**64 + 8]}}), "two non-negative integers"),
    "sub_byte_misaligned": (
        file({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0" * 2),
        "not a whole number of bytes",
    ),
    "entry_not_object": (file({"a": 5}), "entry must be an object"),
    "deep_nesting": (file(None, raw_header=b"{" + b'"a":[' * 100000 + b"]" * 100000 + b"}"), "not valid JSON"),
}


def main() -> None:
    expected = {}
    for name, (blob, fragment) in CASES.items():
        (HERE / f"{name}.safetensors").write_bytes(blob)
        expected[f"{name}.safetensors"] = fragment
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
