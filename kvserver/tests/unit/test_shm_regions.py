"""The start-up sweep of vLLM primary-tier files: only files no live process maps or holds open are removed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from strata_kv.vllm.shm_regions import hold_region, region_is_locked, region_path, remove_orphaned_regions

HOLDER = """
import mmap, os, sys
path, how = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
if how == "lock":
    import fcntl
    fcntl.flock(fd, fcntl.LOCK_SH)
if how == "map":
    region = mmap.mmap(fd, 4096)
    os.close(fd)  # only the mapping keeps it now
print("ready", flush=True)
sys.stdin.read()
"""


def region(shm: Path, engine_id: str) -> Path:
    path = region_path(engine_id, shm)
    path.write_bytes(b"\0" * 4096)
    return path


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=30)


def hold(holders: list[subprocess.Popen[str]], path: Path, how: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), how], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    holders.append(process)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"


def test_only_regions_no_live_process_maps_or_holds_are_removed(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    orphan = region(tmp_path, "killed-engine")
    mapped = region(tmp_path, "live-engine")
    opened = region(tmp_path, "starting-engine")
    other = tmp_path / "someone-elses.mmap"
    other.write_bytes(b"x")
    hold(holders, mapped, "map")
    hold(holders, opened, "open")

    assert remove_orphaned_regions(tmp_path) == [orphan]
    assert not orphan.exists()
    assert mapped.exists() and opened.exists() and other.exists()


def test_a_missing_directory_removes_nothing(tmp_path: Path) -> None:
    assert remove_orphaned_regions(tmp_path / "absent") == []


def test_a_region_is_locked_while_a_process_holds_its_lock(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    """Strata's worker locks its region from the moment it maps it, which protects it even from a sweep that
    cannot inspect the worker's process (root on a host with other users' namespaces)."""
    locked = region(tmp_path, "strata-engine")
    assert not region_is_locked(locked)
    hold(holders, locked, "lock")
    assert region_is_locked(locked)
    fd = hold_region(locked)  # a second shared holder is fine
    os.close(fd)
