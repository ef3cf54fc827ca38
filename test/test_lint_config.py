"""The pre-commit hooks run what `make lint` runs; the package ships its type hints."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def lint_recipe() -> list[str]:
    """The tool and subcommand of each line of the Makefile's lint recipe."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe is not None, "the Makefile has a lint target"
    commands = []
    for line in recipe.group(1).splitlines():
        words = line.strip().replace("$(BIN)/", "").split()
        commands.append(" ".join(w for w in words if not w.startswith("$(")))
    return commands


def hook_commands() -> list[str]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    entries = [hook["entry"] for repo in config["repos"] for hook in repo["hooks"]]
    return [entry.replace(".venv/bin/", "") for entry in entries]


def test_the_pre_commit_hooks_run_the_lint_recipe() -> None:
    recipe = lint_recipe()
    assert recipe == [
        "ruff check",
        "ruff format --check",
        "mypy dynshape_perception test scripts",
    ]
    assert hook_commands() == recipe


def test_the_package_ships_py_typed() -> None:
    assert (ROOT / "dynshape_perception" / "py.typed").is_file()
    setup = (ROOT / "setup.py").read_text()
    assert 'package_data={PACKAGE: ["py.typed"]}' in setup and "zip_safe=False" in setup
