"""A node whose owner is killed (no clean-up ran) is swept by the next start: no processes, containers,
mounts, cgroups, bridge, iptables chains, addresses or control-plane files stay behind. Named to run before the
session's node starts (the node's addresses are fixed: only one runs at a time)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from strata_testsupport.cluster import missing
from strata_testsupport.localcluster.node import NodeUnavailable, RealNode, find_node_binaries, leftovers, sweep
from strata_testsupport.localcluster.node import node_images_archive as build_node_images

pytestmark = [pytest.mark.integration, pytest.mark.realnode]
SUPPORT = Path(__file__).resolve().parents[2] / "testsupport"

# In a child process: a node with one running pod, then wait to be killed.
OWNER = """
import json, sys, time
from strata_testsupport.kube import new_dynamic_client, resource, wait_for
from strata_testsupport.localcluster.node import RealNode
from strata_testsupport.pods import RESTRICTED_CONTAINER, RUNTIME_IMAGE
node = RealNode(__import__("pathlib").Path(sys.argv[1]))
node.start()
client = new_dynamic_client(str(node.kubeconfig))
pods = resource(client, "v1", "Pod")
pods.create(namespace="default", body={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
    "spec": {"containers": [{"name": "main", "image": RUNTIME_IMAGE, "imagePullPolicy": "IfNotPresent",
             "command": ["sleep", "600"], "securityContext": RESTRICTED_CONTAINER}]}})
wait_for(lambda: pods.get(name="sleeper", namespace="default").status.phase == "Running", timeout=120)
print(json.dumps({"running": True, "control_plane": str(node.cluster.workdir)}), flush=True)
time.sleep(600)
"""


def test_a_node_whose_owner_was_killed_is_swept_by_the_next_start():
    assert RealNode.active is None, "a real node is already up in this process: this test must run before it"
    try:
        binaries = find_node_binaries()
        images = build_node_images()
    except NodeUnavailable as error:
        missing(str(error))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(images)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        started = json.loads(owner.stdout.readline() or "{}")  # type: ignore[union-attr]
        assert started.get("running"), "the owner never got its pod running"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    left = leftovers()
    assert any(item.startswith("process") for item in left), f"the scenario left nothing to sweep: {left}"
    assert any(item.startswith("mount") for item in left), left
    assert Path(started["control_plane"]).is_dir()
    sweep(binaries.kube_proxy)
    assert leftovers() == []
    assert not Path(started["control_plane"]).exists(), "the killed owner's control plane files stayed behind"
