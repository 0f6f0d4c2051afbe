"""The relative-path rule: every name that becomes a file under DEST passes `safe_relative_path` or is refused."""

import os
import posixpath
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strata_loader.paths import UnsafePathError, is_within, safe_relative_path

# segments a real model directory has: names, dots inside names, spaces, unicode
segment = st.text(
    st.characters(blacklist_characters="/\\\x00", blacklist_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda s: s not in (".", ".."))
clean = st.lists(segment, min_size=1, max_size=5).map("/".join)


@pytest.mark.parametrize(
    "path",
    ["config.json", "original/consolidated.pth", "a/b/c.d", "..x", "x..", ".hidden", "a/...", "dir with space/ü.bin"],
)
def test_clean_paths_pass_unchanged(path):
    assert safe_relative_path(path) == path


@pytest.mark.parametrize(
    "path,problem",
    [
        ("", "empty"),
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("a/..", "'..'"),
        ("/etc/passwd", "absolute"),
        ("//abs/path", "absolute"),
        ("a//b", "empty segment"),
        ("a/", "empty segment"),
        ("./x", "'.'"),
        ("a/./b", "'.'"),
        (".", "'.'"),
        ("a\\..\\..\\x", "backslash"),
        ("a\x00b", "NUL"),
    ],
)
def test_unsafe_paths_are_refused_with_the_reason(path, problem):
    with pytest.raises(UnsafePathError, match=re.escape(problem)) as e:
        safe_relative_path(path)
    assert repr(path) in str(e.value) and "\n" not in str(e.value)


@given(clean)
def test_every_clean_path_passes_and_stays_under_any_root(path):
    assert safe_relative_path(path) == path
    assert posixpath.normpath(path) == path
    root = "/some/dest"
    assert is_within(posixpath.normpath(posixpath.join(root, path)), root)


@given(st.text(max_size=40))
@example("x/../..")
@example("/x")
@example("x\\y")
def test_whatever_passes_cannot_escape(path):
    """For arbitrary text: anything accepted is normalized, relative, free of NUL/backslash and stays under a
    root when joined lexically; anything else raises (never some other exception)."""
    try:
        safe_relative_path(path)
    except UnsafePathError:
        return
    assert path and not path.startswith("/") and "\x00" not in path and "\\" not in path
    assert posixpath.normpath(path) == path
    assert is_within(posixpath.normpath(posixpath.join("/d", path)), "/d")


@given(clean, st.sampled_from(["..", ".", "", "a\\b", "a\x00b"]), st.data())
def test_one_bad_segment_anywhere_is_refused(path, bad, data):
    segs = path.split("/")
    segs.insert(data.draw(st.integers(0, len(segs))), bad)
    with pytest.raises(UnsafePathError):
        safe_relative_path("/".join(segs))


def test_is_within_compares_components_not_prefixes():
    assert is_within("/data/x", "/data") and is_within("/data", "/data")
    assert not is_within("/data2/x", "/data") and not is_within("/", "/data")
    assert is_within(os.path.join("/", "x"), "/")
