"""The module names an import statement names, as the layer and marker checks read them."""

from __future__ import annotations

import ast


def imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """Each module (and each ``from`` name under its module) ``node`` imports, relative
    imports resolved against ``package``, the package the importing module lies in."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    return [source, *(f"{source}.{alias.name}" for alias in node.names)]
