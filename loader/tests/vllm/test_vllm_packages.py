"""The vLLM package directory the webhook copies into a pod (strata_loader.vllm.packages), inside real vLLM, for
each version Strata supports, with nothing else of Strata's on the path: vLLM finds `--load-format strata` through
the directory's dist-info and loads a tiny Llama bit-exact with it, the KV tier and CPU spec modules the operator
names import, and the version check the pod runs passes with vLLM's own interpreter."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from strata_loader.vllm import packages
from strata_operator.resources.kvcachetier.connection import CPU_ENGINE_SPEC_MODULE, VLLM_TIER_MODULE
from strata_testsupport.vllm import VLLM_VERSIONS, VllmScript, vllm_env, vllm_python
from strata_testsupport.vllm_loader import CONFIG, ENGINE, llama_weights, write_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("vllm-packages") / "packages"
    packages.build(target)
    return target


@pytest.fixture(scope="module", params=sorted(VLLM_VERSIONS))
def requirements(request: pytest.FixtureRequest) -> Path:
    return VLLM_VERSIONS[request.param]


@pytest.fixture(scope="module")
def vllm_side(requirements: Path, package_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmScript]:
    """loader_engine.py with the package directory as its whole PYTHONPATH (no repo sources)."""
    script = VllmScript(
        ENGINE, tmp_path_factory.mktemp("vllm-side"), env={"PYTHONPATH": str(package_dir)}, requirements=requirements
    )
    try:
        yield script
    finally:
        script.close()


def test_vllm_finds_the_loader_in_the_directory(vllm_side: VllmScript, package_dir: Path) -> None:
    answer = vllm_side.call({"mode": "plugins"})
    assert answer["entry_points"]["strata"] == "strata_loader.vllm.plugin:register"
    assert answer["loader_class"] == "strata_loader.vllm.plugin.StrataModelLoader"
    assert Path(answer["plugin_file"]).is_relative_to(package_dir), answer["plugin_file"]


def test_a_tiny_llama_loads_bit_exact_from_the_directory(vllm_side: VllmScript, tmp_path: Path) -> None:
    model = write_model(tmp_path / "model")
    answer = vllm_side.call({"mode": "load", "model_dir": str(model), "reference_dir": str(model)})
    (rank,) = answer["ranks"]
    assert rank["differ"] == [] and rank["stats"]["tensors"] == len(llama_weights(CONFIG))


def test_the_tier_imports_and_the_check_passes(requirements: Path, package_dir: Path) -> None:
    python = str(vllm_python(requirements))
    code = f"import {VLLM_TIER_MODULE}, {CPU_ENGINE_SPEC_MODULE}, strata_kv; print(strata_kv.__file__)"
    imported = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        env=vllm_env({"PYTHONPATH": str(package_dir)}),
        timeout=600,
    )
    assert imported.returncode == 0, imported.stderr[-4000:]
    assert Path(imported.stdout.split()[-1]).is_relative_to(package_dir)
    check = subprocess.run(
        [python, "-I", str(package_dir / packages.CHECK_SCRIPT)], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stderr
    assert "vLLM packages can serve this image" in check.stdout
