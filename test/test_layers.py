"""The layers are an order: each imports only those below it, read from every module's imports."""

from __future__ import annotations

import ast
import importlib.metadata
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynshape_perception.testing.imports import imported_names

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dynshape_perception"
# Bottom to top. A module may import its own layer and those before it, never one after it.
LAYERS: tuple[str, ...] = (
    "__init__",
    "errors",
    "resources",
    "fsutil",
    "procfs",
    "stats",
    "interrupts",
    "paramspec",
    "config",
    "models",
    "compiler",
    "runtime",
    "perception",
    "io",
    "scheduling",
    "parameters",
    "nodes",
    "testing",
    "tools",
    "cli",
)
TVM_MODULES = frozenset({"tvm", "tvm_ffi"})
TVM_LAYERS = frozenset({"models", "compiler"})
ROS_LAYERS = frozenset({"nodes", "testing"})
# What a vehicle runs is the nodes and what they reach: none of it may need a package that only
# development, fitting, benchmarks or a fleet install.
VEHICLE_LAYER = "nodes"
NOT_ON_A_VEHICLE = frozenset(
    {"torch", "ray", "pytest", "hypothesis", "onnx", "onnxruntime", "mypy", "ruff", "psycopg2"}
)


@dataclass(frozen=True)
class Tree:
    """The package's modules and, for each, every module an import of it names."""

    package_dir: Path
    modules: dict[str, Path]
    edges: dict[str, frozenset[str]]

    def layer(self, module: str) -> str:
        parts = self.modules[module].relative_to(self.package_dir).parts
        return parts[0] if len(parts) > 1 else Path(parts[0]).stem

    def closure(self, module: str, skip: frozenset[str] = frozenset()) -> set[str]:
        """Every module (the package's and outside ones) that importing ``module`` imports,
        not going on through those in ``skip``."""
        seen: set[str] = set()
        todo = [module]
        while todo:
            for name in self.edges.get(todo.pop(), frozenset()):
                if name not in seen and name not in skip:
                    seen.add(name)
                    todo.append(name)
        return seen


def _module_name(package_dir: Path, path: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _constant_prefix(node: ast.expr) -> str | None:
    """The module an ``import_module`` argument names: a string, or an f-string's fixed start."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            return head.value.rstrip(".")
    return None


def _named(path: Path, module: str) -> Iterator[str]:
    """Every module name an import of ``path`` states: absolute, relative, inside functions,
    under TYPE_CHECKING, and the targets of ``importlib.import_module``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield from imported_names(node, package)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            == "import_module"
            and node.args
        ):
            target = _constant_prefix(node.args[0])
            if target:
                yield target


def _resolve(name: str, modules: dict[str, Path]) -> Iterator[str]:
    """The package modules that importing ``name`` runs (its parents too), or its top name."""
    if name.split(".")[0] != PACKAGE:
        yield name.split(".")[0]
        return
    parts = name.split(".")
    for end in range(2, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if prefix in modules:
            yield prefix


def read_tree(package_dir: Path) -> Tree:
    modules = {_module_name(package_dir, p): p for p in sorted(package_dir.rglob("*.py"))}
    edges = {
        module: frozenset(
            target
            for name in _named(path, module)
            for target in _resolve(name, modules)
            if target != module
        )
        for module, path in modules.items()
    }
    return Tree(package_dir, modules, edges)


def ros_modules() -> frozenset[str]:
    """ROS packages: those package.xml declares, plus any module a ``ros-*`` wheel installs."""
    root = ET.parse(ROOT / "package.xml").getroot()
    declared = {
        element.text.strip().removesuffix("_py")
        for tag in ("depend", "exec_depend", "test_depend")
        for element in root.iter(tag)
        if element.text and not element.text.strip().startswith("python3-")
    }
    installed = {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(dist.lower().startswith("ros-") for dist in dists)
    }
    return frozenset(declared | installed)


def violations(tree: Tree, rule: str, ros: frozenset[str] = frozenset()) -> list[str]:
    found: list[str] = []
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    if rule == "named":
        return sorted(
            {f"{tree.layer(m)} is in no layer" for m in tree.modules if tree.layer(m) not in rank}
        )
    for module in tree.modules:
        layer = tree.layer(module)
        for target in sorted(tree.edges[module]):
            if target in tree.modules:
                other = tree.layer(target)
                if rule == "order" and rank.get(other, len(LAYERS)) > rank.get(layer, -1):
                    found.append(f"{module} ({layer}) imports {target} ({other})")
            elif rule == "tvm" and target in TVM_MODULES and layer not in TVM_LAYERS:
                found.append(f"{module} imports {target}")
            elif rule == "ros" and target in ros and layer not in ROS_LAYERS:
                found.append(f"{module} imports {target}")
        if rule == "vehicle" and layer == VEHICLE_LAYER:
            reached = tree.closure(module)
            found.extend(
                f"{module} reaches {name}"
                for name in sorted(reached)
                if name in NOT_ON_A_VEHICLE
                or (name in tree.modules and rank.get(tree.layer(name), 0) > rank[VEHICLE_LAYER])
            )
    return found


@pytest.fixture(scope="module")
def tree() -> Tree:
    return read_tree(ROOT / PACKAGE)


def test_every_folder_and_top_level_module_is_a_named_layer(tree: Tree) -> None:
    assert violations(tree, "named") == []
    assert {tree.layer(m) for m in tree.modules} == set(LAYERS)


@pytest.mark.parametrize("rule", ["order", "tvm", "vehicle"])
def test_no_module_breaks_a_layer_rule(tree: Tree, rule: str) -> None:
    assert violations(tree, rule) == []


def test_only_the_nodes_and_the_harness_import_ros(tree: Tree) -> None:
    ros = ros_modules()
    assert {"rclpy", "ament_index_python", "tf2_ros", "launch_ros"} <= ros
    assert violations(tree, "ros", ros) == []


def test_every_ros_package_the_code_imports_is_declared_in_package_xml(tree: Tree) -> None:
    root = ET.parse(ROOT / "package.xml").getroot()
    declared = {
        e.text.strip().removesuffix("_py")
        for e in root.iter()
        if e.text and e.tag.endswith("depend")
    }
    installed_ros = ros_modules() - declared
    imported = {t for targets in tree.edges.values() for t in targets if t not in tree.modules}
    # Message support modules come with their message packages.
    assert sorted(imported & installed_ros - {"rosidl_runtime_py", "rpyutils"}) == []


def cycles(tree: Tree) -> list[str]:
    """Pairs of modules each of which imports the other, at any depth (packages' ``__init__``
    aside: importing any submodule runs them)."""
    inits = frozenset(m for m, path in tree.modules.items() if path.name == "__init__.py")
    return sorted(
        f"{module} <-> {target}"
        for module, targets in tree.edges.items()
        for target in targets
        if target in tree.modules
        and module < target
        and not {module, target} & inits
        and module in tree.closure(target, inits)
    )


def test_no_two_modules_import_each_other(tree: Tree) -> None:
    """A cycle between modules, even for a type, means one of them is in the wrong place."""
    assert cycles(tree) == []


def apart_from_the_executor(tree: Tree) -> list[str]:
    """Scheduling modules that neither the executor imports nor import the executor."""
    executor = f"{PACKAGE}.scheduling.executor"
    return [
        module
        for module in tree.modules
        if tree.layer(module) == "scheduling"
        and module != executor
        and module not in tree.closure(executor)
        and executor not in tree.closure(module)
    ]


def test_scheduling_holds_only_the_executor_and_its_wiring(tree: Tree) -> None:
    """Each scheduling module is the executor, a part of it, or wiring that uses it; an
    algorithm that runs without the executor belongs in ``perception/``."""
    assert apart_from_the_executor(tree) == []


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Tree:
    package_dir = tmp_path / PACKAGE
    for layer in ("runtime", "io", "nodes", "tools", "cli"):
        (package_dir / layer).mkdir(parents=True, exist_ok=True)
        (package_dir / layer / "__init__.py").write_text("")
    (package_dir / "__init__.py").write_text("")
    for relative, text in files.items():
        (package_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (package_dir / relative).write_text(text)
    return read_tree(package_dir)


@pytest.mark.parametrize(
    ("rule", "files", "expected"),
    [
        pytest.param(
            "order",
            {"runtime/bad.py": "def f():\n    from dynshape_perception.nodes import base\n"},
            "dynshape_perception.runtime.bad (runtime) imports dynshape_perception.nodes (nodes)",
            id="upward-edge",
        ),
        pytest.param(
            "order",
            {"io/bad.py": "from ..tools import replay\n", "tools/replay.py": ""},
            "dynshape_perception.io.bad (io) imports dynshape_perception.tools (tools)",
            id="relative",
        ),
        pytest.param(
            "order",
            {
                "io/bad.py": "import importlib\n"
                "importlib.import_module(f'dynshape_perception.cli.{x}')\n"
            },
            "dynshape_perception.io.bad (io) imports dynshape_perception.cli (cli)",
            id="importlib",
        ),
        pytest.param(
            "vehicle",
            {
                "nodes/node.py": "from dynshape_perception.io import helper\n",
                "io/helper.py": "import ray\n",
            },
            "dynshape_perception.nodes.node reaches ray",
            id="transitive",
        ),
        pytest.param(
            "named",
            {"sidecar/thing.py": "x = 1\n"},
            "sidecar is in no layer",
            id="unnamed-layer",
        ),
        pytest.param(
            "tvm",
            {"runtime/bad.py": "if True:\n    import tvm.relax\n"},
            "dynshape_perception.runtime.bad imports tvm",
            id="tvm",
        ),
    ],
)
def test_each_kind_of_breach_is_caught(
    tmp_path: Path, rule: str, files: dict[str, str], expected: str
) -> None:
    tree = _fake_package(tmp_path, files)
    assert expected in violations(tree, rule)


def test_an_algorithm_in_scheduling_that_never_uses_the_executor_is_caught(
    tmp_path: Path,
) -> None:
    tree = _fake_package(
        tmp_path,
        {
            "scheduling/__init__.py": "",
            "scheduling/executor.py": "from dynshape_perception.scheduling import lanes\n",
            "scheduling/lanes.py": "",
            "scheduling/wiring.py": "from dynshape_perception.scheduling.executor import run\n",
            "scheduling/sectors.py": "import numpy\n",
        },
    )
    assert apart_from_the_executor(tree) == [f"{PACKAGE}.scheduling.sectors"]


def test_a_ros_import_below_the_nodes_is_caught(tmp_path: Path) -> None:
    tree = _fake_package(tmp_path, {"io/bad.py": "from ament_index_python.packages import x\n"})
    assert violations(tree, "ros", ros_modules()) == [
        "dynshape_perception.io.bad imports ament_index_python"
    ]


def test_a_cycle_between_modules_is_caught(tmp_path: Path) -> None:
    tree = _fake_package(
        tmp_path,
        {
            "runtime/a.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from .b import B\n",
            "runtime/b.py": "from dynshape_perception.runtime.a import A\n",
        },
    )
    assert cycles(tree) == ["dynshape_perception.runtime.a <-> dynshape_perception.runtime.b"]
