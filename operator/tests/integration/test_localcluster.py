"""The local control plane never leaves processes or directories behind, even when its owner dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from strata_testsupport.localcluster import BinariesNotFound, LocalCluster, find_binaries

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def binaries_available() -> None:
    try:
        find_binaries()
    except BinariesNotFound as error:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(str(error), pytrace=False)
        pytest.skip(str(error))


def _gone(pids: list[int], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def test_stop_ends_every_process_and_removes_the_work_directory(binaries_available: None) -> None:
    with LocalCluster(controller_manager=False, scheduler=False, kwok=False) as cluster:
        pids = [p.process.pid for p in cluster.processes]
        workdir = cluster.workdir
        assert len(pids) == 2 and all(psutil.pid_exists(pid) for pid in pids)
        assert cluster.api_get("/readyz")[0] == 200
    assert _gone(pids)
    assert not workdir.exists()


def test_a_failure_inside_the_block_still_tears_down(binaries_available: None) -> None:
    pids: list[int] = []
    with (
        pytest.raises(RuntimeError, match="test body failed"),
        LocalCluster(controller_manager=False, scheduler=False, kwok=False) as cluster,
    ):
        pids.extend(p.process.pid for p in cluster.processes)
        workdir = cluster.workdir
        raise RuntimeError("test body failed")
    assert _gone(pids)
    assert not workdir.exists()


def test_components_die_when_their_owner_is_killed(binaries_available: None, tmp_path: Path) -> None:
    """SIGKILL gives the owner no chance to clean up: the kernel's parent-death signal must do it."""
    script = (
        "import json, sys, time\n"
        "from strata_testsupport.localcluster import LocalCluster\n"
        "c = LocalCluster(controller_manager=False, scheduler=False, kwok=False)\n"
        "c.start()\n"
        "print(json.dumps({'pids': [p.process.pid for p in c.processes], 'workdir': str(c.workdir)}), flush=True)\n"
        "time.sleep(600)\n"
    )
    support = Path(__file__).resolve().parents[3] / "testsupport"  # pytest's pythonpath is not a child's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(support), os.environ.get("PYTHONPATH")]))}
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        started = json.loads(owner.stdout.readline())  # type: ignore[union-attr]
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert _gone(started["pids"]), "control plane processes outlived their owner"
    subprocess.run(["rm", "-rf", started["workdir"]], check=True)


def test_missing_binaries_name_the_command_that_builds_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("STRATA_BIN_DIR", str(tmp_path))
    with pytest.raises(BinariesNotFound, match="make setup"):
        find_binaries()


def test_envtest_assets_take_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("etcd", "kube-apiserver"):
        binary = tmp_path / name
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    found = find_binaries()
    assert found.etcd == tmp_path / "etcd" and found.kube_controller_manager is None and found.kwok is None
