"""The operator package's layers: an import only points down, so each layer can be read (and tested) without the
ones above it. `api`, `conditions`, `settings` → `resources`, `kube` → `handlers` → `webhook` → `routes`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "strata_operator"
LAYER = {
    "api": 0,
    "conditions": 0,
    "settings": 0,
    "resources": 1,
    "kube": 1,
    "handlers": 2,
    "webhook": 3,
    "routes": 4,
    "cli": 4,
}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "strata_operator" and parts[1] in LAYER else None


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    own = layer_of(".".join(("strata_operator", *path.relative_to(PACKAGE).with_suffix("").parts)))
    if own is None:
        return
    upward = {m for m in imports(path) if (other := layer_of(m)) is not None and LAYER[other] > LAYER[own]}
    assert upward == set(), f"{own} (layer {LAYER[own]}) imports from above: {sorted(upward)}"


def test_settings_import_nothing_of_the_operator() -> None:
    assert {m for m in imports(PACKAGE / "settings.py") if m.startswith("strata_operator")} == set()
