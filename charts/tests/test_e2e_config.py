"""What can be checked of the end-to-end suite without starting it: its kind clusters (two CPU workers here, one
GPU worker where the host has a GPU), device plugin and fixtures agree on the nodes, and it applies the repo's own
chart."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import yaml

E2E = Path(__file__).resolve().parents[2] / "e2e"


def e2e_support() -> Any:
    spec = importlib.util.spec_from_file_location("strata_e2e_support", E2E / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_kind_cluster_has_a_control_plane_two_unlabelled_workers_and_a_spare():
    config = yaml.safe_load((E2E / "kind-config.yaml").read_text())
    support = e2e_support()
    assert (config["apiVersion"], config["kind"]) == ("kind.x-k8s.io/v1alpha4", "Cluster")
    assert [n["role"] for n in config["nodes"]] == ["control-plane", "worker", "worker", "worker"]
    *nodes, spare = config["nodes"]
    assert not any(n.get("labels") for n in nodes), "no CPU worker may claim the GPU label"
    assert support.SPARE_LABEL in spare["labels"], "the join test finds the spare worker by its label"
    assert not set(support.GPU_LABEL) & set(spare["labels"]), "the spare may not claim the GPU label"
    assert config["name"] == support.CLUSTER


def test_gpu_kind_cluster_has_one_gpu_worker_labelled_as_the_suite_expects():
    config = yaml.safe_load((E2E / "kind-config-gpu.yaml").read_text())
    assert (config["apiVersion"], config["kind"]) == ("kind.x-k8s.io/v1alpha4", "Cluster")
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    (gpu,) = [n for n in workers if n.get("labels")]
    support = e2e_support()
    assert gpu["labels"] == support.GPU_LABEL
    assert config["name"] == support.CLUSTER
    # nvkind's way in: /dev/null mounted where the NVIDIA runtime looks for the devices to inject.
    assert {"hostPath": "/dev/null", "containerPath": "/var/run/nvidia-container-devices/all"} in gpu["extraMounts"]


def test_device_plugin_runs_on_the_gpu_worker():
    (plugin,) = yaml.safe_load_all((E2E / "manifests" / "nvidia-device-plugin.yaml").read_text())
    assert plugin["spec"]["template"]["spec"]["nodeSelector"] == e2e_support().GPU_LABEL


def test_suite_uses_the_images_build_sh_makes_and_the_charts_defaults():
    support = e2e_support()
    values = yaml.safe_load((E2E.parent / "charts" / "strata" / "values.yaml").read_text())
    assert f"{values['runtimeImage']['repository']}:{support.TAG}" == support.RUNTIME_IMAGE
    assert values["runtimeImage"]["repository"] == support.PREFIX + "strata-runtime"
