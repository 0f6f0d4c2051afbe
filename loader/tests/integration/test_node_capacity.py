"""The node budget on a real, small filesystem (a 64 MiB tmpfs): `strata-loader fetch` run as the preload Job runs
it (a process, the budget in STRATA_NODE_CAPACITY, the result in the termination message) evicts the least
recently used copy it was offered only as far as needed, never one a reader holds, never through a symlink, and
fails with InsufficientStorage and numbers when nothing may go. Usage figures are checked against `os.statvfs`
and `df`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from strata_loader.capacity import EXIT_INSUFFICIENT_STORAGE, CapacityRequest
from strata_loader.contract import MANIFEST_NAME, FetchRequest, FetchResult

from .test_fetch_local import make_model, run_cli, tmpfs

pytestmark = pytest.mark.integration

MiB = 2**20
NS = "team"


def make_files(root: Path, size: int) -> Path:
    """A model directory of `size` bytes in three files (random: tmpfs stores every byte)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text("{}")
    rest = size - 2
    (root / "model-00001-of-00002.safetensors").write_bytes(os.urandom(rest // 2))
    (root / "model-00002-of-00002.safetensors").write_bytes(os.urandom(rest - rest // 2))
    return root


@pytest.fixture
def node(tmp_path):
    with tmpfs(tmp_path / "node", "64m") as root:
        yield root


@pytest.fixture
def sources(tmp_path):
    def make(name: str, size: int) -> Path:
        return make_files(tmp_path / "src" / name, size)

    return make


def fetch_cli(
    node: Path, source: Path, name: str, tmp_path: Path, ns: str = NS, **budget
) -> tuple[int, FetchResult, str]:
    term = tmp_path / f"termination-{ns}-{name}"
    req = FetchRequest(source=str(source), dest=str(node / ns / name))
    env = {"STRATA_TERMINATION_MESSAGE_PATH": str(term), **req.to_env()}
    if budget:
        env.update(CapacityRequest(root=str(node), policy="nvme", **budget).to_env())
    r = run_cli(*req.to_args(), env=env)
    return r.returncode, FetchResult.from_termination_message(term.read_text()), r.stderr


def statvfs_numbers(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize


def df_numbers(path: Path) -> tuple[int, int]:
    """df's Used and Avail columns, in bytes (coreutils df, 1-byte blocks)."""
    out = subprocess.run(["df", "-B1", "--output=used,avail", str(path)], capture_output=True, text=True, check=True)
    used, avail = out.stdout.splitlines()[1].split()
    return int(used), int(avail)


def copies(node: Path) -> set[str]:
    return {p.name for p in (node / NS).iterdir() if (p / MANIFEST_NAME).is_file()}


def test_lru_unused_copy_is_evicted_pinned_one_kept_and_numbers_match_df(node, sources, tmp_path):
    # 64 MiB: two 24 MiB copies fit under the high watermark (80% = 51.2 MiB), a third does not.
    for name in ("pinned", "unused"):
        rc, res, err = fetch_cli(node, sources(name, 24 * MiB), name, tmp_path)
        assert rc == 0, err
    rc, res, err = fetch_cli(
        node,
        sources("new", 24 * MiB),
        "new",
        tmp_path,
        high_watermark=80,
        low_watermark=60,
        candidates=[f"{NS}/unused"],
        protected=[f"{NS}/pinned (pinned)"],
    )
    assert rc == 0, err
    assert copies(node) == {"pinned", "new"}
    assert not (node / NS / "unused").exists()
    cap = res.capacity
    assert cap is not None and [e.copy_key for e in cap.evicted] == [f"{NS}/unused"]
    assert cap.evicted[0].bytes >= 24 * MiB
    assert (cap.used_bytes, cap.free_bytes) == statvfs_numbers(node) == df_numbers(node)
    assert cap.size_bytes == 64 * MiB and cap.high_bytes == 64 * MiB * 80 // 100
    assert not list((node / ".strata-evicting").iterdir()) and not list((node / ".strata-reservations").iterdir())


def test_eviction_stops_at_the_low_watermark(node, sources, tmp_path):
    for name, size in (("old", 16 * MiB), ("newer", 8 * MiB), ("big", 24 * MiB)):
        assert fetch_cli(node, sources(name, size), name, tmp_path)[0] == 0
    # 48 MiB used + 8 needed > 80%; evicting "old" leaves 32 + 8 <= 70%, so "newer" stays.
    rc, res, err = fetch_cli(
        node,
        sources("next", 8 * MiB),
        "next",
        tmp_path,
        high_watermark=80,
        low_watermark=70,
        candidates=[f"{NS}/old", f"{NS}/newer"],
    )
    assert rc == 0, err
    assert copies(node) == {"newer", "big", "next"}
    assert res.capacity is not None and [e.copy_key for e in res.capacity.evicted] == [f"{NS}/old"]


def test_min_free_is_the_tighter_limit_and_forces_eviction(node, sources, tmp_path):
    assert fetch_cli(node, sources("a", 16 * MiB), "a", tmp_path)[0] == 0
    # 16 + 16 MiB is well under 90% of 64 MiB, but 40 MiB must stay free: only 24 MiB may be used
    rc, res, err = fetch_cli(
        node,
        sources("b", 16 * MiB),
        "b",
        tmp_path,
        high_watermark=90,
        low_watermark=50,
        min_free_bytes=40 * MiB,
        candidates=[f"{NS}/a"],
    )
    assert rc == 0, err
    assert copies(node) == {"b"}
    assert res.capacity is not None and res.capacity.high_bytes == 24 * MiB
    assert res.capacity.free_bytes >= 40 * MiB


def test_a_copy_that_fits_evicts_nothing(node, sources, tmp_path):
    assert fetch_cli(node, sources("a", 8 * MiB), "a", tmp_path)[0] == 0
    source_b = sources("b", 8 * MiB)
    rc, res, _ = fetch_cli(node, source_b, "b", tmp_path, high_watermark=90, low_watermark=50, candidates=[f"{NS}/a"])
    assert rc == 0 and copies(node) == {"a", "b"}
    assert res.capacity is not None and res.capacity.evicted == []
    assert (res.capacity.used_bytes, res.capacity.free_bytes) == statvfs_numbers(node)
    # a re-run over the complete copy (a retried pod) copies nothing, evicts nothing, and still reports usage
    rc, res, _ = fetch_cli(node, source_b, "b", tmp_path, high_watermark=10, low_watermark=5, candidates=[f"{NS}/a"])
    assert rc == 0 and copies(node) == {"a", "b"} and res.bytes_resumed == res.bytes
    assert res.capacity is not None and res.capacity.evicted == []
    assert (res.capacity.used_bytes, res.capacity.free_bytes) == statvfs_numbers(node)


HOLDER = """
import sys
from strata_loader.core.copy_lock import hold_copy
with hold_copy(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


READER = """
import sys
from pathlib import Path
from strata_loader import iter_tensors
files = sorted(Path(sys.argv[1]).glob("*.safetensors"))
tensors = iter_tensors(files)
next(tensors)  # reading: the first tensor is in, the rest not yet
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("reader", [HOLDER, READER], ids=["hold_copy", "iter_tensors"])
def test_a_copy_a_reader_holds_is_kept_even_when_offered(node, sources, tmp_path, reader):
    """A pod that started using the copy after the operator planned: its reader's lock keeps the copy, whether it
    takes the lock itself or reads through strata_loader's streaming API (which takes it)."""
    make_model(tmp_path / "src" / "consumed", big=24 * MiB)
    assert fetch_cli(node, tmp_path / "src" / "consumed", "consumed", tmp_path)[0] == 0
    assert fetch_cli(node, sources("unused", 24 * MiB), "unused", tmp_path)[0] == 0
    holder = subprocess.Popen(
        [sys.executable, "-c", reader, str(node / NS / "consumed")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        rc, res, err = fetch_cli(
            node,
            sources("new", 24 * MiB),
            "new",
            tmp_path,
            high_watermark=80,
            low_watermark=60,
            candidates=[f"{NS}/consumed", f"{NS}/unused"],
        )
    finally:
        holder.communicate("\n", timeout=30)
    assert rc == 0, err
    assert copies(node) == {"consumed", "new"}
    assert res.capacity is not None and [e.copy_key for e in res.capacity.evicted] == [f"{NS}/unused"]


def test_nothing_evictable_is_insufficient_storage_with_numbers(node, sources, tmp_path):
    for name in ("pinned", "consumed"):
        assert fetch_cli(node, sources(name, 24 * MiB), name, tmp_path)[0] == 0
    used_before, free_before = statvfs_numbers(node)
    rc, res, err = fetch_cli(
        node,
        sources("new", 24 * MiB),
        "new",
        tmp_path,
        high_watermark=80,
        low_watermark=60,
        protected=[f"{NS}/pinned (pinned)", f"{NS}/consumed (consumed by 1 pod on this node)"],
    )
    assert rc == EXIT_INSUFFICIENT_STORAGE, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert res.status == "Failed" and res.reason == "InsufficientStorage"
    assert res.error is not None
    needed = 24 * MiB
    for number in (needed, free_before, used_before + free_before, used_before):
        assert str(number) in res.error, res.error
    assert "team/pinned (pinned)" in res.error and "team/consumed (consumed by 1 pod" in res.error
    assert copies(node) == {"pinned", "consumed"}
    assert statvfs_numbers(node) == (used_before, free_before)  # not a byte of the new copy was written
    assert res.capacity is not None and (res.capacity.used_bytes, res.capacity.free_bytes) == (used_before, free_before)


def test_symlinks_incomplete_copies_and_names_outside_the_root_are_never_evicted(node, sources, tmp_path):
    outside = make_files(tmp_path / "outside" / "precious", 4 * MiB)
    (outside / MANIFEST_NAME).write_text("{}")
    (node / NS).mkdir()
    (node / NS / "link").symlink_to(outside, target_is_directory=True)
    (node / "evil").symlink_to(tmp_path / "outside", target_is_directory=True)
    make_files(node / NS / "partial", 20 * MiB)  # a copy being written: no manifest yet
    assert fetch_cli(node, sources("old", 20 * MiB), "old", tmp_path)[0] == 0
    rc, res, err = fetch_cli(
        node,
        sources("new", 20 * MiB),
        "new",
        tmp_path,
        high_watermark=80,
        low_watermark=50,
        candidates=[f"{NS}/link", "evil/precious", f"{NS}/partial", f"{NS}/old"],
    )
    assert rc == 0, err
    assert (outside / "config.json").exists() and len(list(outside.iterdir())) == 4
    assert (node / NS / "partial" / "config.json").exists()
    assert res.capacity is not None and [e.copy_key for e in res.capacity.evicted] == [f"{NS}/old"]


def test_candidates_that_are_not_cache_names_are_refused():
    for bad in ("../etc", "team/../../x", "team/a/b", "/abs/x", "team"):
        with pytest.raises(ValueError, match="not <namespace>/<name>"):
            CapacityRequest(root="/strata/node", policy="p", high_watermark=90, low_watermark=80, candidates=[bad])
    with pytest.raises(ValueError, match="must be below"):
        CapacityRequest(root="/strata/node", policy="p", high_watermark=80, low_watermark=80)


def test_a_budget_the_job_cannot_parse_fails_the_fetch_in_one_line(tmp_path, sources):
    term = tmp_path / "termination"
    req = FetchRequest(source=str(sources("m", MiB)), dest=str(tmp_path / "dst" / NS / "m"))
    env = {"STRATA_TERMINATION_MESSAGE_PATH": str(term), "STRATA_NODE_CAPACITY": json.dumps({"root": "x"})}
    r = run_cli(*req.to_args(), env=env)
    assert r.returncode == 1 and "STRATA_NODE_CAPACITY is not a valid node budget" in r.stderr
    assert FetchResult.from_termination_message(term.read_text()).status == "Failed"


def test_a_namespace_over_its_budget_evicts_its_own_idle_copy_and_never_another_namespaces(node, sources, tmp_path):
    # 64 MiB, watermarks out of the way (32 + 16 MiB is 75%): only the namespace budget (24 MiB) binds. The other
    # namespace's copy is offered first, as a cluster-wide policy would, and still stays: it would not help.
    assert fetch_cli(node, sources("theirs", 16 * MiB), "theirs", tmp_path, ns="other")[0] == 0
    assert fetch_cli(node, sources("old", 16 * MiB), "old", tmp_path)[0] == 0
    rc, res, err = fetch_cli(
        node,
        sources("new", 16 * MiB),
        "new",
        tmp_path,
        high_watermark=90,
        low_watermark=80,
        candidates=["other/theirs", f"{NS}/old"],
        namespace_budget_bytes=24 * MiB,
    )
    assert rc == 0, err
    assert copies(node) == {"new"} and (node / "other" / "theirs" / MANIFEST_NAME).is_file()
    cap = res.capacity
    assert cap is not None and [e.copy_key for e in cap.evicted] == [f"{NS}/old"]
    assert cap.namespace_budget_bytes == 24 * MiB and cap.namespace_used_bytes >= 16 * MiB


def test_a_copy_over_its_namespace_budget_with_nothing_of_its_own_to_evict_fails_saying_what_to_change(
    node, sources, tmp_path
):
    assert fetch_cli(node, sources("kept", 8 * MiB), "kept", tmp_path)[0] == 0
    rc, res, err = fetch_cli(
        node,
        sources("new", 16 * MiB),
        "new",
        tmp_path,
        high_watermark=90,
        low_watermark=80,
        protected=[f"{NS}/kept (pinned by its cache)"],
        namespace_budget_bytes=20 * MiB,
    )
    assert rc == EXIT_INSUFFICIENT_STORAGE, err
    assert res.reason == "InsufficientStorage" and res.error is not None
    assert f"namespace {NS}'s copies on this node already take" in res.error
    assert "budget of 20971520 bytes (NodeCachePolicy nvme)" in res.error
    assert f"raise the policy's namespaceBudgets for {NS}" in res.error
    assert copies(node) == {"kept"} and not (node / NS / "new" / MANIFEST_NAME).exists()
