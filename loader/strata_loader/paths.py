"""The one rule for relative paths: what an S3 key, a directory entry, a glob or a manifest entry may look like
before it is joined onto DEST.

A fetch turns names chosen by whoever filled the source into files under DEST. A name with `..`, a leading
`/` or `//`, a `.` segment, a backslash or a NUL either escapes DEST or means something else on another
filesystem, so it is refused, never "cleaned": a cleaned name could silently alias another file.
"""

from __future__ import annotations

import os


class UnsafePathError(ValueError):
    """A relative path that could land outside the directory it is joined to."""


def path_problem(path: str) -> str | None:
    """Why `path` is not a clean relative POSIX path, or None when it is one.

    Clean means: one or more non-empty segments joined by single `/`, none of them `.` or `..`, and no NUL or
    backslash anywhere. Such a path is its own `normpath` and, joined onto any directory, stays under it as
    long as nothing inside that directory is a symlink (the writer checks that separately).
    """
    if not path:
        return "is empty"
    if "\x00" in path:
        return "contains a NUL byte"
    if "\\" in path:
        return "contains a backslash"
    if path.startswith("/"):
        return "is absolute"
    segments = path.split("/")
    if "" in segments:
        return "has an empty segment ('//' or a trailing '/')"
    if ".." in segments:
        return "has a '..' segment"
    if "." in segments:
        return "has a '.' segment"
    return None


def safe_relative_path(path: str) -> str:
    """`path` unchanged when it is clean (see `path_problem`); otherwise `UnsafePathError` naming it."""
    problem = path_problem(path)
    if problem is not None:
        raise UnsafePathError(f"{path!r} {problem}")
    return path


def is_within(path: str, root: str) -> bool:
    """Whether the absolute, already-resolved `path` is `root` or below it (component-wise, not by prefix:
    `/data2` is not within `/data`)."""
    return os.path.commonpath([path, root]) == root
