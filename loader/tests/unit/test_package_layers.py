"""strata_loader's sub-packages are layered: the contract the operator imports at the bottom, a shared core above
it, the products above that, the CLI on top. A product imports the core, not another product, except where it
builds on one (`fetch` reads from `peer`s and pre-shards with `tensor`; `vllm` feeds vLLM from `tensor`; `pack`
and `compilecache` need only the core). An import against the layers (also one inside a function) fails here with
the module that made it."""

from __future__ import annotations

import ast
from pathlib import Path

from strata_testsupport.layers import layer_violations

PACKAGE = Path(__file__).resolve().parents[2] / "strata_loader"
CONTRACT = {"contract", "capacity", "paths", "registry"}
"""The operator imports these (the Job contract, the node budget, the relative-path rule the contract applies, the
registry client it resolves image tags with)."""
MAY_IMPORT = {
    "contract": set(),
    "core": {"contract"},
    "tensor": {"contract", "core"},
    "peer": {"contract", "core"},
    "fetch": {"contract", "core", "peer", "tensor"},
    "vllm": {"contract", "core", "tensor"},
    "pack": {"contract", "core"},
    "compilecache": {"contract", "core"},
}
"""What each layer imports besides itself; the top (`cli`, `__init__`, `__main__`) imports any of them."""
TOP = {"cli", "__init__", "__main__"}


def layer_of(module: str) -> str:
    """'contract', a sub-package's name, or 'top' for a module of strata_loader (`core.format`, `cli`)."""
    first = module.split(".")[0]
    if first in CONTRACT:
        return "contract"
    return "top" if first in TOP else first


def imports_of(source: str, package: tuple[str, ...]) -> set[str]:
    """The strata_loader modules a file of `package` (`("fetch",)`, `()` for the top) imports, relative to
    strata_loader (`core.format`), wherever in the file the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[: len(package) - node.level + 1] + ((node.module,) if node.module else ()))
            names = [f"strata_loader.{base}"] if node.module else [f"strata_loader.{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        found |= {n.removeprefix("strata_loader.").strip(".") for n in names if n.startswith("strata_loader.")}
    return found


def violations(module: tuple[str, ...], source: str) -> list[str]:
    """Imports of one module (`("peer", "source")`) that go against the layers."""
    return layer_violations(module, imports_of(source, module[:-1]), layer_of, MAY_IMPORT)


def test_every_import_follows_the_layers() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        wrong += violations(path.relative_to(PACKAGE).with_suffix("").parts, path.read_text())
    assert not wrong, "\n".join(wrong)


def test_every_module_is_in_a_layer() -> None:
    """A module added at the top level (outside a product) has to say which layer it is in."""
    loose = {p.stem for p in PACKAGE.glob("*.py")} - CONTRACT - TOP
    assert not loose, f"modules outside every layer: {sorted(loose)}; move them into core/ or a product"
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} == set(MAY_IMPORT) - {"contract"}


def test_an_import_inside_a_function_across_products_is_refused() -> None:
    source = "from ..core.sources import SourceFile\n\ndef f():\n    from ..tensor.api import load_file\n"
    assert violations(("peer", "source"), source) == [
        "peer.source: imports tensor.api (peer may import ['contract', 'core'])"
    ]
    assert violations(("fetch", "run"), "from ..peer.source import with_peers\nfrom ..vllm import plugin\n") == [
        "fetch.run: imports vllm (fetch may import ['contract', 'core', 'peer', 'tensor'])"
    ]
