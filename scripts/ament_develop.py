"""Make a development install (the venv) an ament prefix for this package, as colcon's
--symlink-install would: the index marker, share/ (package.xml and every file of launch/,
config/, models/ linked to the source tree, so edits apply at once) and the node executables
under lib/. Usage: python scripts/ament_develop.py PREFIX"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dynshape_perception"
SHARED = ("package.xml", "launch", "config", "models")
ACTIVATE_MARK = f"# {PACKAGE}: this prefix is an ament prefix"


def node_executables() -> list[str]:
    """The NODES tuple of setup.py (its console scripts go under lib/<package>)."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "NODES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise SystemExit("setup.py has no NODES tuple")


def link(target: Path, link_path: Path) -> None:
    link_path.parent.mkdir(parents=True, exist_ok=True)
    if link_path.is_symlink() or link_path.is_file():
        link_path.unlink()
    elif link_path.exists():
        raise SystemExit(f"{link_path} exists and is not a link: remove it first")
    link_path.symlink_to(target)


def mirror(source: Path, target: Path) -> None:
    """Real folders holding a link per file, as colcon makes them: ``ros2 launch`` walks the
    share folder without following linked folders, so a linked ``launch/`` hides its files."""
    if target.is_symlink():
        target.unlink()
    for folder, _dirs, files in os.walk(source):
        here = Path(folder)
        mirrored = target / here.relative_to(source)
        mirrored.mkdir(parents=True, exist_ok=True)
        for name in files:
            link(here / name, mirrored / name)
    # Links to files removed from the source tree since the last run.
    for folder, _dirs, files in os.walk(target):
        for name in files:
            path = Path(folder) / name
            if path.is_symlink() and not path.exists():
                path.unlink()


def main(prefix_arg: str) -> int:
    prefix = Path(prefix_arg).resolve()
    bin_dir = prefix / "bin"
    marker = prefix / "share" / "ament_index" / "resource_index" / "packages" / PACKAGE
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text((ROOT / "resource" / PACKAGE).read_text())
    for name in SHARED:
        if (ROOT / name).is_dir():
            mirror(ROOT / name, prefix / "share" / PACKAGE / name)
        else:
            link(ROOT / name, prefix / "share" / PACKAGE / name)
    for node in node_executables():
        script = bin_dir / node
        if not script.is_file():
            raise SystemExit(f"{script} is missing: install the package first (make venv)")
        link(script, prefix / "lib" / PACKAGE / node)
    activate = bin_dir / "activate"
    if activate.is_file() and ACTIVATE_MARK not in activate.read_text():
        with activate.open("a") as out:
            out.write(
                f"\n{ACTIVATE_MARK} (launch files, FindPackageShare, ros2 launch).\n"
                f'export AMENT_PREFIX_PATH="{prefix}${{AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}}"\n'
            )
    print(f"{prefix} is an ament prefix of {PACKAGE}: set AMENT_PREFIX_PATH={prefix}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(os.fspath(sys.argv[1])))
