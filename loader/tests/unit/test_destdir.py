"""`DestDir` reaches files under DEST without ever following a link inside it."""

import os

import pytest
from strata_loader.paths import DestDir, UnsafePathError


def test_creates_parents_and_writes_inside(tmp_path):
    with DestDir(tmp_path) as d:
        fd = d.open("a/b/c.txt", os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"hi")
        os.close(fd)
        assert d.regular_size("a/b/c.txt") == 2
        d.replace("a/b/c.txt", "a/d.txt")
    assert (tmp_path / "a" / "d.txt").read_bytes() == b"hi"


@pytest.mark.parametrize("rel", ["../x", "/abs", "a//b", "a/./b", "a\\b"])
def test_unsafe_relative_paths_are_refused(tmp_path, rel):
    (tmp_path / "d").mkdir()
    with DestDir(tmp_path / "d") as d, pytest.raises(UnsafePathError):
        d.open(rel, os.O_WRONLY | os.O_CREAT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_links_are_refused_at_every_level_and_never_followed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "f").write_text("keep")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "dir").symlink_to(out)
    (dest / "file").symlink_to(out / "f")
    with DestDir(dest) as d:
        for rel in ("dir/new", "dir/f"):
            with pytest.raises(UnsafePathError, match="dir is a symlink"):
                d.open(rel, os.O_WRONLY | os.O_CREAT)
        with pytest.raises(UnsafePathError, match="file is a symlink"):
            d.open("file", os.O_WRONLY | os.O_TRUNC)
        with pytest.raises(UnsafePathError, match="file is a symlink"):
            d.open("file", os.O_RDONLY)
        assert d.regular_size("file") is None and d.lstat("missing/x") is None
        d.unlink("file")  # removes the link, not its target
    assert sorted(p.name for p in out.iterdir()) == ["f"] and (out / "f").read_text() == "keep"
    assert not os.path.lexists(dest / "file")


def test_a_file_where_a_directory_should_be_is_refused(tmp_path):
    (tmp_path / "a").write_text("")
    with DestDir(tmp_path) as d, pytest.raises(UnsafePathError, match="a is not a directory"):
        d.open("a/b", os.O_WRONLY | os.O_CREAT)
