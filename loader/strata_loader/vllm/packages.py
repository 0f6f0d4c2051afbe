"""Strata's vLLM packages as one self-contained directory, for images that have vLLM but not Strata.

The runtime image builds it (`python -m strata_loader.vllm.packages /opt/strata/vllm-packages`) from the installed
distribution; the admission webhook copies it into a pod's volume with an init container and puts it on the
engine's PYTHONPATH. It holds the import packages vLLM loads (`strata_loader`: `--load-format strata`; `strata_kv`:
the KV tier and the CPU offloading spec; `strata_units`, which both import) and a `strata-<version>.dist-info`
whose entry_points.txt has the `vllm.general_plugins` group, so `importlib.metadata` finds the loader plugin on
PYTHONPATH as it would after `pip install strata`.

Pure Python only, so it works with any CPython the support table names. No third-party package goes in: what the
vLLM path imports from outside the standard library is vLLM and its own dependencies (`support.IMAGE_MODULES`), and
boto3 only for a `--model s3://...` source the loader reads itself (a ModelCache's mount needs none; such an
image brings boto3); loader/tests/unit/test_vllm_packages.py walks the directory's imports to keep that true. A
manifest (`MANIFEST`) says what is in it and what it serves.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import json
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from . import support

DISTRIBUTION = "strata"
PACKAGES = ("strata_units", "strata_loader", "strata_kv")
"""Import packages copied whole (about 1 MB): vLLM reaches modules of each, some by module path at run time."""
ENTRY_POINT_GROUP = "vllm.general_plugins"
MANIFEST = "strata-vllm-packages.json"
CHECK_SCRIPT = "strata_loader/vllm/support.py"
"""Run by path with the image's interpreter (`python3 -I <dir>/<CHECK_SCRIPT>`): the version check."""
LEFT_TO_THE_IMAGE = {
    "boto3": "only for --model s3://... read by the loader itself; a ModelCache's mount needs none",
}
_SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


def package_dir(name: str) -> Path:
    """Where an import package's files are (an editable install's source tree too)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"import package {name} is not installed here: install the strata distribution first")
    return Path(next(iter(spec.submodule_search_locations)))


def entry_points(dist: metadata.Distribution) -> dict[str, str]:
    return {ep.name: ep.value for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP}


def manifest(version: str, plugins: dict[str, str]) -> dict[str, Any]:
    return {
        "strata": version,
        "python": [f"{a}.{b}" for a, b in support.PYTHON_VERSIONS],
        "vllm": [f"{a}.{b}" for a, b in support.VLLM_VERSIONS],
        "packages": list(PACKAGES),
        "entryPoints": {ENTRY_POINT_GROUP: plugins},
        "check": CHECK_SCRIPT,
        "fromTheImage": list(support.IMAGE_MODULES),
        "leftToTheImage": LEFT_TO_THE_IMAGE,
    }


def _record_line(root: Path, path: Path) -> str:
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(root).as_posix()},sha256={digest},{len(data)}"


def write_dist_info(target: Path, version: str, plugins: dict[str, str]) -> Path:
    """METADATA without Requires-Dist (the image's vLLM brings what these packages import), the entry points, and a
    RECORD of every file, as a wheel install writes them."""
    info = target / f"{DISTRIBUTION}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {version}\n"
        "Summary: Strata's vLLM packages (the --load-format strata loader and the KV tier) for an image with vLLM\n"
        f"Requires-Python: >={support.listed(support.PYTHON_VERSIONS[:1])}\n"
    )
    lines = "".join(f"{name} = {value}\n" for name, value in sorted(plugins.items()))
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    (info / "top_level.txt").write_text("".join(f"{name}\n" for name in PACKAGES))
    (info / "INSTALLER").write_text("strata-runtime-image\n")
    files = sorted(p for p in target.rglob("*") if p.is_file())
    record = [_record_line(target, p) for p in files] + [f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return info


def build(target: Path, dist: metadata.Distribution | None = None) -> dict[str, Any]:
    """Fill the empty (or absent) directory `target`; returns the manifest written into it."""
    dist = dist or metadata.distribution(DISTRIBUTION)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} is not empty: build the vLLM packages into a new directory")
    plugins = entry_points(dist)
    if not plugins:
        raise RuntimeError(f"the {DISTRIBUTION} distribution declares no {ENTRY_POINT_GROUP} entry point")
    target.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        shutil.copytree(package_dir(name), target / name, ignore=_SKIPPED)
    if not (target / CHECK_SCRIPT).is_file():
        raise RuntimeError(f"{CHECK_SCRIPT} is missing from the copied packages")
    contents = manifest(dist.version, plugins)
    (target / MANIFEST).write_text(json.dumps(contents, indent=2, sort_keys=True) + "\n")
    write_dist_info(target, dist.version, plugins)
    return contents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata_loader.vllm.packages", description=__doc__.split("\n")[0])
    parser.add_argument("target", type=Path, help="an empty or absent directory")
    args = parser.parse_args(argv)
    contents = build(args.target)
    print(f"vLLM packages of strata {contents['strata']} in {args.target}: serve {support.supported()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
