"""The package-layer rule both packages' tests check (kvserver's and the loader's `test_package_layers.py`): each
keeps its own table of layers and its own reading of a module's imports; what counts as a violation is said once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping


def layer_violations(
    module: tuple[str, ...],
    imported: Iterable[str],
    layer_of: Callable[[str], str],
    may_import: Mapping[str, set[str]],
) -> list[str]:
    """The imports of `module` (its path inside the package) that go against the layers: a module may import its own
    layer and the layers `may_import` lists for it; the layer "top" (the package's entry points) may import any."""
    layer = layer_of(".".join(module))
    if layer == "top":
        return []
    return [
        f"{'.'.join(module)}: imports {target} ({layer} may import {sorted(may_import[layer]) or 'nothing'})"
        for target in sorted(imported)
        if layer_of(target) != layer and layer_of(target) not in may_import[layer]
    ]
