"""The import rules that keep the layers apart, read from every module's imports."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "dynshape_perception"
PACKAGE = PACKAGE_DIR.name
# ROS client libraries and message packages: only the nodes and the test harness speak ROS.
ROS_MODULES = frozenset(
    {
        "rclpy",
        "rcl_interfaces",
        "builtin_interfaces",
        "std_msgs",
        "sensor_msgs",
        "geometry_msgs",
        "nav_msgs",
        "visualization_msgs",
        "diagnostic_msgs",
        "diagnostic_updater",
        "vision_msgs",
        "autoware_perception_msgs",
        "unique_identifier_msgs",
        "tf2_ros",
        "tf2_msgs",
        "tf2_py",
        "launch",
        "launch_ros",
        "launch_testing",
        "launch_testing_ros",
    }
)
TVM_MODULES = frozenset({"tvm", "tvm_ffi"})
TVM_LAYERS = frozenset({"models", "compiler"})
ROS_LAYERS = frozenset({"nodes", "testing"})
OUTER_LAYERS = frozenset({"nodes", "cli", "tools", "testing"})
# What each outer layer may not import; the core (everything else) imports none of them.
# The DDS bag player is a node built on the replay tools, so nodes may use tools.
FORBIDDEN = {
    "tools": frozenset({"nodes", "cli"}),
    "nodes": frozenset({"cli"}),
    "testing": frozenset({"cli", "tools"}),
    "cli": frozenset(),
}


def _modules() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def _layer(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR).parts
    return parts[0] if len(parts) > 1 else path.stem


def _imports(path: Path) -> Iterator[str]:
    """Every module an import statement names, at any depth (imports inside functions too)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            if node.module == PACKAGE:
                yield from (f"{PACKAGE}.{alias.name}" for alias in node.names)


def _violations(rule: str) -> list[str]:
    found = []
    for path in _modules():
        layer = _layer(path)
        for name in _imports(path):
            top = name.split(".")[0]
            inner = name.split(".")[1] if top == PACKAGE and "." in name else ""
            bad = (
                (rule == "tvm" and top in TVM_MODULES and layer not in TVM_LAYERS)
                or (rule == "ros" and top in ROS_MODULES and layer not in ROS_LAYERS)
                or (
                    rule == "layers"
                    and inner
                    and inner in FORBIDDEN.get(layer, OUTER_LAYERS)
                    and inner != layer
                )
            )
            if bad:
                found.append(f"{path.relative_to(PACKAGE_DIR.parent)} imports {name}")
    return found


def test_the_package_has_the_layers_the_rules_name() -> None:
    layers = {_layer(p) for p in _modules() if p.parent != PACKAGE_DIR}
    assert TVM_LAYERS | OUTER_LAYERS | {"runtime", "perception", "scheduling", "io"} <= layers


@pytest.mark.parametrize("rule", ["tvm", "ros", "layers"])
def test_no_module_breaks_an_import_rule(rule: str) -> None:
    assert _violations(rule) == []


def test_the_rules_catch_a_breach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / PACKAGE
    (fake / "runtime").mkdir(parents=True)
    (fake / "runtime" / "bad.py").write_text(
        "def f():\n    import tvm\n    import rclpy\n"
        "    from dynshape_perception import nodes\n    from dynshape_perception.cli import main\n"
    )
    monkeypatch.setattr(f"{__name__}.PACKAGE_DIR", fake)
    assert len(_violations("tvm")) == 1 and len(_violations("ros")) == 1
    assert len(_violations("layers")) == 2
