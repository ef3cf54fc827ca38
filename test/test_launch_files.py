"""The launch files parse and name only executables, arguments and files that exist."""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_PY = ROOT / "launch" / "perception.launch.py"
LAUNCH_XML = ROOT / "launch" / "perception.launch.xml"
ARGUMENTS = {
    "params_file",
    "target_profile",
    "use_sim_time",
    "namespace",
    "composed",
    "points_topic",
    "odom_topic",
}
PACKAGE = "dynshape_perception"


def _console_scripts() -> set[str]:
    """Executables setup.py installs: its NODES tuple, read from the AST."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "NODES" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no NODES tuple")


def _constants(tree: ast.Module) -> dict[str, object]:
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    out[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return out


def _first_arguments(tree: ast.Module, callee: str) -> list[ast.expr]:
    """The first argument of every call of the name ``callee``."""
    return [
        node.args[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == callee
    ]


def _constant_first_arguments(tree: ast.Module, callee: str) -> set[object]:
    """The first arguments of the calls of ``callee`` that are constants, by value."""
    return {arg.value for arg in _first_arguments(tree, callee) if isinstance(arg, ast.Constant)}


def test_python_launch_file() -> None:
    tree = ast.parse(LAUNCH_PY.read_text())
    consts = _constants(tree)
    assert consts["PACKAGE"] == PACKAGE
    executables = {*consts["SEPARATE_NODES"], consts["COMPOSED_NODE"]}  # type: ignore[misc]
    assert executables == _console_scripts()
    for key in ("DEFAULT_PARAMS", "FASTDDS_PROFILE"):
        assert (ROOT.joinpath(*consts[key])).is_file(), key  # type: ignore[misc]
    declared = _constant_first_arguments(tree, "DeclareLaunchArgument")
    used = _constant_first_arguments(tree, "LaunchConfiguration")
    assert declared == ARGUMENTS and used == ARGUMENTS
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in functions
    env_names = _first_arguments(tree, "SetEnvironmentVariable")
    assert all(isinstance(name, ast.Constant) for name in env_names), env_names
    env = _constant_first_arguments(tree, "SetEnvironmentVariable")
    assert env == {
        "FASTDDS_BUILTIN_TRANSPORTS",
        "FASTDDS_DEFAULT_PROFILES_FILE",
        "FASTRTPS_DEFAULT_PROFILES_FILE",
    }


def test_xml_launch_file() -> None:
    root = ET.parse(LAUNCH_XML).getroot()
    assert root.tag == "launch"
    args = {a.get("name") for a in root.iter("arg")}
    assert args == ARGUMENTS
    nodes = list(root.iter("node"))
    assert {n.get("exec") for n in nodes} == _console_scripts()
    assert {n.get("pkg") for n in nodes} == {PACKAGE}
    for node in nodes:
        params = node.findall("param")
        assert params[0].get("from") == "$(var params_file)"
        assert {p.get("name") for p in params[1:]} <= {"use_sim_time", "target_profile"}
    # Each executable appears once per target-profile branch.
    names = [n.get("exec") for n in nodes]
    assert all(names.count(n) == 2 for n in set(names))
    env = {e.get("name"): e.get("value", "") for e in root.iter("set_env")}
    assert "LARGE_DATA" in env["FASTDDS_BUILTIN_TRANSPORTS"]
    assert "/config/fastdds_profile.xml" in env["FASTDDS_DEFAULT_PROFILES_FILE"]
    assert "FASTDDS_DEFAULT_PROFILES_FILE" in env["FASTRTPS_DEFAULT_PROFILES_FILE"]
    texts = [a.get("default", "") for a in root.iter("arg")] + list(env.values())
    files = [m for t in texts for m in re.findall(rf"\$\(find-pkg-share {PACKAGE}\)/([^)\s]+)", t)]
    assert sorted(files) == ["config/fastdds_profile.xml", "config/x86_dev.param.yaml"]
    assert all((ROOT / f).is_file() for f in files)
    used = {
        word.split(")")[0]
        for attr in (v for el in root.iter() for v in el.attrib.values())
        for word in attr.split("$(var ")[1:]
    }
    assert used <= ARGUMENTS | {"keep_profile"}


def test_fastdds_profile_is_valid_xml_with_a_large_segment() -> None:
    root = ET.parse(ROOT / "config" / "fastdds_profile.xml").getroot()
    ns = {"f": "http://www.eprosima.com"}
    segment = root.find(".//f:transport_descriptor/f:segment_size", ns)
    assert segment is not None and int(segment.text or 0) >= 16 * 1024 * 1024


def test_test_module_names_are_unique() -> None:
    """launch_testing's pytest plugin imports every test module by its file name alone (not
    in importlib mode): two files of one name anywhere under test/ stop the collection."""
    names = [p.name for p in (ROOT / "test").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
