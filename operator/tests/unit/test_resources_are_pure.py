"""`resources/` holds pure builders: from a spec and what was observed to objects, never touching the cluster,
the environment or kopf. So every builder is a unit test on plain data, and nothing under it can block."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RESOURCES = Path(__file__).resolve().parents[2] / "strata_operator" / "resources"
ALLOWED_PROJECT_MODULES = (
    "strata_operator.api",
    "strata_operator.conditions",
    "strata_operator.resources",
    "strata_loader.contract",
    "strata_loader.capacity",
    "strata_kv.config",
    "strata_kv.csi.volume",
    "strata_units",
)
"""The contracts builders render from: the CRD models, the loader's request and node budget, the KV server's
config, and what the socket driver reads from a volume."""
ALLOWED_THIRD_PARTY = ("pydantic", "kubernetes.utils.quantity")
"""Validation models, and Kubernetes' own quantity arithmetic for container resources (no client)."""
FORBIDDEN_STDLIB = ("os", "subprocess", "socket", "threading", "asyncio", "urllib", "http")


_IMPORTS_OF = """
import ast, json, sys
found = []
for node in ast.walk(ast.parse(open(sys.argv[1]).read())):
    if isinstance(node, ast.Import):
        found += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        found += [f"{node.module}.{alias.name}" for alias in node.names]  # `from a import b` imports a.b
print(json.dumps(found))
"""


def imported_modules(path: Path) -> list[str]:
    """The modules `path` imports, read by `ast` in a fresh interpreter: in CPython 3.11 the AST constructor's
    recursion counter is process-wide and an error path can leave it off (gh-106905), after which every
    `ast.parse` in that process raises SystemError; it once did in CI, after other tests ran."""
    out = subprocess.run([sys.executable, "-c", _IMPORTS_OF, str(path)], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def is_allowed(module: str) -> bool:
    root = module.split(".")[0]
    if root in FORBIDDEN_STDLIB:
        return False
    if root in sys.stdlib_module_names or module == "__future__":
        return True
    return any(module == m or module.startswith(f"{m}.") for m in ALLOWED_PROJECT_MODULES + ALLOWED_THIRD_PARTY)


def test_resources_import_no_client_no_environment_and_no_kopf() -> None:
    offenders = {
        f"{path.relative_to(RESOURCES)}: {module}"
        for path in RESOURCES.rglob("*.py")
        for module in imported_modules(path)
        if not is_allowed(module)
    }
    assert offenders == set()


def test_the_rule_catches_what_it_forbids() -> None:
    for module in ("strata_operator.kube", "strata_operator.settings", "kopf", "kubernetes.dynamic", "os"):
        assert not is_allowed(module), module
    assert is_allowed("strata_operator.api.modelcache") and is_allowed("json")
