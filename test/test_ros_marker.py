"""Every test module whose import loads rclpy, or the harness that starts the node processes,
carries the ``ros`` marker, and no other does: ``make test-jazzy`` runs the marked ones again
on Jazzy's rclpy."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynshape_perception.testing.imports import imported_names

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dynshape_perception"
# What a module that starts ROS imports; launch and launch_ros load rclpy themselves.
ROS_ROOTS = frozenset({"rclpy", "launch_ros", "launch_testing_ros"})
# Starts the node executables, whose rclpy is the venv's.
NODE_STARTER = "dynshape_perception.testing.processes"


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run on import: not function bodies, not ``if TYPE_CHECKING:`` blocks."""
    for node in body:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "TYPE_CHECKING" not in test:
                yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level(block)
            for handler in node.handlers:
                yield from _top_level(handler.body)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)
        else:
            yield node


def imports_on_load(path: Path) -> frozenset[str]:
    """Modules importing ``path`` imports at once (relative imports of the package resolved)."""
    stat = path.stat()
    return _imports_on_load(path, stat.st_mtime_ns, stat.st_size)


# Every test module's walk reads the package's modules again: each is parsed once a version.
@functools.cache
def _imports_on_load(path: Path, _mtime_ns: int, _size: int) -> frozenset[str]:
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    parts = path.relative_to(ROOT).with_suffix("").parts if path.is_relative_to(ROOT) else ()
    package = ".".join(parts[:-1])
    for node in _top_level(tree.body):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.update(imported_names(node, package))
    return frozenset(found)


def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def loads_ros(path: Path, seen: set[Path] | None = None) -> bool:
    """Whether importing ``path`` loads a ROS root, through the package's own modules."""
    seen = set() if seen is None else seen
    seen.add(path)
    for name in imports_on_load(path):
        if name.split(".")[0] in ROS_ROOTS or name.startswith(NODE_STARTER):
            return True
        if name.split(".")[0] != PACKAGE:
            continue
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            module = _module_path(".".join(parts[:end]))
            if module is not None and module not in seen and loads_ros(module, seen):
                return True
    return False


def marked_ros(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "pytest.mark.ros" in ast.unparse(node.value)
    return False


TEST_MODULES = sorted((ROOT / "test").rglob("test_*.py"))


def test_the_ros_marker_is_on_every_module_that_loads_rclpy_and_no_other() -> None:
    wrong = {
        str(p.relative_to(ROOT)): "loads rclpy, unmarked" if loads_ros(p) else "marked, no rclpy"
        for p in TEST_MODULES
        if loads_ros(p) != marked_ros(p)
    }
    assert wrong == {}


def test_a_module_that_loads_rclpy_through_the_harness_is_found() -> None:
    assert loads_ros(ROOT / PACKAGE / "testing" / "session.py")
    assert not loads_ros(ROOT / PACKAGE / "perception" / "pipeline.py")
    assert not loads_ros(ROOT / PACKAGE / "cli" / "main.py"), "the CLI loads ROS lazily"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import rclpy\n", True),
        ("from dynshape_perception.testing.session import node_session\n", True),
        ("def f():\n    import rclpy\n", False),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rclpy\n", False),
        ("try:\n    from launch_ros.actions import Node\nexcept ImportError:\n    pass\n", True),
    ],
)
def test_what_counts_as_loading_rclpy(tmp_path: Path, source: str, expected: bool) -> None:
    path = tmp_path / "test_module.py"
    path.write_text(source)
    assert loads_ros(path) is expected
