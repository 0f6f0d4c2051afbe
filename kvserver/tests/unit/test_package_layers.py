"""strata_kv's sub-packages are layered, so that the engine side never pulls in the server and the server's parts
never reach back into what drives them:

    layer      modules                                   may import (besides itself)
    ---------  ----------------------------------------  ------------------------------
    contract   config, __init__ (the version)            nothing
    wire       wire/ (RESP codec, value pool, memfds)    contract
    client     client                                    contract, wire
    store      store/ (L1, policies, L2 tiers, ...)      contract
    server     server/ (listeners, connections, ...)     contract, wire, store
    vllm       vllm/ (tier, CPU offload, engine link)    contract, client
    csi        csi/ (the CSI node plugin)                contract
    top        cli, vllm_tier, vllm_cpu_offload          any

`config` is what the operator renders, `client` what engines, the operator and tests talk through; `vllm_tier` and
`vllm_cpu_offload` are the entry modules vLLM imports by name. An import against the layers fails here with the
module that made it, wherever it is in the file (inside a function, under `TYPE_CHECKING`); so does an import cycle
between two modules, which `TYPE_CHECKING` would otherwise hide."""

from __future__ import annotations

import ast
from pathlib import Path

from strata_testsupport.layers import layer_violations

PACKAGE = Path(__file__).resolve().parents[2] / "strata_kv"
CONTRACT = {"config", "__init__"}
TOP = {"cli", "vllm_tier", "vllm_cpu_offload"}
MAY_IMPORT = {
    "contract": set(),
    "wire": {"contract"},
    "client": {"contract", "wire"},
    "store": {"contract"},
    "server": {"contract", "wire", "store"},
    "vllm": {"contract", "client"},
    "csi": {"contract"},
}
"""What each layer imports besides itself; the top imports any of them."""
SUB_PACKAGES = {"wire", "store", "server", "vllm", "csi"}


def layer_of(module: str) -> str:
    """The layer of a strata_kv module named relative to the package (`server.connection`, `client`, `__init__`)."""
    first = module.split(".")[0]
    if first in CONTRACT:
        return "contract"
    return "top" if first in TOP else first


def is_module(module: str, package: Path = PACKAGE) -> bool:
    """Whether `module` (relative, dotted; '' for the package itself) is a module or package of strata_kv."""
    path = package.joinpath(*module.split(".")) if module else package
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def as_module(module: str) -> str:
    """A package names its `__init__` (`''` → `__init__`, `wire` → `wire.__init__`)."""
    if not module:
        return "__init__"
    return f"{module}.__init__" if (PACKAGE.joinpath(*module.split(".")) / "__init__.py").is_file() else module


def imports_of(source: str, package: tuple[str, ...], exists=is_module) -> set[str]:
    """The strata_kv modules a file of `package` (`("server",)`, `()` for the top) imports, relative to strata_kv
    (`wire.resp`, `__init__`), wherever in the file the import is. `from X import name` imports the module
    `X.name` when there is one, else `X` itself."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.removeprefix("strata_kv.") for a in node.names if a.name.startswith("strata_kv.")}
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1] + ((node.module,) if node.module else ())
            origin = ".".join(base)
        elif node.module == "strata_kv" or (node.module or "").startswith("strata_kv."):
            origin = node.module.removeprefix("strata_kv").strip(".")  # type: ignore[union-attr]
        else:
            continue
        for alias in node.names:
            sub = f"{origin}.{alias.name}" if origin else alias.name
            found.add(sub if exists(sub) else origin)
    return {as_module(m) if exists(m) else m for m in found}


def violations(module: tuple[str, ...], source: str) -> list[str]:
    """Imports of one module (`("server", "connection")`) that go against the layers."""
    return layer_violations(module, imports_of(source, module[:-1]), layer_of, MAY_IMPORT)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of a module graph, each as the path that closes it (`[a, b, a]`)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def modules() -> dict[tuple[str, ...], str]:
    return {p.relative_to(PACKAGE).with_suffix("").parts: p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_import_follows_the_layers() -> None:
    wrong = [line for module, source in modules().items() for line in violations(module, source)]
    assert not wrong, "\n".join(wrong)


def test_no_two_modules_import_each_other_even_for_type_checking() -> None:
    graph = {".".join(m): imports_of(source, m[:-1]) - {".".join(m)} for m, source in modules().items()}
    found = cycles(graph)
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_every_module_is_in_a_layer() -> None:
    """A module added at the top level has to say which layer it is in."""
    loose = {p.stem for p in PACKAGE.glob("*.py")} - CONTRACT - TOP - {"client"}
    assert not loose, f"modules outside every layer: {sorted(loose)}; move them into a sub-package"
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} == SUB_PACKAGES
    assert set(MAY_IMPORT) == SUB_PACKAGES | {"contract", "client"}


def test_an_import_against_the_layers_is_refused_wherever_it_is() -> None:
    source = "from ..config import LimitsConfig\n\ndef f():\n    from ..server.state import ServerState\n"
    assert violations(("store", "tiered"), source) == [
        "store.tiered: imports server.state (store may import ['contract'])"
    ]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..store.tiered import TieredStore\n"
    assert violations(("vllm", "tier"), source) == [
        "vllm.tier: imports store.tiered (vllm may import ['client', 'contract'])"
    ]
    assert violations(("wire", "resp"), "from .. import client\n") == [
        "wire.resp: imports client (wire may import ['contract'])"
    ]
    assert violations(("server", "info"), "from .. import __version__\nfrom ..wire import resp\n") == []
    assert violations(("vllm_tier",), "from .server.listeners import KVServer\n") == []


def test_a_cycle_under_type_checking_is_found() -> None:
    connection = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .listeners import KVServer\n"
    graph = {
        "server.listeners": imports_of("from .connection import RespConnection\n", ("server",)),
        "server.connection": imports_of(connection, ("server",)),
        "server.state": set(),
    }
    assert cycles(graph) == [["server.connection", "server.listeners", "server.connection"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
