"""package.xml names every dependency the code imports, by its rosdep key."""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Import name -> rosdep key, where they differ (ROS packages are named alike otherwise).
KEYS = {
    "tf2_ros": "tf2_ros_py",
    "numpy": "python3-numpy",
    "cv2": "python3-opencv",
    "scipy": "python3-scipy",
    "yaml": "python3-yaml",
    "tqdm": "python3-tqdm",
    "matplotlib": "python3-matplotlib",
    "packaging": "python3-packaging",
    "sqlalchemy": "python3-sqlalchemy",
    "apsw": "python3-apsw",
    "psutil": "python3-psutil",
    "hypothesis": "python3-hypothesis",
    "jsonschema": "python3-jsonschema",
    "pytest": "python3-pytest",
    "PIL": "python3-pil",
}
# No rosdep key: pinned in requirements*.txt (name there) and said so in package.xml; the
# zstd backport and the fitting and benchmark extras are no runtime dependency.
PIP_ONLY = {
    "tvm": "apache-tvm",
    "tvm_ffi": "apache-tvm-ffi",
    "rosbags": "rosbags",
    "optuna": "optuna",
    "backports": "backports.zstd",
    "torch": "torch",
    "onnxruntime": "onnxruntime",
    "trackeval": "trackeval",
    "ray": "ray",
}
OWN = {"dynshape_perception", "launch_checks", "compression"}


def _imports(folder: str, skip: str = "") -> set[str]:
    found: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        if skip and skip in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - OWN


def _depends(*tags: str) -> set[str]:
    root = ET.parse(ROOT / "package.xml").getroot()
    return {el.text or "" for tag in tags for el in root.iter(tag)}


def _requirements() -> str:
    return "".join(p.read_text() for p in ROOT.glob("requirements*.txt")).lower()


def test_the_package_imports_only_declared_dependencies() -> None:
    declared = _depends("exec_depend", "depend")
    pinned = _requirements()
    for module in sorted(_imports("dynshape_perception", skip="testing") | _imports("launch")):
        if module in PIP_ONLY:
            assert re.search(rf"^{re.escape(PIP_ONLY[module])}==", pinned, re.M), module
        else:
            assert KEYS.get(module, module) in declared, module


def test_the_tests_and_their_harness_import_only_declared_dependencies() -> None:
    declared = _depends("exec_depend", "depend", "test_depend")
    harness = _imports("dynshape_perception/testing")
    for module in sorted((_imports("test") | harness) - set(PIP_ONLY)):
        assert KEYS.get(module, module) in declared, module


def test_pip_only_dependencies_are_named_in_package_xml() -> None:
    text = (ROOT / "package.xml").read_text()
    for name in ("apache-tvm", "rosbags", "optuna"):
        assert name in text


def pins(name: str) -> dict[str, str]:
    """Package name (normalised) → version, of one requirements file."""
    out = {}
    for line in (ROOT / name).read_text().splitlines():
        if line and not line.startswith("#"):
            package, version = line.split("==")
            out[re.sub(r"[-_.]+", "-", package).lower()] = version
    return out


def test_a_vehicle_installs_no_development_tool() -> None:
    runtime = pins("requirements.txt")
    for tool in ("pytest", "mypy", "ruff", "hypothesis", "jsonschema", "torch", "ray"):
        assert tool not in runtime, f"{tool} belongs in a requirements set of its own"


def test_the_requirement_sets_agree_on_every_shared_pin() -> None:
    # The Jazzy set pins the other distro's ROS wheels, in a venv of its own.
    sets = {p.name: pins(p.name) for p in ROOT.glob("requirements*.txt")}
    sets["requirements-jazzy.txt"] = {
        k: v for k, v in sets["requirements-jazzy.txt"].items() if not k.startswith("ros-")
    }
    assert {"requirements.txt", "requirements-dev.txt", "requirements-fit.txt"} <= set(sets)
    seen: dict[str, tuple[str, str]] = {}
    for name, pinned in sorted(sets.items()):
        for package, version in pinned.items():
            first = seen.setdefault(package, (name, version))
            assert first[1] == version, f"{package}: {first} against {name} {version}"
